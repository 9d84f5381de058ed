"""Each claim's verdict on a suite's results: the checks RULES lists before judging, then the rule.

The checks, in RULES' order: the baselines reproduce the paper's numbers (calibration), the metric has room for
the paper's effect, the arm uses its mechanism (engagement), and the experiment's control arm learned the task.
Beside each verdict, the evidence the report shows with it: the interval over the validation tokens alone (a
paired bootstrap of blocks) and the size of the arm's model."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import replace
from functools import partial

from ..data.tasks import Floor, Floors
from .claims import (
    MIN_SEEDS,
    SAME_FRACTION,
    Anchor,
    Claim,
    TokenInterval,
    Verdict,
    anchors_of,
    arm_mean,
    failed_calibrations,
    judge,
    paired_deltas,
    rerun_of,
    seeds_of,
    value_of,
)
from .store import Results, RunKey


def no_floors(experiment: str, key: str) -> Floor | None:
    """Accuracies whose floor is their metric's least value (hand-built results without a plan)."""
    return None


def evaluate(claims: list[Claim], results: Results, floors: Floors = no_floors, gpu: dict[str, str] | None = None
             ) -> list[tuple[Claim, Verdict]]:
    """Each claim's verdict: the checks RULES lists before judging, then the rule on its interval, in our units
    (the same nats per character), with the verdict under the other transfer assumption beside it. floors:
    (experiment, results key) -> the chance floor of that accuracy (Plan.floor), None where it has none; gpu:
    experiment -> the plan that runs it on a GPU (Experiment.gpu), which a claim not run yet names."""
    judged = []
    for claim in claims:
        floor = floors(claim.experiment, claim.metric) if isinstance(claim.metric, str) else None
        verdict = _verdict(claim.in_our_units(), results, floor)
        if verdict.verdict == "not run yet" and (plan := (gpu or {}).get(claim.experiment)):
            verdict = replace(verdict, reason=f"{verdict.reason}: GPU tier, run by {plan}")
        if claim.chars_per_token is not None and (exponent := claim.exponent(SAME_FRACTION, results)) is not None:
            other = claim.in_our_units(exponent)
            verdict = replace(verdict, other=(_verdict(other, results, floor).verdict, _bar(other)))
        tokens = token_interval(claim, results) if verdict.n >= MIN_SEEDS else None
        params = results.params(claim.experiment, claim.arm, sweeps=True)
        rerun = evaluate([rerun_of(claim)], results, floors)[0][1] if claim.rerun else None
        judged.append((claim, replace(verdict, tokens=tokens, params=params, rerun=rerun)))
    return judged


def _verdict(claim: Claim, results: Results, floor: Floor | None) -> Verdict:
    """The verdict of a claim in our units."""
    verdict = judge(paired_deltas(claim, results), claim)
    if verdict.n == 0 and (reason := not_run(claim, results)) is not None:
        return replace(verdict, verdict="not run yet", reason=reason)
    if (reason := not_calibrated(claim, results)) is not None:  # whatever the claim's own seeds
        return replace(verdict, verdict="not calibrated", reason=reason)
    if verdict.n >= MIN_SEEDS:
        for check, word in ((uncalibrated, "inconclusive"),
                            (partial(untestable, floor=floor, detectable=verdict.detectable), "untestable here"),
                            (unmeasured, "inconclusive"), (partial(not_engaged, floor=floor), "mechanism not engaged"),
                            (not_learned, "inconclusive")):
            if (reason := check(claim, results)) is not None:
                return replace(verdict, verdict=word, reason=reason)
    return verdict


def not_run(claim: Claim, results: Results) -> str | None:
    """Why a claim has no values: none of its arms has a record of its experiments yet (None if one has)."""
    experiments = [e for e in (claim.experiment, claim.contrast) if e]
    arms = [a for a in (claim.arm, claim.baseline) if a]
    if any(results.of(experiment, arm, sweeps=True) for experiment in experiments for arm in arms):
        return None
    return f"no run of {' or '.join(arms)} on {' or '.join(experiments)} yet"


def not_calibrated(claim: Claim, results: Results) -> str | None:
    """Why a baseline of the claim does not reproduce the paper's absolute number (None if all do, or it has none)."""
    lines = [line for held, line in (anchor.check(results) for anchor in claim.calibration) if held is False]
    return f"the baseline is not the paper's: {'; '.join(lines)}" if lines else None


def uncalibrated(claim: Claim, results: Results) -> str | None:
    """Why it is not known yet whether the claim's baselines reproduce the paper's numbers (None if it is known)."""
    lines = [line for held, line in (anchor.check(results) for anchor in claim.calibration) if held is None]
    return f"the calibration is not measured yet: {'; '.join(lines)}" if lines else None


def untestable(claim: Claim, results: Results, floor: Floor | None = None, detectable: float = math.nan
               ) -> str | None:
    """Why the metric cannot show the claim (None if it can): the paper's effect would carry the arm past a bound
    from where the baseline is; or the arm and its baseline both lie within the bar (the paper's effect, an equal
    claim's margin, or without either the detectable effect) of one end: at or under the task's chance floor
    (`floor`; 0 where it has none), where neither learned what separates them, or at the ceiling, where they
    agree whatever their mechanisms."""
    limits = claim.limits
    if limits is None or claim.baseline is None or claim.contrast or claim.relative:
        return None
    base = arm_mean(results, claim.experiment, claim.baseline, claim.metric)
    arm = arm_mean(results, claim.experiment, claim.arm, claim.metric)
    if base is None or arm is None:
        return None
    if (target := claim.target) is not None and claim.direction != "equal":  # an equal claim's margin has room
        room = claim.scale * ((limits[1] if target > 0 else limits[0]) - base)  # the most Δ can be on that side
        if abs(room) < abs(target):
            return (f"{claim.baseline} scores {claim.scale * base:.4g} and the metric stops at "
                    f"{claim.scale * limits[1 if target > 0 else 0]:g}, so no arm can show the paper's "
                    f"{claim.signed(target)}")
    return _at_an_end(claim, arm, base, floor, detectable)


def _at_an_end(claim: Claim, arm: float, base: float, floor: Floor | None, detectable: float) -> str | None:
    """Why the arm and baseline both sit at an end of the metric (None if they do not): no more than the bar above
    the chance floor (at or under it, whatever the bar), or within the bar of the ceiling. Without a paper's effect
    or margin the bar is the detectable effect, while it is under half the metric's span (more: these seeds cannot
    place the arms at either end)."""
    limits, paper = claim.limits, _bar(claim)
    low = limits[0] if floor is None else floor.value
    bar = paper if paper is not None else detectable if detectable < claim.scale * (limits[1] - low) / 2 else 0.0
    size = claim.signed(abs(bar)).lstrip("+")
    shown = (f"parity within ±{size}" if claim.direction == "equal" else f"the paper's {claim.signed(paper)}"
             if paper is not None else f"an effect these seeds detect (≥ {size})")
    scores = f"{claim.scale * arm:.4g} and {claim.scale * base:.4g}"
    if all(claim.scale * (value - low) <= abs(bar) for value in (arm, base)):
        if floor is None:
            where = f"within {size} of the metric's floor ({scores}; it starts at {claim.scale * low:g})"
        elif all(value <= low for value in (arm, base)):
            return (f"{claim.arm} and {claim.baseline} both score at or under the task's chance floor, {floor}: "
                    f"{scores}, so neither has learned what the claim compares")
        else:
            where = f"no more than {size} above the task's chance floor, {floor}: {scores}"
        return f"{claim.arm} and {claim.baseline} both score {where}, so it cannot show {shown}"
    if bar and all(claim.scale * abs(limits[1] - value) <= abs(bar) for value in (arm, base)):
        return (f"{claim.arm} and {claim.baseline} both score within {size} of the metric's ceiling ({scores}; it "
                f"stops at {claim.scale * limits[1]:g}), so it cannot show {shown}")
    return None


def unmeasured(claim: Claim, results: Results) -> str | None:
    """Why it is unknown whether the arm uses its mechanism: the claim checks engagement and no seed has been
    measured with the component removed (None otherwise). `attnlab reproduce` measures it."""
    if claim.ablation is None or _ablation_moves(claim, results):
        return None
    return (f"{claim.arm} has not been measured with its own component removed, so whether it uses the mechanism "
            f"is unknown (`attnlab reproduce` measures it)")


def not_engaged(claim: Claim, results: Results, floor: Floor | None = None) -> str | None:
    """Why the trained arm does not use its mechanism enough to show the paper's effect: removing the component
    at evaluation moves the metric by less than that effect (None if it moves it more, or was not measured). For
    an equal claim the bar is its margin: a component that moves the metric less would leave the arm without it
    at parity too, so parity would say nothing about the mechanism."""
    equal, bar = claim.direction == "equal", _bar(claim)
    if claim.ablation is None or bar is None:
        return None
    moves = _ablation_moves(claim, results)
    if not moves or _near_floor(claim, results, bar, floor):
        return None
    # seed by seed: one seed's large move does not make a mechanism the other seeds leave unused engaged
    median = statistics.median(abs(move) for move in moves)
    if median >= abs(bar):
        return None
    than = f"the margin ±{claim.signed(bar).lstrip('+')}" if equal else f"the paper's {claim.signed(bar)}"
    per_seed = ", ".join(claim.signed(move) for move in moves)
    which = f"the median seed's {claim.signed(median).lstrip('+')}" if len(moves) > 1 else "that"
    return (f"removing {claim.arm}'s own component at evaluation moves {claim.metric} by {per_seed} "
            f"({len(moves)} seed{'s' if len(moves) > 1 else ''}): {which} is less than {than}")


def _ablation_moves(claim: Claim, results: Results) -> list[float]:
    """Each seed's move of the metric when the arm's own component is removed at evaluation, where measured."""
    return [move for seed in seeds_of(results, [claim.experiment])
            if (move := _ablation_move(claim, results, seed)) is not None]


def _ablation_move(claim: Claim, results: Results, seed: int) -> float | None:
    intact = value_of(results, claim.experiment, claim.arm, seed, claim.metric)
    ablated = value_of(results, claim.experiment, claim.arm, seed, claim.ablation)
    if intact is None or ablated is None:
        return None
    return 100 * (ablated / intact - 1) if claim.relative else claim.scale * (ablated - intact)


def _bar(claim: Claim) -> float | None:
    """The least move of the metric that removing the component must make: the paper's effect, or the margin."""
    return claim.threshold if claim.direction == "equal" else claim.target


def _near_floor(claim: Claim, results: Results, bar: float, floor: Floor | None = None) -> bool:
    """Whether the arm's mean lies less than `bar` (in the claim's units) above its bounded metric's least value,
    or above the task's chance floor where it has one: a model that has not learned the task."""
    mean = arm_mean(results, claim.experiment, claim.arm, claim.metric)
    if claim.limits is None or claim.relative or mean is None:
        return False
    return claim.scale * (mean - (claim.limits[0] if floor is None else floor.value)) < abs(bar)


def not_learned(claim: Claim, results: Results) -> str | None:
    """Why the claim's experiment tests nothing yet: its control arm's mean falls short (None if it does not)."""
    if claim.control is None:
        return None
    arm, metric, least = claim.control
    mean = arm_mean(results, claim.experiment, arm, metric)
    if mean is None:
        return f"no {arm} run measured yet, which must first reach {least:g} in {metric}"
    if mean >= least:
        return None
    return f"{arm} reached {mean:.3g} in {metric}, short of {least:g}: the task is not learned, so it tests nothing yet"


# how a calibration line names whether the paper's number held (None: not measured yet)
_CHECKED = {True: "calibrated", False: "**not calibrated**", None: "not yet run"}


def calibration_lines(claims: list[Claim], results: Results, planned=None) -> list[str]:
    """Markdown bullets, one per number of the paper's that a baseline must reproduce: ours against it, and where
    it missed with all its planned seeds (planned(experiment, arm) -> seeds), that nothing is compared with it."""
    failed = failed_calibrations(anchors_of(claims), results, planned) if planned else {}
    lines = []
    for anchor in anchors_of(claims):
        held, line = anchor.check(results)
        word = _CHECKED[held]
        others = {key.arm for key in results.of(anchor.experiment, sweeps=True)} - {anchor.arm}
        after = "" if anchor.experiment not in failed else (
            "; the other arms trained before are shown, not judged" if others else "; its other arms are not trained")
        lines.append(f"- {word}: {line}{after}")
    return lines


def reading_lines(anchors: list[Anchor], results: Results) -> list[str]:
    """Markdown bullets for the paper's numbers that readings of an experiment are checked against (Suite.anchors):
    each reading's line, then, once every reading is measured, what they conclude: which reproduce the number, or
    that none does."""
    lines, by_experiment = [], {}
    for anchor in anchors:
        by_experiment.setdefault((anchor.experiment, anchor.paper), []).append(anchor)
    for (experiment, paper), group in by_experiment.items():
        checks = [(anchor.arm, *anchor.check(results)) for anchor in group]
        lines += [f"- {_CHECKED[held]}: {line}" for _, held, line in checks]
        if any(held is None for _, held, _ in checks):
            continue
        held = [arm for arm, ok, _ in checks if ok]
        lines.append(f"- **{experiment}: no reading reproduces the paper's {paper:g}**: under each of the "
                     f"{len(checks)} readings tried, ours lies outside the tolerance" if not held else
                     f"- **{experiment}: the paper's {paper:g} is reproduced under {', '.join(held)}**, of "
                     f"{len(checks)} readings tried")
    return lines


def engagement_lines(claims: list[Claim], results: Results, floors: Floors = no_floors) -> list[str]:
    """Markdown bullets, one per arm whose claims check engagement: how much removing its mechanism's own
    component at evaluation moves the metric, seed by seed, against the least the paper's effect needs."""
    lines, checked = [], {}
    for claim in claims:  # the first claim of each arm and ablated metric
        if claim.ablation is not None:
            checked.setdefault((claim.experiment, claim.arm, claim.ablation), claim)
    per_arm = Counter((experiment, arm) for experiment, arm, _ in checked)
    for claim in checked.values():
        # an arm judged on several metrics of one experiment (S-NIAH at 1x and 2x) has a line for each
        where = f"{claim.arm} on {claim.experiment}" + (
            f" ({claim.metric})" if per_arm[claim.experiment, claim.arm] > 1 else "")
        seeds = seeds_of(results, [claim.experiment])
        moves = [(seed, move) for seed in seeds if (move := _ablation_move(claim, results, seed)) is not None]
        if not moves:
            missed = not_calibrated(claim, results)
            why = "not trained: the baseline is not calibrated" if missed else "not measured yet"
            lines.append(f"- {where}: {why}")
            continue
        per_seed = ", ".join(f"{claim.signed(move)} (seed {seed})" for seed, move in moves)
        near = ""
        chance = floors(claim.experiment, claim.metric) if isinstance(claim.metric, str) else None
        if (bar := _bar(claim)) is not None and _near_floor(claim, results, bar, chance):
            mean = arm_mean(results, claim.experiment, claim.arm, claim.metric)
            low = "0" if chance is None else f"its chance floor {claim.scale * chance.value:.3g}"
            near = (f" (it scores {claim.scale * mean:.3g}, too near {low} to fall by "
                    f"{abs(bar):g}: this cannot show whether it uses the component)")
        lines.append(f"- {where}: removing its own component at evaluation moves {claim.metric} by {per_seed}{near}")
    return lines


BOOTSTRAP_DRAWS = 2000


def token_interval(claim: Claim, results: Results, draws: int = BOOTSTRAP_DRAWS) -> TokenInterval | None:
    """The 95% interval of a relative perplexity claim's mean Δ over the validation tokens alone.

    The same models, the split's blocks of windows (the val_ppl metric records val_blocks) resampled with
    replacement, the same draw for both arms and every seed (paired), over the paired seeds whose records keep
    their blocks (at least MIN_SEEDS).
    Beside the seed interval it says how much of the uncertainty is the validation sample's. None where the claim
    is not one of them; an interval of None where too few seeds keep blocks."""
    if claim.metric != "val_ppl" or not claim.relative or claim.contrast or claim.baseline is None:
        return None
    import numpy as np  # when an interval is computed: importing the report stays light

    arms, bases, paired = [], [], 0
    for seed in seeds_of(results, [claim.experiment]):
        arm, base = (results.get(RunKey(claim.experiment, label, seed=seed)) for label in (claim.arm, claim.baseline))
        if arm is None or base is None or "val_ppl" not in arm.values or "val_ppl" not in base.values:
            continue  # as paired_deltas: a seed without both values is left out
        paired += 1
        if "val_blocks" in arm.details and "val_blocks" in base.details:
            arms.append(arm.details["val_blocks"])
            bases.append(base.details["val_blocks"])
    if len(arms) < MIN_SEEDS:
        return TokenInterval(None, 0, len(arms), paired)
    arm_blocks, base_blocks = np.array(arms), np.array(bases)  # [seeds, blocks]
    picks = np.random.default_rng(0).integers(0, arm_blocks.shape[1], size=(draws, arm_blocks.shape[1]))
    gap = arm_blocks[:, picks].mean(-1) - base_blocks[:, picks].mean(-1)  # [seeds, draws]: loss per token, arm - base
    deltas = (100 * np.expm1(gap)).mean(0)
    low, high = np.percentile(deltas, [2.5, 97.5])
    return TokenInterval((float(low), float(high)), arm_blocks.shape[1], len(arms), paired)
