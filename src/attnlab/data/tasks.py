"""Synthetic tasks by name, as mixers have their registry: `data.source=<name>` trains on one, and
`attnlab eval --task <name>` measures a run by it.

Each task's module registers it (`register_task`), as a module kept outside attnlab can (`attnlab --import`):
how its data loads for a sequence length, its vocabulary before any data loads (for the model's shapes), the
section of the data config that holds its settings (`data.<section>.*`, validated when the task is the source),
and how `attnlab eval --task` measures a run with it and which runs it fits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

TASKS: dict = {}  # name -> Task


def trained_on_text(run) -> bool:
    """Whether the run's data was a text corpus (not a synthetic task's examples)."""
    from ..config import TEXT_SOURCES

    source = run.config.data.source
    return source in TEXT_SOURCES or source.startswith("hf:")


def test_accuracy(run, args) -> None:
    """Accuracy on the task's test set (each slice it reports, e.g. per number of pairs)."""
    from .. import evaluate

    for name, value in evaluate.task_accuracy(run.model, run.corpus(), run.device).items():
        print(f"{args.task} test {name}: {100 * value:.2f}%")


@dataclass(frozen=True)
class Task:
    """load(data_config, seq_len) -> the data source (see `attnlab.data`); vocab_size(data_config) -> its
    vocabulary before the data loads, exact or a bound; section: the DataConfig field with its settings (None: it
    has none); evaluate(run, args) prints `attnlab eval --task <name>`'s measurement; fits(run) says whether a run
    can be measured by it (by default: trained on it), and needs what a run that cannot lacks."""

    name: str
    load: Callable
    vocab_size: Callable = lambda data_config: 256
    section: str | None = None
    evaluate: Callable = test_accuracy
    fits: Callable | None = None
    needs: str = ""

    def fits_run(self, run) -> bool:
        return self.fits(run) if self.fits else run.config.data.source == self.name

    def needed(self) -> str:
        return self.needs or f"a run trained on data.source={self.name}"


def register_task(task: Task) -> Task:
    TASKS[task.name] = task
    return task


def task_sections() -> dict[str, str]:
    """{DataConfig field: the task that reads it} for the tasks with settings."""
    return {task.section: name for name, task in TASKS.items() if task.section}
