"""How each arm trained, beside its values: its learning-rate sweep, its steps, and runs stopped at their cap.

Read off the results and the plan's decisions (its sweeps, shared rates and each arm's training settings); the
same notes, per claim, are the caveats beside a verdict (runs at their cap, a sweep going on, a sampled score).
"""

from __future__ import annotations

from .metrics import PREFIX_TOKENS
from .plan import Plan
from .spec import Experiment, Suite, sweep_source
from .stats import mean_std
from .store import Record, Results
from .sweeps import SWEEP_EXTENSIONS, SharedRate, Sweep, sweep_loss

# what a perplexity metric's records were scored on, before whole-split scoring: (the key of the tokens scored
# in whole-split records, what the earlier records read)
SAMPLES = {"val_ppl": ("val_tokens", "20 random windows of the validation split"),
           "extrapolation": ("ppl_tokens", f"the first {PREFIX_TOKENS:,} tokens of the validation split at each "
                                           "length")}


def sampled(experiment: Experiment, labels: set, results: Results) -> int:
    """How many runs of these arms of the experiment were scored on a sample of the validation split (SAMPLES)."""
    if experiment.metric not in SAMPLES:
        return 0
    tokens_key = SAMPLES[experiment.metric][0]
    return sum(tokens_key not in r.details for key, r in results.of(experiment.name).items()
               if key.arm in labels and any(k.startswith("ppl") for k in r.values))


def training_table(suite: Suite, experiment: Experiment, results: Results, plan: Plan) -> list[str]:
    """Where each arm's runs stopped, and for a learning-rate sweep what each rate reached on validation."""
    lines = _sweep_lines(experiment, results, plan) if experiment.lrs else []
    if experiment.sweep_of:
        source = next(e for e in suite.experiments if e.name == experiment.sweep_of)
        same = [a.changes for a in source.arms] == [a.changes for a in experiment.arms]
        lines += [f"Learning rates: each arm's as the sweep of {experiment.sweep_of} chose it"
                  f"{' (the same models)' if same else ''}.", ""]
    stops = {arm.label: _runs(results, experiment, arm.label) for arm in experiment.arms}
    if any("steps" in r.extent for runs in stops.values() for r in runs):
        lines += ["Training: steps per seed (* stopped early; in brackets the step of the best checkpoint, which "
                  "early stopping keeps and which is measured; [resumed at] the checkpoint a run continued from after "
                  "an interrupt):", ""]
        lines += [f"- {label}: " + ", ".join(_extent(r) for r in runs) for label, runs in stops.items() if runs]
        lines += _at_cap(experiment, results, plan)
    return lines


def _sweep_lines(experiment: Experiment, results: Results, plan: Plan) -> list[str]:
    """The validation loss each arm reached at each rate of its sweep (the grid, and the rates added past an edge
    that won), naming the arms whose sweep goes on and those whose best rate stays at its edge; or, before the
    sweep has run, that it has not."""
    sweeps = {arm.label: plan.sweeps[experiment.name, arm.label] for arm in experiment.arms}
    grid = ", ".join(f"{lr:g}" for lr in sorted(experiment.lrs))
    if not any(sweep.known for sweep in sweeps.values()):
        seeds = bool(results.of(experiment.name))
        return [f"Learning-rate sweep ({grid}): not run yet." + (
            " The seeds above were trained at the preset's rate, the same for every arm; `attnlab reproduce` runs "
            "the sweep and trains again each arm whose best rate differs." if seeds else ""), ""]
    rates = sorted({lr for sweep in sweeps.values() for lr in sweep.losses})
    lines = ["Learning-rate sweep (first seed; the lowest validation loss is chosen for every seed):", "",
             "| arm | " + " | ".join(f"lr {lr:g}" for lr in rates) + " |", "|---|" + "---|" * len(rates)]
    going_on, edges = [], []
    for label, sweep in sweeps.items():
        by_lr, best = sweep.losses, sweep.best
        cells = ["–" if by_lr.get(lr) is None else f"**{by_lr[lr]:.4g}**" if lr == best else f"{by_lr[lr]:.4g}"
                 for lr in rates]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
        beyond = [lr for lr, v in by_lr.items() if v is None and lr not in experiment.lrs]
        if beyond:
            going_on.append(f"{label} (lr {beyond[0]:g})")
        elif len(by_lr) > 2 and sweep.complete and best in (min(by_lr), max(by_lr)):
            edges.append(f"{label} (lr {best:g})")
    if len(rates) > len(experiment.lrs):
        lines += ["", f"The grid ({grid}) goes on past an edge whose rate trains best, by up to {SWEEP_EXTENSIONS} "
                      "rates."]
    if going_on:
        lines += ["", f"The sweep goes on: {', '.join(going_on)}, not run yet; until it has, the seeds are those "
                      "of the best rate so far."]
    if edges:  # the optimum may lie beyond the rates tried
        lines += ["", f"At the sweep's edge: {', '.join(edges)}; a rate beyond it might train better."]
    decision = plan.shared_rates.get(experiment.name)
    if unseparated := _unseparated(experiment, results, sweeps, decision):
        lines += ["", f"Not separated by the sweep (the loss at another rate within the seed-to-seed spread of the "
                      f"best one's seeds): {'; '.join(unseparated)}. The best rate may be chance."]
    lines += _sharing(decision, sweeps, bool(unseparated))
    # a sweep's point trains at the first seed, so at the chosen rate it is the model of seed 0
    lines += ["", "Each arm's seed 0 is its sweep's own run at the chosen rate (the same model): the run that chose "
                  "the rate is one of the compared seeds, and the rate is chosen on one run's validation loss (over "
                  "the whole validation split where the run measured it)."]
    return [*lines, ""]


def _unseparated(experiment: Experiment, results: Results, sweeps: dict[str, Sweep], decision: SharedRate | None
                 ) -> list[str]:
    """Per arm, the rates whose sweep loss lies within one standard deviation (over the arm's seeds at its best
    rate: those the shared-rate decision read, where it is made) of the best rate's: "gla: lr 0.002 best, lr 0.001
    (+0.0001 against a spread of 0.004)"."""
    out = []
    for label, sweep in sweeps.items():
        known = sweep.known
        seeds = [sweep_loss(r) for r in results.of(experiment.name, label).values()]
        if not known:
            continue
        if decision is not None:
            spread = decision.spreads[label]
        elif len(seeds) > 1:
            spread = mean_std(seeds)[1]
        else:
            continue
        best = sweep.best
        close = [f"lr {lr:g} ({v - known[best]:+.2g} against a spread of {spread:.2g})"
                 for lr, v in sorted(known.items()) if lr != best and v - known[best] < spread]
        if close:
            out.append(f"{label}: lr {best:g} best, {', '.join(close)}")
    return out


def _sharing(decision: SharedRate | None, sweeps: dict[str, Sweep], unseparated: bool) -> list[str]:
    """What the sweep decided about shared rates, where they are not the arms' own bests."""
    if decision is None:
        return ["", "Whether compared arms share a rate is decided once every arm's seeds at its best rate are "
                    "measured."] if unseparated else []
    moved = {label: lr for label, lr in decision.rates.items() if label in sweeps and sweeps[label].best != lr}
    if not moved:
        return ["", "No rate lies within both compared arms' spreads of their bests, so each arm trains at its own "
                    "best."] if unseparated and not decision.rates else []
    groups = {}
    for label, lr in decision.rates.items():
        groups.setdefault(lr, []).append(label)
    shared = "; ".join(f"{', '.join(labels[:-1])} and {labels[-1]} at lr {lr:g}" for lr, labels in groups.items()
                       if set(labels) & set(moved))
    return ["", f"**Shared rates:** {shared}: each a rate that neither compared arm's sweep can tell from its best "
                "(of such rates, the one whose losses lie least above the pair's bests), so that no arm's rate is a "
                "chance in its favour against the arm it is compared with; the seeds trained at an arm's own best "
                "rate are superseded."]


# what a verdict's mark and the training notes call runs with early stopping that ended at their cap, by their
# schedule: under cosine the rate reaches min_lr only at the cap, so the loss falls until the last steps and patience
# seldom runs out first; under wsd patience starts the decay, which ends a run before its cap
CAP_MARKS = {"cosine": ("stopped at the cap", ", where their cosine schedule ends"), "wsd": ("not converged", "")}
CAP_LINES = {
    "cosine": "**Stopped at the cap:** {} of {} runs with early stopping reached their cap of {} steps, where their "
              "cosine schedule ends: its rate falls until the cap, and the loss with it, so patience seldom runs out "
              "before it. These are values of models trained to the cap, not shown to be converged; a longer cap (the "
              "schedule stretched with it) may change them.",
    "wsd": "**Not converged:** {} of {} runs with early stopping reached their cap of {} steps before it stopped them "
           "(validation loss was still improving within the patience): these are values of models not trained to "
           "convergence, and a longer cap may change them."}


def _at_cap(experiment: Experiment, results: Results, plan: Plan) -> list[str]:
    """A line per schedule whose runs that stop early ended at their step cap instead (CAP_LINES)."""
    counts = _capped(experiment, results, plan).values()
    return [line for schedule, words in CAP_LINES.items() if (summary := _cap_summary(counts, schedule))
            for line in ("", words.format(*summary))]


def _capped(experiment: Experiment, results: Results, plan: Plan) -> dict[str, tuple[int, int, int, str]]:
    """Arm label -> (its runs that ended at their step cap, its runs, that cap, their schedule), for the arms whose
    runs stop early (none for a smoke run, or for arms trained for a fixed number of steps)."""
    if results.setting["quick"]:
        return {}
    counts = {}
    for arm in experiment.arms:
        train = plan.train(experiment.name, arm.label)
        runs = [r for r in _runs(results, experiment, arm.label) if "steps" in r.extent]
        if train.patience and runs:
            ended = sum(not r.extent.get("stopped_early") and r.extent["steps"] >= train.steps for r in runs)
            counts[arm.label] = (ended, len(runs), train.steps, train.schedule)
    return counts


def _cap_summary(counts, schedule: str) -> tuple[int, int, str] | None:
    """(runs at their cap, runs, the caps written out) over _capped's counts of the arms on this schedule; None if
    none of their runs ended at its cap."""
    counts = [count[:3] for count in counts if count[3] == schedule]
    capped = sum(ended for ended, _, _ in counts)
    if not capped:
        return None
    caps = " and ".join(f"{cap:,}" for cap in sorted({cap for ended, _, cap in counts if ended}))
    return capped, sum(runs for _, runs, _ in counts), caps


def caveats(suite: Suite, results: Results, plan: Plan):
    """claim -> what to know about the runs behind its verdict: which of them (arm and baseline, in its
    experiments) ended at their step cap, and whose sweep is still going on."""
    experiments = {e.name: e for e in suite.experiments}
    capped = {e.name: _capped(e, results, plan) for e in suite.experiments}
    unfinished = {key for key, sweep in plan.sweeps.items() if not sweep.complete}

    def of(claim) -> list[str]:
        labels = {claim.arm, claim.baseline}
        counts, going_on = [], set()
        for experiment in filter(None, map(experiments.get, (claim.experiment, claim.contrast))):
            counts += [capped[experiment.name][label] for label in labels if label in capped[experiment.name]]
            if (source := sweep_source(suite, experiment)) is not None:
                going_on |= {label for label in labels if (source.name, label) in unfinished}
        marks = [f"*{mark}*, {summary[0]} of {summary[1]} runs at their cap of {summary[2]} steps{where}"
                 for schedule, (mark, where) in CAP_MARKS.items() if (summary := _cap_summary(counts, schedule))]
        compared = [e for e in map(experiments.get, (claim.experiment, claim.contrast)) if e is not None]
        if runs := sum(sampled(e, labels, results) for e in compared):
            marks.append(f"*scored on a sample*: {runs} runs on {SAMPLES[compared[0].metric][1]}")
        return marks + ([f"*sweep going on*: {', '.join(sorted(going_on))}"] if going_on else [])

    return of


def _extent(record: Record) -> str:
    """"4000* (3500) [resumed at 2000]": its steps, * where it stopped early, the best checkpoint's step, the
    checkpoint it continued from."""
    extent = record.extent
    if "steps" not in extent:
        return "?"
    best = f" ({extent['best_step']})" if extent.get("best_step") not in (None, extent["steps"]) else ""
    resumed = f" [resumed at {record.resumed_from}]" if record.resumed_from is not None else ""
    return f"{extent['steps']}{'*' if extent.get('stopped_early') else ''}{best}{resumed}"


def _runs(results: Results, experiment: Experiment, label: str) -> list[Record]:
    """The arm's records that a job wrote (those with its seconds), in seed order."""
    records = results.of(experiment.name, label)
    return [records[k] for k in sorted(records, key=lambda k: k.seed) if records[k].seconds is not None]


