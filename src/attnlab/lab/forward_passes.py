"""The forward passes a metric's measurement makes, counted before anything trains, for a plan's estimate.

Each built-in metric (`metrics.METRICS`) says what it reads: every window of the validation split (val_ppl, and
extrapolation at each length), the test examples and their slices (accuracy, tracking), the needle's samples at
each length (niah), again without the mechanism's own component where the model has one. `costs` prices the
passes with the step-cost probe. The sizes come from the run's data as the measurement reads it (a corpus read
once, and cached, as training reads it), or from a task's `tests` before its examples are made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the metrics' declarations stay cheap to import
    from ..config import RunConfig
    from ..model import Decoder
    from .spec import Experiment

VAL_BLOCKS = 50  # consecutive blocks of the validation split's windows, each one's mean loss kept in the record
BLOCKS_CHUNK = 64  # evaluate.block_losses's rows at a time
ACCURACY_CHUNK = 256  # evaluate.accuracy's


@dataclass(frozen=True)
class Passes:
    """`sequences` sequences of `length` tokens through the model, `batch` at a time, in evaluation mode."""

    sequences: int
    length: int
    batch: int


def no_passes(experiment: Experiment, cfg: RunConfig, model: Decoder) -> list[Passes]:
    """A measurement that reads the model's weights or its training log, not its outputs."""
    return []


def validation_passes(experiment: Experiment, cfg: RunConfig, model: Decoder) -> list[Passes]:
    """metrics.validation_perplexity's: every window of the validation split a micro-batch at a time, its
    blocks' windows again where it keeps them, and the windows again without the component."""
    t = cfg.train
    micro = max(1, t.batch_size // t.grad_accum)
    examples = _examples(cfg, "val")
    if examples is not None:  # a task's fixed examples: each once
        windows = [Passes(examples[0], examples[1], micro)]
        return windows * (2 if model.ablates() else 1)
    tokens = _val_tokens(cfg) - 1  # every position but the first is scored
    # windows of seq_len, the last one shorter; packed documents fill rows of seq_len, about as many
    windows = [Passes(-(-tokens // t.seq_len), t.seq_len, micro)]
    full = tokens // t.seq_len
    blocks = [Passes(full, t.seq_len, BLOCKS_CHUNK)] if not cfg.data.pack and full >= VAL_BLOCKS else []
    return windows + blocks + (windows if model.ablates() else [])


def extrapolation_passes(experiment: Experiment, cfg: RunConfig, model: Decoder) -> list[Passes]:
    """metrics.extrapolation's: every window of each length of the validation split, one at a time, and those of
    the training length again without the component."""
    seq_len, tokens = cfg.train.seq_len, _val_tokens(cfg) - 1
    curve = [Passes(tokens // int(seq_len * f), int(seq_len * f), 1) for f in experiment.lengths]
    return curve + ([Passes(tokens // seq_len, seq_len, 1)] if model.ablates() else [])


def niah_passes(experiment: Experiment, cfg: RunConfig, model: Decoder) -> list[Passes]:
    """metrics.niah_accuracy's: each depth's samples at each length, one at a time (a sample reads its prompt, of
    the whole length, and greedily decodes a few answer tokens: counted as one read of the length), and all again
    without the component."""
    task = cfg.data.task_config("niah")
    samples = task.test_per_depth * len(task.depths)
    grid = [Passes(samples, int(cfg.train.seq_len * f), 1) for f in experiment.lengths]
    return grid * (2 if model.ablates() else 1)


def accuracy_passes(experiment: Experiment, cfg: RunConfig, model: Decoder) -> list[Passes]:
    """metrics.task_accuracy's: the test set and each slice the model can read, and the test set again without
    the component."""
    test, *slices = _readable(_test_sets(cfg), model)
    return [test, *slices] + ([test] if model.ablates() else [])


def tracking_passes(experiment: Experiment, cfg: RunConfig, model: Decoder) -> list[Passes]:
    """metrics.tracking_accuracy's: the test set and each longer one the model can read, all again without the
    component."""
    sets = _readable(_test_sets(cfg), model)
    return sets * (2 if model.ablates() else 1)


def _readable(sets: list[tuple[int, int]], model: Decoder) -> list[Passes]:
    """The test set (first) and the slices whose length the model can read (Decoder.read_limit), as passes."""
    limit = model.read_limit()
    test, *slices = sets
    return [Passes(*test, ACCURACY_CHUNK)] + [Passes(n, length, ACCURACY_CHUNK) for n, length in slices
                                                if limit is None or length <= limit[0]]


def _test_sets(cfg: RunConfig) -> list[tuple[int, int]]:
    """(examples, length) of the task's test set, then of each slice: from the task's `tests` where it declares
    them (its examples are not made), else from its loaded data."""
    from ..data import TASKS

    task = TASKS.get(cfg.data.source)
    if task is not None and task.tests is not None:
        return task.tests(cfg.data.task_config(), cfg.train.seq_len)
    data = _data(cfg)
    return [tuple(data.test[0].shape)] + [tuple(x.shape) for x, _ in getattr(data, "slices", {}).values()]


def _examples(cfg: RunConfig, split: str) -> tuple[int, int] | None:
    """(examples, length) of a task's fixed examples of the split; None for a text corpus."""
    from ..data import TASKS
    from ..data.examples import FixedExamples

    if cfg.data.source not in TASKS:
        return None
    data = _data(cfg)
    return tuple(data.examples(split)[0].shape) if isinstance(data, FixedExamples) else None


def _val_tokens(cfg: RunConfig) -> int:
    return len(_data(cfg).split("val"))


_DATA: dict[str, object] = {}  # a run's data config and length -> its data: a suite's runs share a few


def _data(cfg: RunConfig):
    from ..data import load_data

    key = repr((cfg.data, cfg.train.seq_len))
    if key not in _DATA:
        _DATA[key] = load_data(cfg.data, cfg.train.seq_len)
    return _DATA[key]
