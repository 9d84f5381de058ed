"""What would settle a headline claim that a run leaves inconclusive: the seeds its measured spread says the
paper's effect needs, what they would cost at this tier (the runs' step cap and the seconds a run took here),
and at the paper's scale (the GPU-hours gpu.estimate gives the paper tier's experiment of the same name)."""

from __future__ import annotations

from ..config import load_config
from . import gpu
from .claims import Claim, Verdict, evaluate, not_learned
from .spec import Experiment, Suite, split_key
from .stats import MAX_SEEDS


def settle_lines(suite: Suite, results: dict) -> list[str]:
    """Markdown lines, one bullet per inconclusive headline claim (none when every headline claim is judged)."""
    open_claims = [(c, v) for c, v in evaluate(suite.claims, results) if c.headline and v.verdict == "inconclusive"]
    if not open_claims:
        return []
    experiments = {e.name: e for e in suite.experiments}
    lines = ["**What would settle the inconclusive headline claims.**", ""]
    for claim, verdict in open_claims:
        lines.append(f"- *{claim.statement}*: {_settle(claim, verdict, experiments[claim.experiment], suite, results)}")
    return [*lines, ""]


def _settle(claim: Claim, verdict: Verdict, experiment: Experiment, suite: Suite, results: dict) -> str:
    unlearned = not_learned(claim, results)
    if unlearned is not None:
        return f"the task must be learned first: {unlearned}."
    needed = verdict.seeds_needed
    if needed is None:
        return _why_unsized(claim, verdict)
    if needed > MAX_SEEDS:
        return f"more than {MAX_SEEDS:,} seeds at the spread measured here: more seeds cannot settle it."
    arms = [a for a in experiment.arms if a.label in (claim.arm, claim.baseline)]
    trains = [load_config(a.preset, a.overrides).train for a in arms]
    cap, stopping = max(t.steps for t in trains), any(t.patience for t in trains)
    more = max(0, needed - verdict.n)
    text = f"{needed} seeds (this run has {verdict.n}) of {' and '.join(a.label for a in arms)}, each run trained "
    text += f"until it stops improving or reaches {cap:,} steps" if stopping else f"{cap:,} steps"
    seconds = _seconds_per_run(results, experiment.name, [a.label for a in arms])
    if seconds is not None:
        text += (f": {more * len(arms)} more runs, about {more * len(arms) * seconds / 3600:.2g} CPU-hours at the "
                 f"{seconds:,.0f} s a run of them took here")
    return f"{text}. {_paper_scale(suite.name, experiment.name, needed)}"


def _why_unsized(claim: Claim, verdict: Verdict) -> str:
    if verdict.n >= 2 and verdict.detectable == 0:
        return ("Δ is the same in every seed, so the spread that sizes a test is unknown: the task must first "
                "separate the arms (a harder setting or a finer measure), then more seeds.")
    if claim.paper is None and claim.direction != "equal":
        return "the paper gives no effect size to size a test for."
    return f"not yet sized: {verdict.reason}."


def _seconds_per_run(results: dict, experiment: str, arms: list[str]) -> float | None:
    """The mean wall time of the runs of these arms that trained here (a reused record took 0 s)."""
    seconds = [record["seconds"] for key, record in results["runs"].items()
               if split_key(key)[:2] in {(experiment, arm) for arm in arms} and record.get("seconds", 0) > 0]
    return sum(seconds) / len(seconds) if seconds else None


def _paper_scale(suite_name: str, experiment: str, seeds: int) -> str:
    from . import SUITES  # the suite modules import this package's modules

    module = SUITES.get(suite_name)
    if module is None or "paper" not in module.TIERS:
        return "This suite has no paper-scale tier."
    paper = module.suite("paper")
    if not paper.gpu:
        return f"The paper's own protocol is CPU-sized: `attnlab reproduce {suite_name} --tier paper`."
    one, two = (dict(gpu.estimate(paper, seeds=n)) for n in (1, 2))
    if experiment not in one:
        return f"The paper tier has no {experiment} experiment to put a GPU figure on."
    hours = one[experiment] + (seeds - 1) * (two[experiment] - one[experiment])  # each seed past the first alike
    return (f"At the paper's scale (`attnlab reproduce {suite_name} --tier paper --seeds {seeds}`), its {experiment} "
            f"experiment is about {hours:,.0f} GPU-hours by gpu.estimate.")
