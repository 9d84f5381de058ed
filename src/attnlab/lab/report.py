"""report.md, its figures and a results summary from a suite's results and plan; nothing in it is typed in."""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from ..plots import new_figure, save_figure
from .claim_plots import plot_claims
from .claims import RULES
from .metrics import get_metric
from .plan import Plan
from .seeds_needed import settle_lines
from .spec import Experiment, Suite, ablated
from .state_size import ruler_grid, state_section, unlearned
from .stats import mean_std, paired_difference
from .store import Results, RunKey, describe_setting
from .training_notes import SAMPLES, caveats, training_table
from .verdict_table import verdict_table
from .verdicts import calibration_lines, engagement_lines, evaluate, reading_lines


def _values(results: Results, experiment: Experiment, label: str, key: str) -> list[float | None]:
    """One value per seed, in seed order; None where the quantity was never reached (tokens to a loss)."""
    return list(results.by_seed(experiment.name, label, key).values())


def _paired(results: Results, experiment: Experiment, label: str, key: str) -> tuple[list[float], list[float]]:
    """The arm's and the baseline's values of the seeds that both have."""
    arm, base = (results.by_seed(experiment.name, name, key) for name in (label, experiment.baseline))
    seeds = [s for s in arm if s in base and arm[s] is not None and base[s] is not None]
    return [arm[s] for s in seeds], [base[s] for s in seeds]


def _scale(experiment: Experiment) -> tuple[float, str]:
    """The factor and unit an experiment's quantities are shown in: fractions in % (differences in points)."""
    return (100.0, "%") if get_metric(experiment.metric).percent else (1.0, "")


def _cell(values: list[float | None], unit: str = "") -> str:
    reached = [v for v in values if v is not None]
    cell = _fmt(*mean_std(reached), unit) if reached else "never"
    return cell if len(reached) == len(values) else f"{cell} (never in {len(values) - len(reached)} of {len(values)})"


def _keys(results: Results, experiment: Experiment) -> list[str]:
    """The measured quantities of an experiment (its sweeps' too), in order of appearance."""
    keys: list[str] = []
    for record in results.of(experiment.name, sweeps=True).values():
        keys += [m for m in record.values if m not in keys]
    return keys


def _fmt(mean: float, std: float, unit: str = "") -> str:
    return f"{mean:.4g}{unit}" if std != std else f"{mean:.4g}{unit} ± {std:.2g}"


def describe_run(suite: Suite, results: Results, plan: Plan) -> str:
    """Where and when the suite ran, from what run_suite recorded; a suite still under way says how far it got."""
    meta = results.meta
    seconds = sum(r.seconds or 0.0 for _, r in results.items())  # a record written by hand may not say
    done, expected = _progress(results, plan)
    when = (f"finished {meta.get('finished', '?')}" if done == expected else
            f"partial: {done} of {expected} runs measured, last saved {meta.get('finished', '?')}")
    workers = f", its jobs run by {meta['workers']}" if meta.get("workers") else ""
    workers += f", from commit {meta['commit']}" if meta.get("commit") else ""
    # (the meta is the last invocation's: runs merged from earlier ones may have run elsewhere)
    return (f"{meta.get('seeds', '?')} seed(s), the last run on {meta.get('cpu', 'an unrecorded machine')} "
            f"({meta.get('threads', '?')} threads, torch {meta.get('torch', '?')}){workers}, {when}, "
            f"{seconds / 60:.1f} minutes of training and evaluation")


def experiment_table(experiment: Experiment, results: Results, columns: str = "all", floored: dict | None = None
                     ) -> list[str]:
    """Markdown table: one row per arm; columns='all' shows every measured quantity, the paper and the
    parameter count, 'main' only the first quantity and its difference to the baseline. floored: the arms at their
    task's chance floor (state_size.unlearned), shown as not learned rather than by their accuracies."""
    keys, floored = _keys(results, experiment), floored or {}
    scale, unit = _scale(experiment)
    shown = keys if columns == "all" else keys[:1]
    compared = len(experiment.arms) > 1  # a one-arm experiment has nothing to take a difference to
    header = ["arm", *shown, *([f"Δ {keys[0]} vs {experiment.baseline}" if keys else "Δ"] if compared else [])]
    header += ["paper", "params"] if columns == "all" else []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    for arm in experiment.arms:
        floor = floored.get(arm.label)
        cells = [arm.label]
        for key in shown:
            values = [v if v is None else scale * v for v in _values(results, experiment, arm.label, key)]
            cells.append(_cell(values, unit) if values else "–")
        if floor is not None and shown:  # its accuracies are no recall figures
            cells[1:] = [f"*not learned*: at or under the chance floor, {floor}", *["–"] * (len(shown) - 1)]
        first, base = _paired(results, experiment, arm.label, keys[0]) if keys else ([], [])
        if first and floor is None and experiment.baseline not in floored and arm.label != experiment.baseline:
            diff, half = (scale * x for x in paired_difference(first, base))
            interval = "" if half != half else f" [{diff - half:+.3g}, {diff + half:+.3g}]"
            cells.append(f"{diff:+.4g}{interval}{' pp' if unit else ''}")  # a difference of % is in points
        elif compared:
            cells.append("")
        if columns == "all":
            cells.append(experiment.paper.get(arm.label, ""))
            params = results.params(experiment.name, arm.label)
            cells.append("" if params is None else f"{params:,.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def seed_table(experiment: Experiment, results: Results) -> list[str]:
    """Markdown: one row per arm and seed with every measured quantity."""
    keys = _keys(results, experiment)
    lines = ["", "| arm | seed | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for arm in experiment.arms:
        by_key = {key: results.by_seed(experiment.name, arm.label, key) for key in keys}
        for seed in sorted({s for values in by_key.values() for s in values}):
            cells = [f"{by_key[k][seed]:.3g}" if by_key[k].get(seed) is not None else "–" for k in keys]
            lines.append(f"| {arm.label} | {seed} | " + " | ".join(cells) + " |")
    return lines


def scoring_lines(experiment: Experiment, results: Results) -> list[str]:
    """What a language model's perplexity was scored on: every position of the validation split, or (records
    measured before whole-split scoring) a sample of it."""
    if experiment.metric not in SAMPLES:
        return []
    tokens_key, sample = SAMPLES[experiment.metric]
    records = [r for r in results.of(experiment.name).values() if any(k.startswith("ppl") for k in r.values)]
    whole = {r.details[tokens_key] for r in records if tokens_key in r.details}
    sampled = sum(tokens_key not in r.details for r in records)
    lines = []
    if whole:
        tokens = " or ".join(f"{n:,}" for n in sorted(whole))
        lines.append(f"Scored on every position of the validation split once ({tokens} tokens, in windows of "
                     f"{'the training length' if experiment.metric == 'val_ppl' else 'each length'}).")
    if sampled:
        lines.append(f"{sampled} of {len(records)} runs were scored on {sample} (measured before whole-split "
                     "scoring; `attnlab reproduce` scores them again).")
    return ["", " ".join(lines)] if lines else []


def current(results: Results, plan: Plan) -> tuple[Results, list[str]]:
    """The results without the records that the suite's configs have since superseded, and a line saying how many
    were left out (none: no line)."""
    old = plan.superseded
    if not old:
        return results, []
    experiments = sorted({key.experiment for key in old})
    runs = f"{len(old)} run{'s' if len(old) > 1 else ''}"
    return results.without(old), [
        f"**{runs} left out**: trained under an earlier config of {', '.join(experiments)} (a protocol, a preset or "
        "its sweep's best rate changed since); `attnlab reproduce` trains them again.", ""]


def write_report(suite: Suite, results: Results, plan: Plan, out_dir: str | Path) -> Path:
    """report.md and its figures in out_dir, from the results and the plan's decisions."""
    out = Path(out_dir)
    results, left_out = current(results, plan)
    quoted = " The paper's column quotes the paper, at its own (much larger) scale." if any(
        e.paper for e in suite.experiments) else ""
    lines = [f"# {suite.title}", "", describe_tier(results), "", *left_out,
             f"Generated by `{_command(suite, results)}`: {describe_run(suite, results, plan)}. "
             "Numbers are mean ± standard deviation over seeds; Δ is the paired difference to the baseline with a 95% "
             f"t-interval.{quoted}",
             ""]
    if suite.source:
        lines += [suite.source, ""]
    if suite.provenance:
        lines += ["**Provenance of the equations.** " + " ".join(f"*{name}*: {text}" for name, text in
                                                                suite.provenance.items()), ""]
    calibration = calibration_lines(suite.claims, results, plan.seeds) + reading_lines(suite.anchors, results)
    if calibration:
        lines += ["## Calibration", "", "Before any comparison, the baseline must reproduce the paper's own number "
                  "under the paper's protocol; a claim whose baseline does not is *not calibrated*, and once the "
                  "baseline has all its seeds, the experiment's other arms are not trained.", "",
                  *calibration, ""]
    engagement = engagement_lines(suite.claims, results, plan.floor)
    components = [e for e in suite.experiments if e.component]
    if engagement or components:
        sizes = " Below it, the learned component's size, seed by seed, as the paper shows it." if components else ""
        removed = f" Removed here: {suite.ablation}." if suite.ablation else ""
        lines += ["## Is the mechanism used?", "", "Each mechanism's own component removed at evaluation from the "
                  "trained model (Mixer.ablated); a claim whose effect is larger than this move is *mechanism not "
                  f"engaged*.{removed}{sizes}", "", *engagement, ""]
        for experiment in components:
            lines += experiment_section(suite, experiment, results, plan, out, "###")
    if suite.claims:
        judged = evaluate(suite.claims, results, plan.floor, gpu_plans(suite))
        figure = plot_claims(judged, out / "claims.png")
        table = verdict_table(judged, planned_seeds(suite, plan), caveats(suite, results, plan))
        lines += ["## Verdicts", "", *table, "", f"![the claims]({figure.name})", "",
                  *settle_lines(suite, judged, results, plan), RULES, ""]
    lines += state_section(suite, results, out, plan.floor)
    for experiment in suite.experiments:
        lines += [] if experiment.component else experiment_section(suite, experiment, results, plan, out, "##")
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def experiment_section(suite: Suite, experiment: Experiment, results: Results, plan: Plan, out: Path,
                       heading: str) -> list[str]:
    """Markdown lines of one experiment: its table (and every seed's values for a component), plot and steps."""
    lines = [f"{heading} {experiment.title}", ""]
    if experiment.note:
        lines += [experiment.note, ""]
    floored = unlearned(experiment, results, plan.floor)
    lines += experiment_table(experiment, results, floored=floored)
    lines += seed_table(experiment, results) if experiment.component else []
    lines += scoring_lines(experiment, results)
    keys = _keys(results, experiment)
    lines += ruler_grid(experiment, results)
    if keys:
        figure = _plot(experiment, results, keys, out, floored)
        lines += ["", f"![{experiment.title}]({figure.name})"]
    return [*lines, "", *training_table(suite, experiment, results, plan), ""]


def describe_tier(results: Results) -> str:
    """The first line of a report or summary: what made the results, and for a smoke run that it is none."""
    setting = results.setting
    smoke = "**Smoke run: not a result.** " if setting["quick"] else ""
    return f"{smoke}Results of {describe_setting(setting)}."


def _command(suite: Suite, results: Results) -> str:
    setting = results.setting
    flags = " --quick" if setting["quick"] else ""
    flags += f" --scale {setting['scale']:g}" if setting["scale"] != 1 else ""
    if suite.name == "demo":
        return "attnlab demo" + flags
    return f"attnlab reproduce {suite.name}" + ("" if suite.tier == "default" else f" --tier {suite.tier}") + flags


def _plot(experiment: Experiment, results: Results, keys: list[str], out: Path, floored: dict) -> Path:
    """The experiment's figure: each arm's curve over lengths, or its paired difference to the baseline; an arm at
    its chance floor (floored) is named as not learned instead of drawn."""
    labels = [arm.label for arm in experiment.arms if arm.label not in floored]
    fig, ax = new_figure(figsize=(8.5 if len(labels) > 10 else 6.5, 3.8))
    scale, _ = _scale(experiment)
    curve = get_metric(experiment.metric).curve
    if curve is not None:  # a curve over the number after "@"
        many = len(labels) > 10  # more arms than colours: dashed lines after the first ten, the legend outside
        for i, label in enumerate(labels):
            points = [(int(k.split("@")[1]), scale * mean_std(_values(results, experiment, label, k))[0]) for k in keys
                      if "@" in k and not k.startswith(ablated("")) and _values(results, experiment, label, k)]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=label, linestyle="--" if i >= 10 else "-")
        if curve.zero_line:
            ax.axhline(0, color="gray", lw=0.8)
        ax.set(xlabel=curve.xlabel, ylabel=curve.ylabel, **({"xscale": "log"} if curve.log_x else {}))
        ax.legend(fontsize=7 if many else 8, **({"loc": "center left", "bbox_to_anchor": (1.01, 0.5)} if many else {}))
    else:
        _plot_differences(ax, experiment, results, keys[0], floored)
    if floored:
        ax.text(0.01, 0.01, f"not learned (at or under the chance floor, {next(iter(floored.values()))}): "
                + ", ".join(floored), transform=ax.transAxes, fontsize=6)
    ax.set_title(experiment.title, fontsize=9)
    return save_figure(fig, out / f"{experiment.name}.png", dpi=110)


def _plot_differences(ax, experiment: Experiment, results: Results, key: str, floored: dict) -> None:
    """Each arm's paired difference to the baseline with its 95% interval (one seed: a hollow point), so that
    a difference of 1% is as visible as one of 50%; none where the arm or the baseline did not learn the task."""
    scale, unit = _scale(experiment)
    arms = [arm.label for arm in experiment.arms if arm.label != experiment.baseline and arm.label not in floored]
    arms = [] if experiment.baseline in floored else arms
    for row, label in enumerate(arms):
        values, base = _paired(results, experiment, label, key)
        if not values:
            continue
        diff, half = (scale * x for x in paired_difference(values, base))
        if half == half:
            ax.errorbar(diff, row, xerr=half, fmt="o", color="tab:blue", capsize=4)
        else:
            ax.plot(diff, row, "o", color="tab:blue", mfc="white")
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(arms)), arms, fontsize=8)
    ax.invert_yaxis()
    points = ", percentage points" if unit else ""
    ax.set(xlabel=f"Δ {key} vs {experiment.baseline} (paired, 95% interval{points})")




def summary_section(folder: Path, suite: Suite, results: Results, plan: Plan) -> list[str]:
    """Markdown for the results summary: a suite's verdict table (or, for a suite without claims, its main
    tables) and a link to its full report in folder."""
    results, left_out = current(results, plan)
    report = f"{folder.as_posix()}/report.md"
    lines = [f"### {suite.title}", "", describe_tier(results), "",
             f"`{_command(suite, results)}`: {describe_run(suite, results, plan)}. Full report: [{report}]({report}).",
             "", *left_out]
    if suite.claims:
        judged = evaluate(suite.claims, results, plan.floor, gpu_plans(suite))
        table = verdict_table(judged, planned_seeds(suite, plan), caveats(suite, results, plan))
        return [*lines, *table, ""]
    for experiment in suite.experiments:
        floored = unlearned(experiment, results, plan.floor)
        lines += [f"**{experiment.title}**", "", *experiment_table(experiment, results, "main", floored), ""]
    return lines


def gpu_plans(suite: Suite) -> dict[str, str]:
    """Experiment -> the plan that runs it on a GPU, for the experiments that name one (Experiment.gpu)."""
    return {e.name: e.gpu for e in suite.experiments if e.gpu}


def planned_seeds(suite: Suite, plan: Plan):
    """claim -> the seeds the tier plans for it: the fewest that its arms and baseline train in its experiments."""
    experiments = {e.name: e for e in suite.experiments}

    def planned(claim) -> int | None:
        counts = [plan.seeds(e.name, a.label) for e in map(experiments.get, (claim.experiment, claim.contrast)) if e
                  for a in e.arms if a.label in (claim.arm, claim.baseline)]
        return min(counts, default=None)

    return planned


def _progress(results: Results, plan: Plan) -> tuple[int, int]:
    """(runs measured, runs the suite plans): every seed of every arm and every point of every sweep, but those of
    the arms the plan holds back for good (compared with a baseline that missed its calibration) where they have no
    record."""
    recorded = {(key.experiment, key.arm) for key, _ in results.items()}
    held = {(job.key.experiment, job.key.arm) for job in plan.jobs if job.status == "blocked"} - recorded
    expected = {job.key for job in plan.jobs if not job.key.sweep and (job.key.experiment, job.key.arm) not in held}
    expected |= {RunKey(experiment, arm, lr=lr) for (experiment, arm), sweep in plan.sweeps.items()
                 if (experiment, arm) not in held for lr in sweep.losses}
    return sum(key in results for key in expected), len(expected)


def update_readme(readme: str | Path, summary: str, section: str = "results") -> None:
    """Replace the text between the README's markers of this section ('<!-- results: start -->' and
    '<!-- results: end -->') with summary."""
    start, end = f"<!-- {section}: start -->", f"<!-- {section}: end -->"
    path = Path(readme)
    text = path.read_text()
    if start not in text or end not in text:
        raise UserError(f"{path} has no '{start}' ... '{end}' markers to put the {section} between")
    head, rest = text.split(start, 1)
    path.write_text(head + start + "\n" + summary + "\n" + end + rest.split(end, 1)[1])
