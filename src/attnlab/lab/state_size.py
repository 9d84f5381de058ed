"""What a report shows beside a retrieval or recall table: RULER's grid, and accuracy against state size. The grid
is accuracy by length and depth of the needle; each arm's accuracy is set against the state a sequence holds (in
bytes), the axis on which zoology and Based compare recurrent mixers with attention. Both read only what the records
hold (metrics.NIAH_DEPTHS, metrics.STATE_BYTES).
"""

from __future__ import annotations

from pathlib import Path

from ..data.tasks import Floor, Floors
from ..plots import new_figure, save_figure
from .metrics import NIAH_DEPTHS, STATE_BYTES
from .spec import Experiment, Suite
from .stats import mean_std
from .store import Results


def ruler_grid(experiment: Experiment, results: Results) -> list[str]:
    """Markdown: each arm's exact match (%) at each depth of the needle (rows) and each length (columns), the mean
    over the seeds that recorded the grid; [] where none did."""
    grids = {arm.label: [r.details[NIAH_DEPTHS] for r in results.of(experiment.name, arm.label).values()
                          if NIAH_DEPTHS in r.details]
             for arm in experiment.arms}
    grids = {label: seeds for label, seeds in grids.items() if seeds}
    if not grids:
        return []
    lengths = list(next(iter(grids.values()))[0])
    lines = ["", "By depth of the needle (RULER's grid; exact match, %, mean over seeds):", "",
             "| arm | depth | " + " | ".join(f"{length} tokens" for length in lengths) + " |",
             "|---|---|" + "---|" * len(lengths)]
    for label, seeds in grids.items():
        for depth in seeds[0][lengths[0]]:
            cells = [f"{100 * mean_std([s[length][depth] for s in seeds])[0]:.0f}" for length in lengths]
            lines.append(f"| {label} | {depth} | " + " | ".join(cells) + " |")
    return lines


def state_points(experiment: Experiment, results: Results, key: str) -> dict[str, tuple[int, float]]:
    """{arm: (its state in bytes, its mean value of key)} over the arms whose records hold both."""
    points = {}
    for arm in experiment.arms:
        records = [r for r in results.of(experiment.name, arm.label).values()
                   if STATE_BYTES in r.details and key in r.values]
        if records:
            points[arm.label] = (records[0].details[STATE_BYTES], mean_std([r.values[key] for r in records])[0])
    return points


def accuracy_key(experiment: Experiment, results: Results) -> str | None:
    """The value an experiment's accuracy at the training length is recorded under: a task's accuracy, S-NIAH's
    or a word problem's at the first of its lengths (1x); None for other metrics."""
    if experiment.metric == "accuracy":
        return "accuracy"
    prefix = {"niah": "niah@", "tracking": "acc@"}.get(experiment.metric)
    if prefix is None:
        return None
    keys = [k for r in results.of(experiment.name).values() for k in r.values if k.startswith(prefix)]
    return keys[0] if keys else None


def unlearned(experiment: Experiment, results: Results, floors: Floors) -> dict[str, Floor]:
    """The arms whose mean accuracy at the training length is at or under the task's chance floor, with the floor:
    they did not learn the task, so no accuracy of theirs is shown as what they recall."""
    key = accuracy_key(experiment, results)
    floor = floors(experiment.name, key) if key else None
    if floor is None:
        return {}
    means = {arm.label: [v for v in results.by_seed(experiment.name, arm.label, key).values() if v is not None]
             for arm in experiment.arms}
    return {label: floor for label, values in means.items() if values and mean_std(values)[0] <= floor.value}


def state_section(suite: Suite, results: Results, out: Path, floors: Floors) -> list[str]:
    """Markdown and one figure (state.png): for each experiment whose records hold their state size, each arm's
    accuracy at the training length against its state in bytes (an arm at its chance floor: "not learned"); []
    where none do."""
    keys = {e.name: key for e in suite.experiments if (key := accuracy_key(e, results))}
    panels = [(e, state_points(e, results, keys[e.name])) for e in suite.experiments if e.name in keys]
    panels = [(e, points, unlearned(e, results, floors)) for e, points in panels if points]
    if not panels:
        return []
    fig, axes = new_figure(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    lines = ["## Accuracy against state size", "", "Each arm's accuracy at the training length against the state a "
             "sequence holds there (bytes: a KV cache grows with the length, a recurrent state does not); an arm at "
             "or under the task's chance floor is *not learned*, and shown without a point.", "",
             "| experiment | " + " | ".join(f"{label}" for label in _labels(panels)) + " |",
             "|---|" + "---|" * len(_labels(panels))]
    for ax, (experiment, points, floored) in zip(axes[0], panels, strict=True):
        _state_panel(ax, experiment, points, floored)
        ax.set_ylabel(f"{keys[experiment.name]} (%)")
        cells = [_size_cell(points.get(label), label in floored) for label in _labels(panels)]
        lines.append(f"| {experiment.name} | " + " | ".join(cells) + " |")
    figure = save_figure(fig, out / "state.png", dpi=110)
    return [*lines, "", f"![accuracy against state size]({figure.name})", ""]


def _state_panel(ax, experiment: Experiment, points: dict, floored: dict[str, Floor]) -> None:
    """One experiment's points, its chance floor as a dashed line, and the arms that did not learn named below."""
    for label, (size, value) in points.items():
        if label not in floored:
            ax.plot(size, 100 * value, "o")
            ax.annotate(label, (size, 100 * value), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if floored:
        floor = next(iter(floored.values()))
        ax.axhline(100 * floor.value, color="gray", lw=0.8, ls="--")
        ax.text(0.02, 0.02, "not learned (at or under the dashed chance floor): " + ", ".join(floored),
                transform=ax.transAxes, fontsize=6, wrap=True)
    ax.set(xscale="log", xlabel="state per sequence (bytes)")
    ax.set_title(experiment.title, fontsize=8)


def _labels(panels: list) -> list[str]:
    return list(dict.fromkeys(label for _, points, _ in panels for label in points))


def _size_cell(point: tuple[int, float] | None, floored: bool = False) -> str:
    if point is None:
        return ""
    size, value = point
    return f"not learned, at {_bytes(size)}" if floored else f"{100 * value:.1f}% at {_bytes(size)}"


def _bytes(size: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} B"
