"""Synthetic tasks by name, as mixers have their registry. `data.source=<name>` trains on one, and `attnlab eval
--task <name>` measures a run by it.

Each task's module registers it (`register_task`), as a module kept outside attnlab can (`attnlab --import`):
how its data loads for a sequence length, the dataclass of its settings (`data.task_options.<name>.<field>`,
typed as a mixer's `model.mixer_options` are), its vocabulary before any data loads (for the model's shapes), and
how `attnlab eval --task` measures a run with it (with the settings of the dataclass `eval_options`, which the
command's flags fill), which runs it fits, and the accuracy a model reaches without learning it (its chance floor).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .corpus import is_text

TASKS: dict = {}  # name -> Task


@dataclass
class NoOptions:
    """The settings of a task that has none."""


def trained_on_text(run) -> bool:
    """Whether the run's data was a text corpus (not a synthetic task's examples)."""
    return is_text(run.config.data.source)


def test_accuracy(run, options) -> None:
    """Accuracy on the task's test set (each slice it reports, e.g. per number of pairs)."""
    from .. import evaluate

    data = run.corpus()
    measured = evaluate.task_accuracy(run.model, data, run.device)
    for name, value in measured.items():
        print(f"{run.config.data.source} test {name}: {100 * value:.2f}%")
    for key in getattr(data, "slices", {}):
        if (name := data.slice_label.format(key)) not in measured:
            tokens, setting = run.model.read_limit()
            print(f"{run.config.data.source} test {name}: not measured, the model reads at most {tokens} tokens "
                  f"({setting})")


@dataclass(frozen=True)
class Floor:
    """The accuracy of a test that a model reaches without learning the task, and the strategy that reaches it."""

    value: float  # a fraction, as the accuracies are
    how: str  # "copying a value from the context"

    def __str__(self) -> str:
        return f"{100 * self.value:.3g}% ({self.how})"


# how the lab asks for them: (experiment, results key) -> the chance floor of that accuracy, None where it has none
Floors = Callable[[str, str], "Floor | None"]


def no_floor(options, key: str) -> Floor | None:
    """A task that declares no chance floor: its accuracies start at 0."""
    return None


@dataclass(frozen=True)
class Task:
    """load(options, seq_len) -> the data source (see `attnlab.data`), options being an `options` instance (the
    typed data.task_options.<name>); vocab_size(options) -> its vocabulary before the data loads, exact or a
    bound; evaluate(run, eval_options) prints `attnlab eval --task <name>`'s measurement, eval_options being an
    `eval_options` instance made from the command's flags (the run's own settings are run.config.data's
    task_config()); fits(run) says whether a run can be measured by it (by default: trained on it), and needs
    what a run that cannot lacks; floor(options, key) is the chance floor (Floor) of the accuracy its tests record
    under key (a slice's or the pooled one), None where it has none above 0; tests(options, seq_len) is
    [(examples, length)] of its test set, then of each slice, before its examples are made (a plan's estimate
    of a measurement; None: its data is loaded to count them)."""

    name: str
    load: Callable
    options: type = NoOptions
    vocab_size: Callable = lambda options: 256
    evaluate: Callable = test_accuracy
    eval_options: type = NoOptions
    fits: Callable | None = None
    needs: str = ""
    floor: Callable = no_floor
    tests: Callable | None = None

    def fits_run(self, run) -> bool:
        return self.fits(run) if self.fits else run.config.data.source == self.name

    def needed(self) -> str:
        return self.needs or f"a run trained on data.source={self.name}"


def register_task(task: Task) -> Task:
    TASKS[task.name] = task
    return task
