"""What would settle a headline claim that a run leaves inconclusive: the seeds it needs, and what they cost. The
seeds are those its measured spread says the paper's effect needs; their cost is given at this tier (the runs' step
cap and the time a run took here), and at the paper's scale (the GPU-hours estimate.estimate gives the paper tier's
experiment of the same name)."""

from __future__ import annotations

from . import estimate
from .claims import MIN_SEEDS, Claim, Verdict
from .plan import Plan
from .registry import SUITES
from .spec import Suite
from .stats import MAX_SEEDS
from .store import Results
from .verdicts import not_learned


def settle_lines(suite: Suite, judged: list[tuple[Claim, Verdict]], results: Results, plan: Plan) -> list[str]:
    """Markdown lines, one bullet per inconclusive headline claim (none when every headline claim is judged,
    and none for a smoke run, whose spread sizes nothing)."""
    if results.setting["quick"]:
        return []
    open_claims = [(c, v) for c, v in judged if c.headline and v.verdict == "inconclusive"]
    if not open_claims:
        return []
    lines = ["**What would settle the inconclusive headline claims.**", ""]
    lines += [f"- *{claim.statement}*: {_settle(claim, verdict, suite, results, plan)}"
              for claim, verdict in open_claims]
    return [*lines, ""]


def _settle(claim: Claim, verdict: Verdict, suite: Suite, results: Results, plan: Plan) -> str:
    unlearned = not_learned(claim, results)
    if unlearned is not None:
        return f"the task must be learned first: {unlearned}."
    needed = verdict.seeds_needed
    if needed is None:
        return _why_unsized(claim, verdict)
    if needed > MAX_SEEDS:
        return f"more than {MAX_SEEDS:,} seeds at the spread measured here: out of reach by more seeds."
    if needed <= verdict.n:
        return (f"this run has the {needed} seeds that the paper's effect needs at the spread measured here; its Δ "
                "lies between 0 and the paper's effect, so more seeds would size a smaller effect than the paper's.")
    experiments = [e for e in suite.experiments if e.name in (claim.experiment, claim.contrast)]
    arms = [(e, a) for e in experiments for a in e.arms if a.label in (claim.arm, claim.baseline)]
    trains = [plan.train(e.name, a.label) for e, a in arms]  # the steps as the suite trains them at its scale
    cap = max(t.steps for t in trains)
    stopping = ", each stopping early once it stops improving" if all(t.patience for t in trains) else ""
    more = (needed - verdict.n) * len(arms)
    text = (f"{needed} seeds (this run has {verdict.n}): {more} more runs of "
            f"{' and '.join(sorted({a.label for _, a in arms}))} of at most {cap:,} steps{stopping}")
    seconds = _seconds_per_run(results, [e.name for e in experiments], [claim.arm, claim.baseline])
    if seconds is not None:
        text += f", about {more * seconds / 3600:.2g} hours on this machine at the {seconds:,.0f} s a run took here"
    return f"{text}. {_paper_scale(suite, [e.name for e in experiments], needed)}"


def _why_unsized(claim: Claim, verdict: Verdict) -> str:
    if verdict.n >= 2 and verdict.low == verdict.high:  # no spread
        return ("Δ is the same in every seed, so the spread that sizes a test is unknown: the task must first "
                "separate the arms (an easier setting or longer training where every arm sits at the floor, a "
                "harder one at the ceiling, or a finer measure), then more seeds.")
    if 2 <= verdict.n < MIN_SEEDS:
        return (f"first the seeds a verdict needs ({MIN_SEEDS}; this run has {verdict.n}): the spread of "
                f"{verdict.n} seeds has {verdict.n - 1} degree(s) of freedom, too few to size a test by.")
    if claim.paper is None and claim.direction != "equal":
        return "the paper gives no effect size to size a test for."
    return f"not yet sized: {verdict.reason}."


def _seconds_per_run(results: Results, experiments: list[str], arms: list[str]) -> float | None:
    """The mean wall time of the runs of these arms that trained their model here (not those that measured a
    model trained before, or reused a record)."""
    seconds = [record.seconds for key, record in results.items() if key.experiment in experiments
               and key.arm in arms and record.trained is not False and (record.seconds or 0) > 0]
    return sum(seconds) / len(seconds) if seconds else None


def _paper_scale(suite: Suite, experiments: list[str], seeds: int) -> str:
    registered = SUITES.get(suite.name)
    if registered is None or "paper" not in registered.tiers:
        return "This suite has no paper-scale tier."
    if suite.tier == "paper":
        return f"This is the paper tier: `attnlab reproduce {suite.name} --tier paper --seeds {seeds}`."
    paper = registered.suite("paper")
    if not paper.gpu:
        return f"The paper's own protocol is CPU-sized: `attnlab reproduce {suite.name} --tier paper --seeds {seeds}`."
    capped = [e.name for e in paper.experiments if e.name in experiments and e.seeds and e.seeds < seeds]
    one, two = (dict(estimate.estimate(paper, seeds=n)) for n in (1, 2))
    missing = [name for name in experiments if name not in one]
    if missing:
        return f"The paper tier has no {' or '.join(missing)} experiment to put a GPU figure on."
    if capped:
        return f"The paper tier runs at most a few seeds of {', '.join(capped)}: no GPU figure for {seeds}."
    # each seed past the first costs alike; an experiment whose models another one trains costs nothing more
    hours = sum(one[name] + (seeds - 1) * (two[name] - one[name]) for name in experiments)
    shared = " (its models are trained by another experiment of that tier)" if hours == 0 else ""
    return (f"At the paper's scale (`attnlab reproduce {suite.name} --tier paper --seeds {seeds}`), about "
            f"{hours:,.0f} GPU-hours by gpu.estimate{shared}.")
