"""Which claims' rows a plan's new runs add seeds to, and whether each row is a headline.

A claim's row is its verdict over the seeds where its arm and baseline (in its experiment, and in its contrast's
where it has one) all have values, paired by index. A plan carries the row where, once its jobs are done, some
such seed has a value it did not have: a run the plan trains or measures. A row whose other side has no record at
that seed, nor a run planned, gains nothing. Beside each experiment: how its new runs stop, and how many of its
runs so far ended at their step cap instead (values of models not trained to convergence, which a verdict marks).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from .plan import Plan
from .spec import Suite
from .store import Results

NEW = ("train", "measure", "waiting")  # the statuses whose jobs write a record when the plan runs


def recorded(out: str | Path) -> Results:
    """The records a suite's folder holds (none where it has no results.json)."""
    path = Path(out) / "results.json"
    return Results.load(path) if path.exists() else Results.empty()


def new_seeds(plan: Plan) -> dict[tuple[str, str], set[int]]:
    """(experiment, arm) -> the seeds whose records the plan's jobs write."""
    seeds = defaultdict(set)
    for job in plan.jobs:
        if job.status in NEW and not job.key.sweep:
            seeds[job.key.experiment, job.key.arm].add(job.key.seed)
    return seeds


def row_seeds(claim, new: dict, results: Results) -> tuple[set[int], set[int]]:
    """(the seeds the claim's row pairs once the plan is done, those of them that are new)."""
    sides = [(e, a) for e in filter(None, (claim.experiment, claim.contrast)) for a in filter(None, (claim.arm,
                                                                                                      claim.baseline))]
    old = {side: {key.seed for key in results.of(*side)} for side in sides}
    after = set.intersection(*(old[side] | new.get(side, set()) for side in sides))
    return after, {seed for seed in after if any(seed in new.get(side, ()) for side in sides)}


def carried_rows(suite: Suite, plan: Plan, results: Results) -> list[tuple]:
    """(claim, the seeds its row pairs once the plan is done, those of them that are new) for every claim whose row
    the plan adds a seed to."""
    new = new_seeds(plan)
    rows = [(claim, *row_seeds(claim, new, results)) for claim in suite.claims]
    return [row for row in rows if row[2]]


def describe_rows(suite: Suite, plan: Plan, results: Results) -> list[str]:
    """Lines: each experiment the plan adds runs to, how they stop and how its runs so far ended, and the rows
    they carry, headline or not; then the tier's headline rows carried, or none."""
    new, rows = new_seeds(plan), carried_rows(suite, plan, results)
    lines = [f"rows these jobs carry (the claims of {suite.name} ({suite.tier}) whose seeds they add to):"]
    for experiment in dict.fromkeys(exp for exp, _ in new):
        lines.append(f"  {experiment}: {_runs(plan, experiment, new)}{_caps(plan, experiment, new, results)}")
        ours = [row for row in rows if experiment in (row[0].experiment, row[0].contrast)]
        lines += [f"    {'HEADLINE' if claim.headline else 'not a headline'}: {claim.statement} ({len(added)} of "
                  f"its {len(after)} paired seeds new: {_span(added)})" for claim, after, added in ours]
        lines += [] if ours else ["    no claim's row gains a paired seed"]
    return lines + [headline_line(suite, [claim for claim, _, _ in rows])]


def headline_line(suite: Suite, carried: list) -> str:
    """The tier's headline rows among the claims `carried`, or none (and which its headlines are)."""
    headlines = [c for c in suite.claims if c.headline]
    ours = [c.statement for c in carried if c.headline]
    if ours:
        return (f"headline rows of {suite.name} ({suite.tier}) carried: {len(ours)} of {len(headlines)} "
                f"({'; '.join(ours)})")
    named = "; ".join(f"{c.statement} (on {c.experiment})" for c in headlines) or "it declares none"
    return f"headline rows of {suite.name} ({suite.tier}) carried: none (its headlines: {named})"


def _runs(plan: Plan, experiment: str, new: dict) -> str:
    """"9 runs new (3 arms; seeds 0-2): 9 train": the experiment's new runs, and which of them train their models
    (the others measure models that exist or that jobs of another experiment train)."""
    arms = [arm for exp, arm in new if exp == experiment]
    seeds = set().union(*(new[experiment, arm] for arm in arms))
    jobs = [job for job in plan.jobs if job.key.experiment == experiment and job.status in NEW and not job.key.sweep]
    measure = sum(not _trains(job) for job in jobs)
    parts = [f"{len(jobs) - measure} train"] if len(jobs) > measure else []
    parts += [f"{measure} measure models trained elsewhere"] if measure else []
    return f"{len(jobs)} runs new ({', '.join(arms)}; seeds {_span(seeds)}): {', '.join(parts)}"


def _trains(job) -> bool:
    """Whether the job trains its model (a job waiting for its rate will), not measures one made elsewhere."""
    return job.status == "train" or (job.status == "waiting" and job.model is None)


def _caps(plan: Plan, experiment: str, new: dict, results: Results) -> str:
    """How the experiment's new runs that train stop; with early stopping, how many of its runs so far (of those
    arms) ended at their step cap instead."""
    arms = list(dict.fromkeys(job.key.arm for job in plan.jobs if job.key.experiment == experiment
                              and not job.key.sweep and job.key.seed in new.get((experiment, job.key.arm), ())
                              and _trains(job)))
    if not arms:
        return ""
    trains = [plan.train(experiment, arm) for arm in arms]
    caps = " / ".join(f"{cap:,}" for cap in sorted({t.steps for t in trains}))
    if not all(t.patience for t in trains):
        return f"; {caps} steps each"
    runs = [(record, t) for arm, t in zip(arms, trains, strict=True)
            for key, record in results.of(experiment, arm).items()
            if "steps" in record.extent and key.seed not in new[experiment, arm]]
    ended = sum(not r.extent.get("stopped_early") and r.extent["steps"] >= t.steps for r, t in runs)
    so_far = f"; of its {len(runs)} runs so far, {ended} ended at their cap (not converged)" if runs else ""
    return f"; to early stopping or a cap of {caps} steps{so_far}" + (", and the new ones have the same cap"
                                                                     if ended else "")


def _span(seeds: set[int]) -> str:
    """"0-2, 5": seeds as runs of consecutive numbers."""
    spans, ordered = [], sorted(seeds)
    for seed in ordered:
        if spans and seed == spans[-1][1] + 1:
            spans[-1][1] = seed
        else:
            spans.append([seed, seed])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
