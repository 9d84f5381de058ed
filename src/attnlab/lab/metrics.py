"""What a trained run is measured by: a registry of metrics, as mixers have theirs.

An experiment names its metric (`Experiment.metric`); each job measures its run by it and the report shows
it by it. A metric is the measurement (run folder -> named values), how its values are shown (a fraction shown
in %, or a curve over the number after "@" in its keys) and its revision, bumped when its meaning changes so
that records measured before are measured again. The metrics of language models and tasks are here; a paper
registers its own beside its suite (`register_metric`), as a mechanism's learned parameters may be.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, unknown_name
from .forward_passes import (
    VAL_BLOCKS,
    Passes,
    accuracy_passes,
    extrapolation_passes,
    niah_passes,
    no_passes,
    tracking_passes,
    validation_passes,
)
from .spec import ABLATED, Experiment, ablated


@dataclass(frozen=True)
class Curve:
    """How a metric whose keys end in "@<number>" is plotted: against that number."""

    xlabel: str
    ylabel: str
    log_x: bool = True
    zero_line: bool = False  # a horizontal line at 0 (values of either sign)


@dataclass(frozen=True)
class Metric:
    name: str
    measure: Callable[[Experiment, Path], dict]  # (the experiment, a trained run's folder) -> {key: value}
    percent: bool = False  # measured as a fraction and quoted in %: shown in % (differences in points)
    curve: Curve | None = None  # None: one value per run, plotted as each arm's paired difference to the baseline
    revision: int | None = None  # records measured under an earlier revision (or none) are measured again
    ablation: bool = False  # it also measures the model without its mechanism's own component (spec.ablated)
    details: tuple[str, ...] = ()  # the keys it writes beside its values (what it scored, a grid behind a mean)
    # (the experiment, a run's config, its model on the meta device) -> the forward passes its measurement makes,
    # which a plan's estimate prices (forward_passes); None: the plan says it has no estimate
    passes: Callable[[Experiment, object, object], list[Passes]] | None = None


METRICS: dict[str, Metric] = {}


def register_metric(metric: Metric) -> Metric:
    METRICS[metric.name] = metric
    return metric


def detail_keys() -> frozenset[str]:
    """The keys that any registered metric writes beside its values: a record's details, not its values."""
    return frozenset(key for metric in METRICS.values() for key in metric.details)


def get_metric(name: str) -> Metric:
    if name not in METRICS:
        raise ConfigError(unknown_name("metric", name, sorted(METRICS)))
    return METRICS[name]


def _load(run_dir: Path):
    from ..inference import load_run  # imported when measuring: the suites' declarations stay cheap to import

    return load_run(run_dir)


def _without_component(run, measure):
    """measure() with every mixer's own component removed at evaluation (Mixer.ablated); None where the model
    has no such component."""
    if not run.model.ablates():
        return None
    with run.model.ablated():
        return measure()




def validation_perplexity(experiment: Experiment, run_dir: Path) -> dict:
    """Every position of the validation split once (within its document, if packed), and the same with the
    mechanism's own component removed where the model has one (how much the trained model uses it)."""
    from ..evaluate import block_losses, perplexity, scored_positions, split_loss

    run = _load(run_dir)
    t, corpus, packed = run.config.train, run.corpus(), run.config.data.pack

    def score() -> float:
        return split_loss(run.model, corpus, "val", 0, t.batch_size, t.seq_len, run.device,
                          chunk=t.batch_size // t.grad_accum, packed=packed)

    loss = score()
    record = {"val_loss": loss, "val_ppl": perplexity(loss), "val_tokens": scored_positions(corpus, packed=packed)}
    if not packed and (len(corpus.split("val")) - 1) // t.seq_len >= VAL_BLOCKS:  # what a token bootstrap resamples
        record["val_blocks"] = [round(block, 6) for block in block_losses(run.model, corpus, "val", t.seq_len,
                                                                          run.device, VAL_BLOCKS)]
    if (ablated_loss := _without_component(run, score)) is not None:
        record[ABLATED] = perplexity(ablated_loss)
    return record


def task_accuracy(experiment: Experiment, run_dir: Path) -> dict:
    """Test accuracy (and per number of pairs, for MQAR), and overall with the mechanism's own component removed
    where the model has one."""
    from ..evaluate import accuracy, task_accuracy

    run = _load(run_dir)
    data = run.corpus()
    record = task_accuracy(run.model, data, run.device)
    if (value := _without_component(run, lambda: accuracy(run.model, *data.test, device=run.device))) is not None:
        record[ablated("accuracy")] = value
    return record | {STATE_BYTES: state_bytes(run)}


def niah_accuracy(experiment: Experiment, run_dir: Path) -> dict:
    """Exact match at multiples of the training length, averaged over the needle's depths, and the same with the
    mechanism's own component removed where the model has one."""
    from ..data import niah

    run = _load(run_dir)
    data, lengths = run.corpus(), [int(run.config.train.seq_len * f) for f in experiment.lengths]
    cfg = run.config.data.task_config("niah")

    def by_length() -> dict:
        return niah.accuracy_by_length(run.model, run.tokenizer.encode, data.haystacks["val"], cfg.kind, lengths,
                                       cfg.test_per_depth, cfg.depths, run.device, cfg.keys)

    def means(grid: dict) -> dict:
        return {f"niah@{length}": sum(d.values()) / len(d) for length, d in grid.items()}

    grid = by_length()
    record = means(grid)
    if (values := _without_component(run, lambda: means(by_length()))) is not None:
        record |= {ablated(key): value for key, value in values.items()}
    # RULER's grid: each length's accuracy at each depth of the needle
    record[NIAH_DEPTHS] = {str(length): {f"{d:g}": a for d, a in by_depth.items()} for length, by_depth in grid.items()}
    return record | {STATE_BYTES: state_bytes(run)}


def tracking_accuracy(experiment: Experiment, run_dir: Path) -> dict:
    """A word problem's per-token accuracy at the training length and at each longer test length (acc@<tokens>),
    and the same with the mechanism's own component removed where the model has one. A length longer than the
    model can read (its learned positions, a window) is left out."""
    from ..evaluate import accuracy

    run = _load(run_dir)
    data, seq_len, limit = run.corpus(), run.config.train.seq_len, run.model.read_limit()
    sets = {seq_len: data.test} | {k * seq_len: words for k, words in data.slices.items()}
    sets = {length: words for length, words in sets.items() if limit is None or length <= limit[0]}

    def by_length() -> dict:
        return {f"acc@{length}": accuracy(run.model, *words, device=run.device) for length, words in sets.items()}

    record = by_length()
    if (values := _without_component(run, by_length)) is not None:
        record |= {ablated(key): value for key, value in values.items()}
    return record | {STATE_BYTES: state_bytes(run)}


NIAH_DEPTHS, STATE_BYTES = "niah_depths", "state_bytes"  # details of a record: its grid, its model's state size


def state_bytes(run) -> int:
    """The bytes a sequence's state holds after the training length (a KV cache, a recurrent state), at the size of
    the model's parameters' numbers: the memory a mixer reads from, on which recall and retrieval depend (zoology
    and Based plot against it)."""
    numbers = run.model.state_size(run.config.train.seq_len)
    return numbers * next(run.model.parameters()).element_size()


# records of revision 1 scored each length on the first PREFIX_TOKENS tokens of the validation split
PREFIX_TOKENS = 16_384


def extrapolation(experiment: Experiment, run_dir: Path) -> dict:
    """Perplexity at multiples of the training length, each on every window of that length in the validation
    split, and at the training length with the mechanism's own component removed where the model has one (on the
    same windows); ppl_tokens: the tokens scored at the training length."""
    from ..evaluate import perplexity_by_length

    run = _load(run_dir)
    seq_len = run.config.train.seq_len
    lengths = [int(seq_len * f) for f in experiment.lengths]
    corpus = run.corpus()

    def curve(at: list[int]) -> dict:
        return perplexity_by_length(run.model, corpus, at, max_tokens=None, device=run.device)

    record = {f"ppl@{length}": value for length, value in curve(lengths).items()}
    record["ppl_tokens"] = (len(corpus.split("val")) - 1) // seq_len * seq_len
    if (values := _without_component(run, lambda: curve([seq_len]))) is not None:
        record[ABLATED] = values[seq_len]
    return record


def sample_efficiency(experiment: Experiment, run_dir: Path) -> dict:
    """Training tokens until the training loss reaches each of the experiment's target losses."""
    t = _load(run_dir).config.train
    return {f"tokens to {target}": tokens_to_loss(run_dir / "metrics.jsonl", target, t)
            for target in experiment.target_losses}


def tokens_to_loss(metrics_path: Path, target: float, t, window: int = 5) -> float | None:
    """Training tokens until the trailing mean of (up to) `window` logged training losses first reaches
    target (sample efficiency; None if it never does). Below one epoch the training loss is a held-out loss."""
    losses = [(r["step"], r["loss"]) for r in map(json.loads, metrics_path.read_text().splitlines()) if "loss" in r]
    for i, (step, _) in enumerate(losses):
        recent = [loss for _, loss in losses[max(0, i - window + 1) : i + 1]]
        if sum(recent) / len(recent) <= target:
            return float(step * t.batch_size * t.seq_len)
    return None


CONTEXT_LENGTH = "context length (tokens)"
for _metric in (
    Metric("val_ppl", validation_perplexity, ablation=True, details=("val_loss", "val_tokens", "val_blocks"),
           passes=validation_passes),
    Metric("accuracy", task_accuracy, percent=True, ablation=True, details=(STATE_BYTES,), passes=accuracy_passes),
    # revision 2: a test at L tokens reads L tokens, prompt and answer (in 1 the prompt alone had L, so the
    # answer ran past the training length)
    Metric("niah", niah_accuracy, percent=True, curve=Curve(CONTEXT_LENGTH, "S-NIAH exact match (%)"), revision=2,
           ablation=True, details=(NIAH_DEPTHS, STATE_BYTES), passes=niah_passes),
    # revision 2: every window of the validation split (in 1, its first PREFIX_TOKENS tokens per length)
    Metric("extrapolation", extrapolation, curve=Curve(CONTEXT_LENGTH, "perplexity"), ablation=True, revision=2,
           details=("ppl_tokens",), passes=extrapolation_passes),
    Metric("tokens_to_loss", sample_efficiency, passes=no_passes),
    Metric("tracking", tracking_accuracy, percent=True, ablation=True,
           curve=Curve(CONTEXT_LENGTH, "per-token accuracy (%)"), details=(STATE_BYTES,), passes=tracking_passes),
):
    register_metric(_metric)
