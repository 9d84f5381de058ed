"""The paper's claims as data, judged against measured results: paired per-seed differences, a 95% t-interval,
a verdict by fixed rules (RULES), and how many seeds the paper's effect would need."""

from __future__ import annotations

import math
import statistics
import textwrap
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from .stats import MAX_SEEDS, detectable_effect, holm, mean_interval, mean_std, seeds_needed, t_test_p
from .store import Results, RunKey

DIRECTIONS = ("lower", "higher", "equal")

MIN_SEEDS = 3  # a directional verdict needs this many seeds: with 2 the spread has one degree of freedom
FRAGILE = 0.2  # an interval that clears 0 by less than this fraction of its half-width is marked fragile
ALPHA = 0.05  # the level of the tests behind the 95% intervals, and of Holm's correction over the headlines
# the words that say an interval cleared 0 (or lay within an equal claim's margin)
CLEARED = ("agrees", "agrees in sign; smaller than the paper's", "agrees in sign; larger than the paper's", "opposite")
# characters per token of English under GPT-2-style byte-level BPE, the common rule of thumb (4 to 4.5 is what
# such tokenizers give on English prose): a saving per token is this many times smaller per character, in nats
CHARS_PER_TOKEN = 4.0

RULES = f"""\
**How claims are judged.** For every seed, Δ is the claim's quantity for the arm minus the same quantity for the
baseline (or the arm's value itself when there is no baseline; arm / baseline − 1 in % for relative claims; this
difference minus the same difference in a second experiment for "the gap grows" claims). Seeds are paired by index
and a seed missing any needed value is left out. The 95% interval is the t-interval of the mean Δ over seeds.

**The paper's effect in our units.** Where the paper's perplexities are per BPE token and ours per character, every
perplexity ratio R of the paper's (an arm's perplexity over its baseline's: a relative effect r = R − 1 or an equal
claim's margin; a growth factor over lengths) becomes R^e per character, under two assumptions of how an effect
carries over:
- *the same nats per character*: a saving of ΔL nats per token is ΔL / c nats per character, so e = 1/c, with
  c = {CHARS_PER_TOKEN:g} characters per token (the common figure for English under GPT-2-style byte-level BPE; 4.5
  would make effects smaller still);
- *the same fraction of the loss*: the effect takes the same share of the baseline's loss, so e = L_ours / L_paper,
  our baseline's loss per character over the paper's per token (the logarithms of the two perplexities).
The first decides the verdict; the row says whether the second gives the same word, and which where it does not.
The unconverted number is shown only as the paper's.

**Before judging**, in this order:
- *not calibrated*, however many seeds the claim has, if a baseline the tier runs under the paper's own protocol (the
  claim's, and for "the gap grows" claims the second experiment's too) misses the paper's absolute number by more than
  its tolerance (two of the paper's standard deviations where the paper gives them, and at most a stated fraction of
  the effect it guards, never the effect itself): the protocol differs from the paper's in something that matters. The
  tier then trains no other arm of that experiment once the baseline's planned seeds are in (calibration before
  comparison);
- *inconclusive* with fewer than {MIN_SEEDS} seeds (a spread from 2 seeds has one degree of freedom), or while a
  baseline to calibrate has no run;
- *untestable here* if the paper's effect cannot occur on the metric given the baseline: an accuracy that would have
  to pass 100% (or fall below 0%), or a growth ratio that would have to fall below 1 (flatter than flat); or if the
  arm and its baseline both score within the paper's effect (an equal claim: its margin) of one bound of the metric:
  both at chance or at 0%, where neither learned what would separate them, or both at 100%, where they agree
  whatever their mechanisms;
- *inconclusive* if the claim checks engagement (below) and the arm has not been measured with its component
  removed: whether the trained model uses its mechanism is unknown;
- *mechanism not engaged* if removing the mechanism's own component at evaluation (its couplings, its step, its
  correction, its query path) moves the metric by less than the paper's effect (an equal claim: less than its
  margin, so the arm without the component would be at parity too) in the median seed: the trained model does not
  use it enough to show it (one seed's large move does not make it engaged while the others' are small). Not
  where the arm scores so near the metric's floor (an accuracy near 0) that no removal could lower it that far: a
  model that has not learned the task cannot show how it uses the component;
- *inconclusive* if the experiment's control arm (softmax attention on recall) did not learn the task, or if Δ is the
  same in every seed (no spread to judge it by).

**Verdicts.**
- A claim that Δ is **lower** / **higher** than 0 *agrees* if the whole interval lies on the claimed side of 0 and
  contains the paper's effect (or the paper gives none); where it lies on the claimed side but excludes the paper's
  effect, the word says the size too: *agrees in sign; smaller than the paper's* or *agrees in sign; larger than the
  paper's*. It is *opposite* if the whole interval lies on the other side; it is *smaller than the paper's* if the
  interval contains 0 but excludes the paper's effect (the run could see an effect of the paper's size and saw none);
  otherwise it is *inconclusive*.
- A claim that two arms are **equal** (|Δ| ≤ margin) *agrees* if the interval lies within ±margin; it is *opposite*
  if the interval lies entirely outside ±margin; otherwise it is *inconclusive*.

**A control.** An arm with no component of its own (J-only, which as specified attends uniformly) is named as a
control: its claim compares the baseline with it, and no result of the mechanism's can fail it.

**Interim.** A verdict read while fewer seeds have values than the tier plans is marked *interim, n of N planned
seeds*: the tier fixes its seed count before the runs, and a verdict read as they come in may still change (adding
seeds until an interval leaves 0 would overstate it).

**Not converged; sweep going on.** A verdict whose runs (the claim's arm and baseline) stop early, but of which some
ended at their step cap instead, is marked *not converged, k of n runs at their cap*: those models were still
improving, and a longer cap may change the verdict. One whose arm or baseline trains at the best rate so far of a
sweep still under way (its best rate lay at an edge, and the rate beyond it has not run yet) is marked *sweep going
on*.

**Multiplicity and fragility.** Each headline claim's row gives the p-value of the test behind its interval (that
Δ = 0; for an equal claim, that |Δ| exceeds the margin, by two one-sided tests) and the same p-value after Holm's
correction over the suite's headline claims that have one; a verdict that cleared 0 (or the margin) is marked *not
significant after Holm's correction* where the adjusted p-value is {ALPHA:g} or more. An interval that clears 0 by
less than {FRAGILE:g} of its half-width is marked *fragile*: a seed more or less could move it across.

**Power.** "Detects ≥ d" is the smallest |effect| that a paired t-test on these seeds finds with 80% power at
two-sided α = 0.05, from the observed standard deviation s of the Δs (exact, from the noncentral t distribution
with n − 1 degrees of freedom and noncentrality d·√n / s; about (t₀.₉₇₅,ₙ₋₁ + t₀.₈₀,ₙ₋₁) · s / √n), given from
{MIN_SEEDS} seeds on. For equal claims it is the smallest margin whose interval would lie within ±margin with 80% power
when the true Δ is 0: d = (t₀.₉₇₅,ₙ₋₁ + t₀.₉₀,ₙ₋₁) · s / √n. "Needs N seeds" is the smallest n whose d at the same s is
at most the paper's |effect| (the margin for equal claims).
"""

VERDICTS = ("agrees", "agrees in sign; smaller than the paper's", "agrees in sign; larger than the paper's", "opposite",
            "smaller than the paper's", "inconclusive", "untestable here", "not calibrated", "mechanism not engaged")


SAME_NATS, SAME_FRACTION = "the same nats per character", "the same fraction of the loss"  # the two transfers


def transferred(ratio: float, exponent: float) -> float:
    """A perplexity ratio of the paper's per BPE token as one per character: R^e (RULES gives e under each
    transfer assumption). The one conversion every per-token effect and margin goes through."""
    return ratio**exponent


def per_token(baseline_ppl: float | None, scale: str | None = None, **growths) -> dict:
    """A claim's options where the paper's perplexities are per BPE token and ours per character: its effect and
    margin convert (RULES), the paper's baseline perplexity per token (None: not given) entering the second transfer
    assumption, its model size shown beside ours; growths: paper_growths of a growth claim."""
    return {"chars_per_token": CHARS_PER_TOKEN, "paper_ppl": baseline_ppl, "paper_scale": scale, **growths}


@dataclass(frozen=True)
class Anchor:
    """An absolute number of the paper's that a tier running the paper's protocol must reproduce before it
    compares anything: the mean of `arm`'s `metric` on `experiment` (times scale) within paper ± tolerance."""

    experiment: str
    arm: str
    metric: str
    paper: float
    tolerance: float
    scale: float = 1.0
    basis: str = ""  # where the tolerance comes from ("two of the paper's standard deviations of 0.019")

    def check(self, results: Results) -> tuple[bool | None, str]:
        """(whether it holds, None without values; the calibration line)."""
        values = _arm_values(results, self.experiment, self.arm, self.metric)
        what = f"{self.arm} on {self.experiment}"
        if not values:
            return None, f"{what}: no run yet (the paper: {self.paper:g})"
        mean = self.scale * sum(values) / len(values)
        spread = f" ± {self.scale * mean_std(values)[1]:.2g}" if len(values) > 1 else ""
        held = abs(mean - self.paper) <= self.tolerance
        return held, (f"{what}: ours {mean:.4g}{spread} ({len(values)} seed{'s' if len(values) > 1 else ''}), the "
                      f"paper {self.paper:g}: off by {mean - self.paper:+.3g}, "
                      f"{'within' if held else 'outside'} the tolerance ±{self.tolerance:.3g}"
                      + (f" ({self.basis})" if self.basis else ""))


def relative(a: float, b: float) -> float:
    """a relative to b, in % (how the papers' perplexities enter relative claims)."""
    return 100 * (a / b - 1)


@dataclass(frozen=True)
class Claim:
    statement: str  # "h+J beats softmax on the LM at T = 12"
    experiment: str  # the experiment's name, as its runs' keys have it (RunKey.experiment)
    metric: str  # a results key ("val_ppl"), or "a/b": the per-run ratio of two keys ("ppl@448/ppl@128")
    arm: str
    baseline: str | None  # another arm of the same experiment; None: the arm's own value minus `reference`
    direction: str  # "lower" | "higher": the claim is Δ < 0 | Δ > 0; "equal": |Δ| <= margin
    paper: float | None = None  # the paper's Δ, in the claim's units; None: the paper gives none
    relative: bool = False  # Δ per seed = 100 · (arm / baseline - 1), in % (perplexities across scales)
    margin: float | None = None  # "equal" claims: the equivalence margin, in the claim's units
    contrast: str | None = None  # another experiment with the same arms: Δ = Δ here - Δ there ("the gap grows")
    headline: bool = False  # one of the paper's headline claims
    scale: float = 1.0  # the claim's units per unit of the metric (100: accuracies in percentage points)
    reference: float = 0.0  # without a baseline, Δ = scale · value − reference (99: "reaches 99%")
    # (arm, metric, least mean): the experiment tests the claim only once this arm has learned the task, e.g.
    # ("softmax", "accuracy", 0.99) on MQAR; until then the verdict is inconclusive
    control: tuple[str, str, float] | None = None
    chars_per_token: float | None = None  # the paper's effect is per BPE token of this many characters; ours per one
    # per-token claims: the paper's baseline perplexity per token (at the training length for growth claims), which
    # the transfer "the same fraction of the loss" divides ours by (in logarithms)
    paper_ppl: float | None = None
    # a claim on growth factors ppl@long / ppl@short (metric "a/b"): the paper's arm's and baseline's, per token
    paper_growths: tuple[float, float] | None = None
    paper_scale: str | None = None  # the paper's model size ("60M"), shown beside ours
    # the paper's numbers that the baselines must first reproduce: the claim's experiment's, and its contrast's
    calibration: tuple[Anchor, ...] = ()
    bounds: tuple[float, float] | None = None  # the least and most the metric can be (accuracies: 0 and 1)
    ablation: str | None = None  # the results key of the metric with the mechanism's component removed
    # why the arm has no learned component of its own ("as specified, it attends uniformly"): it is a control, and
    # its claim tests the baseline against it, not a mechanism (no result of the mechanism's can fail it)
    control_arm: str | None = None

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise ValueError(f"{self.statement!r}: direction must be one of {DIRECTIONS}, not {self.direction!r}")
        if self.direction == "equal" and not (self.margin is not None and self.margin > 0):
            raise ValueError(f"{self.statement!r}: an 'equal' claim needs a positive margin")
        if self.relative and (self.baseline is None or self.scale != 1.0):
            raise ValueError(f"{self.statement!r}: a relative claim needs a baseline and is in % (scale 1)")
        if self.chars_per_token is not None and not (self.relative or self.paper_growths):
            raise ValueError(f"{self.statement!r}: only a relative perplexity or a growth factor converts from per "
                             "token to per character")
        sign = {"lower": -1, "higher": 1}.get(self.direction)
        if sign is not None and self.paper is not None and not sign * self.paper > 0:
            # the "excludes the paper's effect" rule reads the paper's effect as lying on the claimed side
            raise ValueError(f"{self.statement!r}: the paper's effect {self.paper} is not {self.direction} than 0")

    @property
    def units(self) -> str:
        return "%" if self.relative else ""

    @property
    def target(self) -> float | None:
        """The paper's effect in the run's units: per character where the paper's is per BPE token (the same nats
        per character)."""
        return self.in_our_units().paper

    @property
    def threshold(self) -> float | None:
        """An equal claim's margin in the run's units (as `target`)."""
        return self.in_our_units().margin

    def in_our_units(self, exponent: float | None = None) -> Claim:
        """The claim with the paper's effect and margin per character: every perplexity ratio R raised to
        `exponent` (RULES; by default 1/c, the same nats per character). Itself where the paper's units are ours."""
        if self.chars_per_token is None:
            return self
        e = 1 / self.chars_per_token if exponent is None else exponent
        if self.paper_growths is not None:  # growth factors per token -> per character; the margin an excess over 1
            arm, base = (transferred(g, e) for g in self.paper_growths)
            paper, margin = arm - base, None if self.margin is None else transferred(1 + self.margin, e) - 1
        else:
            paper, margin = (None if x is None else 100 * (transferred(1 + x / 100, e) - 1)
                             for x in (self.paper, self.margin))
        return replace(self, paper=paper, margin=margin, chars_per_token=None)

    def exponent(self, transfer: str, results: Results) -> float | None:
        """e of the transfer assumption (RULES), None where the results cannot give it yet."""
        if transfer == SAME_NATS:
            return 1 / self.chars_per_token
        key = self.metric.partition("/")[2] or self.metric  # the loss at the training length
        ours = _arm_mean(results, self.experiment, self.baseline, key) if self.paper_ppl else None
        return None if ours is None or ours <= 1 else math.log(ours) / math.log(self.paper_ppl)

    @property
    def limits(self) -> tuple[float, float] | None:
        """The least and most the metric can be: given, or [0, 1] for accuracies (scale 100)."""
        return self.bounds if self.bounds is not None else ((0.0, 1.0) if self.scale == 100 else None)

    @property
    def largest(self) -> float | None:
        """The largest |Δ| the metric can show: two accuracies (scale 100) differ by at most 100 points, a
        difference of two such differences by 200; None for the unbounded metrics (perplexities, J)."""
        if self.scale != 100:
            return None
        return 200.0 if self.contrast else 100.0


@dataclass(frozen=True)
class Verdict:
    n: int  # seeds with all needed values
    delta: float  # mean Δ (nan without seeds)
    low: float  # 95% t-interval of the mean Δ (nan with fewer than 2 seeds)
    high: float
    verdict: str  # one of VERDICTS
    reason: str
    detectable: float  # smallest |effect| found with 80% power at these seeds and sd (nan: under 2 seeds, no spread)
    seeds_needed: int | None  # seeds for the paper's effect (the margin); None: unknown; MAX_SEEDS + 1: more
    # the test behind the interval, as a p-value (nan: no test): that Δ = 0 (two-sided), or for an equal claim
    # that |Δ| > margin (two one-sided tests, doubled: p < 0.05 exactly where the 95% interval lies within ±margin)
    p: float = float("nan")
    # per-token claims: the verdict under the transfer "the same fraction of the loss", and the paper's effect (an
    # equal claim: its margin) per character under it; None where it does not apply or is not known yet
    other: tuple[str, float] | None = None

    @property
    def fragile(self) -> bool:
        """Whether the interval clears 0, but by less than a fifth of its half-width."""
        half = (self.high - self.low) / 2
        return self.low * self.high > 0 and min(abs(self.low), abs(self.high)) < FRAGILE * half


def _value(results: Results, experiment: str, arm: str, seed: int, metric: str) -> float | None:
    """One run's value of a key, or of the ratio "a/b" of two keys; None if the run or a value is missing."""
    record = results.get(RunKey(experiment, arm, seed=seed))
    run = {} if record is None else record.values
    numerator, _, denominator = metric.partition("/")
    a, b = run.get(numerator), run.get(denominator) if denominator else 1.0
    return None if a is None or b is None else a / b


def _delta(claim: Claim, experiment: str, seed: int, results: Results) -> float | None:
    arm = _value(results, experiment, claim.arm, seed, claim.metric)
    if claim.baseline is None:
        return None if arm is None else claim.scale * arm - claim.reference
    base = _value(results, experiment, claim.baseline, seed, claim.metric)
    if arm is None or base is None:
        return None
    return 100 * (arm / base - 1) if claim.relative else claim.scale * (arm - base)


def _seeds(results: Results, experiments: list[str]) -> list[int]:
    """Every seed index that appears in the runs of these experiments."""
    return sorted({key.seed for experiment in experiments for key in results.of(experiment)})


def paired_deltas(claim: Claim, results: Results) -> list[float]:
    """The per-seed Δs, pairing seeds by index; seeds where a needed value is missing or None are left out."""
    experiments = [claim.experiment, claim.contrast] if claim.contrast else [claim.experiment]
    deltas = []
    for seed in _seeds(results, experiments):
        per_experiment = [_delta(claim, experiment, seed, results) for experiment in experiments]
        if None not in per_experiment:
            deltas.append(per_experiment[0] - per_experiment[1] if claim.contrast else per_experiment[0])
    return deltas


def _rule(claim: Claim, low: float, high: float) -> tuple[str, str]:
    """The verdict for a 95% interval [low, high], exactly as RULES states it."""
    if claim.direction == "equal":
        m = claim.threshold
        if -m <= low and high <= m:
            return "agrees", f"the interval lies within ±{m:.3g}{claim.units}"
        if low > m or high < -m:
            return "opposite", f"the interval lies outside ±{m:.3g}{claim.units}"
        return "inconclusive", f"the interval overlaps ±{m:.3g}{claim.units}"
    side = -1 if claim.direction == "lower" else 1  # multiply by side: the claimed side of 0 is > 0
    if side * low > 0 and side * high > 0:
        target = claim.target
        if target is None or low <= target <= high:
            return "agrees", "the interval lies on the claimed side of 0" + ("" if target is None else
                                                                              " and contains the paper's effect")
        size = "smaller" if side * high < side * target else "larger"
        return (f"agrees in sign; {size} than the paper's", f"the interval lies on the claimed side of 0 and "
                f"{'below' if size == 'smaller' else 'above'} the paper's {target:+.3g}{claim.units} in size")
    if side * low < 0 and side * high < 0:
        return "opposite", "the interval lies on the other side of 0"
    if claim.target is not None and not low <= claim.target <= high:
        return "smaller than the paper's", "the interval contains 0 but excludes the paper's effect"
    return "inconclusive", "the interval contains 0" + ("" if claim.target is None else " and the paper's effect")


def judge(deltas: list[float], claim: Claim) -> Verdict:
    """The verdict of the Δs alone (the checks that need the results are made by `evaluate`)."""
    n, nan = len(deltas), float("nan")
    if n < 2:
        delta = deltas[0] if deltas else nan
        return Verdict(n, delta, nan, nan, "inconclusive", f"{n} seed(s) with values: no interval", nan, None)
    delta, half = mean_interval(deltas)
    sd = mean_std(deltas)[1]
    if sd == 0:  # a zero-width interval would claim a certainty, and zero power a sensitivity, that no seeds give
        reason = ("Δ is the same in every seed, so there is no spread to judge it by (a task at its floor or "
                  "ceiling, or a measure too coarse)")
        return Verdict(n, delta, delta, delta, "inconclusive", reason, nan, None)
    if n < MIN_SEEDS:  # nor is the seed count sized from a spread with n - 1 degrees of freedom
        return Verdict(n, delta, delta - half, delta + half, "inconclusive",
                       f"{n} seeds: a verdict needs {MIN_SEEDS}", nan, None)
    equivalence = claim.direction == "equal"
    target = claim.threshold if equivalence else claim.target
    needed = None if target is None else seeds_needed(sd, target, equivalence=equivalence)
    verdict, reason = _rule(claim, delta - half, delta + half)
    if equivalence:  # both one-sided tests must reject, each at 2.5%
        m = claim.threshold
        p = min(1.0, 2 * max(t_test_p(delta, sd, n, -m, 1), t_test_p(delta, sd, n, m, -1)))
    else:
        p = t_test_p(delta, sd, n)
    return Verdict(n, delta, delta - half, delta + half, verdict, reason,
                   detectable_effect(sd, n, equivalence=equivalence), needed, p)


def noted(claims: list[Claim], note: str) -> list[Claim]:
    """The claims with a note after each statement: the same claims tested again by another experiment read apart
    in its report."""
    return [replace(claim, statement=f"{claim.statement} ({note})") for claim in claims]


def evaluate(claims: list[Claim], results: Results) -> list[tuple[Claim, Verdict]]:
    """Each claim's verdict: the checks RULES lists before judging, then the rule on its interval, in our units
    (the same nats per character), with the verdict under the other transfer assumption beside it."""
    judged = []
    for claim in claims:
        verdict = _verdict(claim.in_our_units(), results)
        if claim.chars_per_token is not None and (exponent := claim.exponent(SAME_FRACTION, results)) is not None:
            other = claim.in_our_units(exponent)
            verdict = replace(verdict, other=(_verdict(other, results).verdict, _bar(other)))
        judged.append((claim, verdict))
    return judged


def _verdict(claim: Claim, results: Results) -> Verdict:
    """The verdict of a claim in our units."""
    verdict = judge(paired_deltas(claim, results), claim)
    if (reason := not_calibrated(claim, results)) is not None:  # whatever the claim's own seeds
        return replace(verdict, verdict="not calibrated", reason=reason)
    if verdict.n >= MIN_SEEDS:
        for check, word in ((uncalibrated, "inconclusive"), (untestable, "untestable here"),
                            (unmeasured, "inconclusive"), (not_engaged, "mechanism not engaged"),
                            (not_learned, "inconclusive")):
            if (reason := check(claim, results)) is not None:
                return replace(verdict, verdict=word, reason=reason)
    return verdict


def calibration_lines(claims: list[Claim], results: Results, planned=None) -> list[str]:
    """Markdown bullets, one per number of the paper's that a baseline must reproduce: ours against it, and where
    it missed with all its planned seeds (planned(experiment, arm) -> seeds), that nothing is compared with it."""
    failed = failed_calibrations(anchors_of(claims), results, planned) if planned else {}
    lines = []
    for anchor in anchors_of(claims):
        held, line = anchor.check(results)
        word = {True: "calibrated", False: "**not calibrated**", None: "not yet run"}[held]
        others = {key.arm for key in results.of(anchor.experiment, sweeps=True)} - {anchor.arm}
        after = "" if anchor.experiment not in failed else (
            "; the other arms trained before are shown, not judged" if others else "; its other arms are not trained")
        lines.append(f"- {word}: {line}{after}")
    return lines


def engagement_lines(claims: list[Claim], results: Results) -> list[str]:
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
        seeds = _seeds(results, [claim.experiment])
        moves = [(seed, move) for seed in seeds if (move := _ablation_move(claim, results, seed)) is not None]
        if not moves:
            missed = not_calibrated(claim, results)
            why = "not trained: the baseline is not calibrated" if missed else "not measured yet"
            lines.append(f"- {where}: {why}")
            continue
        per_seed = ", ".join(f"{_num(move, claim)} (seed {seed})" for seed, move in moves)
        floor = ""
        if (bar := _bar(claim)) is not None and _near_floor(claim, results, bar):
            mean = _arm_mean(results, claim.experiment, claim.arm, claim.metric)
            floor = (f" (it scores {claim.scale * mean:.3g}, too near 0 to fall by "
                     f"{abs(bar):g}: this cannot show whether it uses the component)")
        lines.append(f"- {where}: removing its own component at evaluation moves {claim.metric} by {per_seed}{floor}")
    return lines


def _arm_values(results: Results, experiment: str, arm: str, metric: str) -> list[float]:
    return [v for seed in _seeds(results, [experiment]) if (v := _value(results, experiment, arm, seed, metric))
            is not None]


def _arm_mean(results: Results, experiment: str, arm: str, metric: str) -> float | None:
    values = _arm_values(results, experiment, arm, metric)
    return sum(values) / len(values) if values else None


def uncalibrated(claim: Claim, results: Results) -> str | None:
    """Why it is not known yet whether the claim's baselines reproduce the paper's numbers (None if it is known)."""
    lines = [line for held, line in (anchor.check(results) for anchor in claim.calibration) if held is None]
    return f"the calibration is not measured yet: {'; '.join(lines)}" if lines else None


def not_calibrated(claim: Claim, results: Results) -> str | None:
    """Why a baseline of the claim does not reproduce the paper's absolute number (None if all do, or it has none)."""
    lines = [line for held, line in (anchor.check(results) for anchor in claim.calibration) if held is False]
    return f"the baseline is not the paper's: {'; '.join(lines)}" if lines else None


def anchors_of(claims: list[Claim]) -> list[Anchor]:
    """Every number of the paper's that a baseline of these claims must first reproduce, once each."""
    return list(dict.fromkeys(anchor for claim in claims for anchor in claim.calibration))


def failed_calibrations(anchors: list[Anchor], results: Results, planned) -> dict[str, str]:
    """experiment -> the calibration line of its baseline, for each experiment whose baseline has all its planned
    seeds (planned(experiment, arm) -> seeds) and misses the paper's number: a comparison with that baseline
    would not be the paper's, so its other arms are not trained."""
    failed = {}
    for anchor in anchors:
        held, line = anchor.check(results)
        measured = len(_arm_values(results, anchor.experiment, anchor.arm, anchor.metric))
        if held is False and measured >= planned(anchor.experiment, anchor.arm):
            failed[anchor.experiment] = line
    return failed


def untestable(claim: Claim, results: Results) -> str | None:
    """Why the metric cannot show the claim (None if it can): the arm and its baseline both sit at one of its
    bounds, within the paper's effect (an equal claim: the margin) of it, so that neither learned what separates
    them (both at chance, both at 0%) or both are at the ceiling, where they agree whatever their mechanisms; or
    the paper's effect would carry the arm past a bound from where the baseline is."""
    limits, bar = claim.limits, _bar(claim)
    if limits is None or bar is None or claim.baseline is None or claim.contrast or claim.relative:
        return None
    base = _arm_mean(results, claim.experiment, claim.baseline, claim.metric)
    arm = _arm_mean(results, claim.experiment, claim.arm, claim.metric)
    if base is None or arm is None:
        return None
    target = claim.target
    if claim.direction != "equal":  # (an equal claim's margin lies on both sides: there is room)
        room = claim.scale * ((limits[1] if target > 0 else limits[0]) - base)  # the most Δ can be on that side
        if abs(room) < abs(target):
            return (f"{claim.baseline} scores {claim.scale * base:.4g} and the metric stops at "
                    f"{claim.scale * limits[1 if target > 0 else 0]:g}, so no arm can show the paper's "
                    f"{_num(target, claim)}")
    for bound, name in zip(limits, ("floor", "ceiling"), strict=True):
        if all(abs(claim.scale * (value - bound)) <= abs(bar) for value in (arm, base)):
            size = _num(abs(bar), claim).lstrip("+")
            shown = f"parity within ±{size}" if claim.direction == "equal" else f"the paper's {_num(bar, claim)}"
            edge = "starts" if name == "floor" else "stops"
            return (f"{claim.arm} and {claim.baseline} both score within {size} of the metric's {name} "
                    f"({claim.scale * arm:.4g} and {claim.scale * base:.4g}; it {edge} at {claim.scale * bound:g}), "
                    f"so it cannot show {shown}")
    return None


def not_engaged(claim: Claim, results: Results) -> str | None:
    """Why the trained arm does not use its mechanism enough to show the paper's effect: removing the component
    at evaluation moves the metric by less than that effect (None if it moves it more, or was not measured). For
    an equal claim the bar is its margin: a component that moves the metric less would leave the arm without it
    at parity too, so parity would say nothing about the mechanism."""
    equal, bar = claim.direction == "equal", _bar(claim)
    if claim.ablation is None or bar is None:
        return None
    moves = _ablation_moves(claim, results)
    if not moves or _near_floor(claim, results, bar):
        return None
    # seed by seed: one seed's large move does not make a mechanism the other seeds leave unused engaged
    median = statistics.median(abs(move) for move in moves)
    if median >= abs(bar):
        return None
    than = f"the margin ±{_num(bar, claim).lstrip('+')}" if equal else f"the paper's {_num(bar, claim)}"
    per_seed = ", ".join(_num(move, claim) for move in moves)
    which = f"the median seed's {_num(median, claim).lstrip('+')}" if len(moves) > 1 else "that"
    return (f"removing {claim.arm}'s own component at evaluation moves {claim.metric} by {per_seed} "
            f"({len(moves)} seed{'s' if len(moves) > 1 else ''}): {which} is less than {than}")


def unmeasured(claim: Claim, results: Results) -> str | None:
    """Why it is unknown whether the arm uses its mechanism: the claim checks engagement and no seed has been
    measured with the component removed (None otherwise). `attnlab reproduce` measures it."""
    if claim.ablation is None or _bar(claim) is None or _ablation_moves(claim, results):
        return None
    return (f"{claim.arm} has not been measured with its own component removed, so whether it uses the mechanism "
            f"is unknown (`attnlab reproduce` measures it)")


def _ablation_moves(claim: Claim, results: Results) -> list[float]:
    """Each seed's move of the metric when the arm's own component is removed at evaluation, where measured."""
    return [move for seed in _seeds(results, [claim.experiment])
            if (move := _ablation_move(claim, results, seed)) is not None]


def _bar(claim: Claim) -> float | None:
    """The least move of the metric that removing the component must make: the paper's effect, or the margin."""
    return claim.threshold if claim.direction == "equal" else claim.target


def _near_floor(claim: Claim, results: Results, bar: float) -> bool:
    """Whether the arm's mean lies nearer its bounded metric's least value than `bar` (in the claim's units)."""
    mean = _arm_mean(results, claim.experiment, claim.arm, claim.metric)
    if claim.limits is None or claim.relative or mean is None:
        return False
    return claim.scale * (mean - claim.limits[0]) < abs(bar)


def _ablation_move(claim: Claim, results: Results, seed: int) -> float | None:
    intact = _value(results, claim.experiment, claim.arm, seed, claim.metric)
    ablated = _value(results, claim.experiment, claim.arm, seed, claim.ablation)
    if intact is None or ablated is None:
        return None
    return 100 * (ablated / intact - 1) if claim.relative else claim.scale * (ablated - intact)


def not_learned(claim: Claim, results: Results) -> str | None:
    """Why the claim's experiment tests nothing yet: its control arm's mean falls short (None if it does not)."""
    if claim.control is None:
        return None
    arm, metric, least = claim.control
    mean = _arm_mean(results, claim.experiment, arm, metric)
    if mean is None:
        return f"no {arm} run measured yet, which must first reach {least:g} in {metric}"
    if mean >= least:
        return None
    return f"{arm} reached {mean:.3g} in {metric}, short of {least:g}: the task is not learned, so it tests nothing yet"


def _num(x: float, claim: Claim) -> str:
    return f"{x:+.3g}{claim.units}"


def _what(claim: Claim) -> str:
    """What Δ is, in words: "Δ = hJ − softmax in val_ppl on lm"."""
    if claim.baseline is None:
        delta = claim.arm
    else:
        delta = f"{claim.arm} / {claim.baseline} − 1" if claim.relative else f"{claim.arm} − {claim.baseline}"
    if claim.scale != 1:
        delta = f"{claim.scale:g} × ({delta})"
    if claim.baseline is None and claim.reference:
        delta = f"{delta} − {claim.reference:g}"
    where = f"on {claim.experiment}" + (f" minus the same on {claim.contrast}" if claim.contrast else "")
    return f"Δ = {delta} in {claim.metric} {where}"


def _paper_cell(claim: Claim, v: Verdict) -> str:
    """The paper's effect (an equal claim: the margin, and the paper's own Δ) as the paper gives it and, for a
    per-token claim, per character under each transfer assumption."""
    equal = claim.direction == "equal"
    if claim.paper is None and not equal:
        return "–"
    number = (lambda x: f"±{_num(x, claim).lstrip('+')}") if equal else (lambda x: _num(x, claim))
    given = claim.margin if equal else claim.paper
    own = f" (the paper's Δ: {_num(claim.paper, claim)})" if equal and claim.paper is not None else ""
    if claim.chars_per_token is None:
        return ("within " if equal else "") + number(given) + own
    ours = claim.threshold if equal else claim.target
    cell = (f"{'within ' if equal else ''}{number(given)} per token{own} → **{number(ours)} per character** "
            f"({SAME_NATS}, {claim.chars_per_token:g} characters per token)")
    if v.other is not None:
        cell += f"; {number(v.other[1])} ({SAME_FRACTION})"
    return cell


def _scale_note(claim: Claim, results: Results) -> str:
    """" (the paper: 60M; here: 0.8M)" where the claim names the paper's model size."""
    if claim.paper_scale is None:
        return ""
    params = [r.params for r in results.of(claim.experiment, claim.arm, sweeps=True).values() if r.params is not None]
    here = f"{params[0] / 1e6:.2g}M" if params else "not run yet"
    return f" (the paper: {claim.paper_scale}; here: {here})"


def _power_cell(claim: Claim, v: Verdict) -> str:
    if v.n < 2:
        return "–"
    if v.n < MIN_SEEDS:
        return f"unknown: {v.n} seeds (the spread of {v.n} has {v.n - 1} degree of freedom)"
    if math.isnan(v.detectable):
        return f"unknown: no spread (n = {v.n})"
    if claim.largest is not None and v.detectable > claim.largest:  # not "detects ≥ 540" on a 100-point scale
        cell = f"no effect the metric can show (≥ {v.detectable:.2g} needed, n = {v.n})"
    else:
        cell = f"detects ≥ {v.detectable:.2g}{claim.units} (n = {v.n})"
    if v.seeds_needed is not None:
        target = "the margin" if claim.direction == "equal" else "the paper's effect"
        count = f"more than {MAX_SEEDS:,}" if v.seeds_needed > MAX_SEEDS else f"{v.seeds_needed:,}"
        cell += f"; {target} needs {count} seeds"
    return cell


def _ours_cell(claim: Claim, v: Verdict) -> str:
    if v.n == 0:
        return "no values"
    half = (v.high - v.low) / 2
    if not half > 0:  # one seed, or no spread
        return f"{_num(v.delta, claim)} ({v.n} seed{'s' if v.n > 1 else ''})"
    decimals = max(0, 1 - math.floor(math.log10(half)))  # two significant digits of the half-width

    def num(x: float) -> str:
        return f"{x:+,.{decimals}f}{claim.units}"

    return f"{num(v.delta)} [{num(v.low)}, {num(v.high)}]"


def verdict_table(claims: list[Claim], results: Results, planned_seeds=lambda claim: None,
                  caveats=lambda claim: []) -> list[str]:
    """Markdown lines: one row per claim with the paper's effect (and in our units), ours with its 95% interval,
    the verdict by RULES (interim while fewer seeds have values than `planned_seeds(claim)`, with `caveats(claim)`
    about the runs behind it: "*not converged*, ...") and the power of this run. Headline claims are in bold."""
    lines = ["| claim | paper | ours (Δ, 95% interval) | verdict | power |", "|---|---|---|---|---|"]
    judged = evaluate(claims, results)
    corrected = holm_corrected(judged)
    for i, (claim, v) in enumerate(judged):
        statement = f"**{claim.statement}**" if claim.headline else claim.statement
        planned = planned_seeds(claim)
        # a missed calibration is the baseline's, whose seeds the calibration lines give: nothing left to come
        judged = v.n and v.verdict != "not calibrated"
        marks = [f"*interim*, {v.n} of {planned} planned seeds"] if judged and planned and v.n < planned else []
        marks += caveats(claim) if judged else []
        if judged and v.verdict in CLEARED and i in corrected and corrected[i] >= ALPHA:
            marks.append(f"*not significant after Holm's correction* over the {len(corrected)} headline claims: "
                         f"adjusted p = {corrected[i]:.2g}")
        if judged and v.verdict in CLEARED and claim.direction != "equal" and v.fragile:
            marks.append(f"*fragile*: the interval clears 0 by {min(abs(v.low), abs(v.high)):.2g}, under a fifth of "
                         f"its half-width {(v.high - v.low) / 2:.2g}")
        if judged and v.other is not None:
            marks.append(f"*the transfer assumptions differ*: under {SAME_FRACTION}, **{v.other[0]}**"
                         if v.other[0] != v.verdict else "the same under both transfer assumptions")
        if claim.control_arm is not None:
            marks.append(f"{claim.arm} is a control: {claim.control_arm}, so it has no component of its own and "
                         f"no result of the mechanism's can fail this claim")
        family = f"{len(corrected)} headline{'s' if len(corrected) > 1 else ''}"
        ours = _ours_cell(claim, v) + (f"; p = {v.p:.2g}, Holm over {family}: {corrected[i]:.2g}" if i in corrected
                                       else "") + _tokens_cell(claim, v, results)
        cells = [f"{statement}{_scale_note(claim, results)} ({_what(claim)})", _paper_cell(claim, v), ours,
                 f"**{v.verdict}**{''.join(f' ({m})' for m in marks)}: {v.reason}", _power_cell(claim, v)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


BOOTSTRAP_DRAWS = 2000


def token_interval(claim: Claim, results: Results, draws: int = BOOTSTRAP_DRAWS) -> TokenInterval | None:
    """The 95% interval of a relative perplexity claim's mean Δ over the validation tokens alone: the same models,
    the split's blocks of windows (runner records val_blocks) resampled with replacement, the same draw for both
    arms and every seed (paired), over the paired seeds whose records keep their blocks (at least MIN_SEEDS).
    Beside the seed interval it says how much of the uncertainty is the validation sample's. None where the claim
    is not one of them; an interval of None where too few seeds keep blocks."""
    if claim.metric != "val_ppl" or not claim.relative or claim.contrast or claim.baseline is None:
        return None
    import numpy as np

    arms, bases, paired = [], [], 0
    for seed in _seeds(results, [claim.experiment]):
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


@dataclass(frozen=True)
class TokenInterval:
    interval: tuple[float, float] | None  # None: fewer than MIN_SEEDS seeds keep their blocks
    blocks: int
    seeds: int  # the paired seeds whose records keep their blocks
    paired: int  # the paired seeds in all


def _tokens_cell(claim: Claim, v: Verdict, results: Results) -> str:
    """The interval over the validation tokens alone, beside the seed interval (a headline's says where the
    records cannot give it)."""
    tokens = token_interval(claim, results) if v.n >= MIN_SEEDS else None
    if tokens is None or (tokens.interval is None and not claim.headline):
        return ""
    if tokens.interval is None:
        kept = f"{tokens.seeds} of {tokens.paired} seeds keep them, {MIN_SEEDS} needed" if tokens.seeds else \
            "these records keep no per-block losses"
        return f"; the validation tokens alone: not measured ({kept})"
    over = "" if tokens.seeds == tokens.paired else f" over the {tokens.seeds} of {tokens.paired} seeds that keep them"
    low, high = tokens.interval
    return f"; the validation tokens alone (a paired bootstrap of {tokens.blocks} blocks{over}): " \
           f"[{_num(low, claim)}, {_num(high, claim)}]"


def holm_corrected(judged: list[tuple[Claim, Verdict]]) -> dict[int, float]:
    """Index in `judged` -> the Holm-adjusted p-value, over the headline claims that have a test (a verdict from
    MIN_SEEDS seeds with a spread): judged one at a time, some headline of a suite would clear 0 by chance more
    often than 1 in 20."""
    tested = [i for i, (claim, v) in enumerate(judged) if claim.headline and v.n >= MIN_SEEDS and not math.isnan(v.p)]
    return dict(zip(tested, holm([judged[i][1].p for i in tested]), strict=True))


COLOURS = {"agrees": "tab:green", "agrees in sign; smaller than the paper's": "yellowgreen",
           "agrees in sign; larger than the paper's": "darkgreen", "opposite": "tab:red",
           "smaller than the paper's": "tab:orange",
           "inconclusive": "tab:gray", "untestable here": "tab:purple", "not calibrated": "tab:brown",
           "mechanism not engaged": "tab:olive"}


def _plot_row(ax, claim: Claim, v: Verdict) -> None:
    colour = COLOURS[v.verdict]
    ax.axvline(0, color="black", lw=0.8)
    if claim.direction == "equal":
        ax.axvspan(-claim.threshold, claim.threshold, color="tab:blue", alpha=0.12)
    if v.n >= 2:
        ax.errorbar(v.delta, 0, xerr=[[v.delta - v.low], [v.high - v.delta]], fmt="o", color=colour, capsize=4)
    elif v.n == 1:
        ax.plot(v.delta, 0, "o", color=colour, mfc="white")  # hollow: one seed, no interval
    if claim.target is not None:
        ax.plot(claim.target, 0.5, "D", color="black", mfc="none")  # just above ours, on the same Δ axis
    shown = [0.0, *([claim.target] if claim.target is not None else []),
             *([-claim.threshold, claim.threshold] if claim.direction == "equal" else []),
             *[x for x in (v.low, v.high, v.delta) if not math.isnan(x)]]
    pad = 0.15 * (max(shown) - min(shown)) or 1.0
    ax.set(xlim=(min(shown) - pad, max(shown) + pad), ylim=(-0.8, 1.1), yticks=[])
    ax.tick_params(axis="x", labelsize=7)
    if claim.relative:
        ax.xaxis.set_major_formatter(lambda x, _: f"{x:g}%".replace("-", "−"))
    ax.set_ylabel(textwrap.fill(claim.statement, 40), rotation=0, ha="right", va="center", fontsize=8,
                  fontweight="bold" if claim.headline else "normal")
    ax.text(1.01, 0.5, v.verdict, transform=ax.transAxes, color=colour, fontsize=8, va="center")


def plot_claims(claims: list[Claim], results: Results, path: str | Path) -> Path:
    """One row per claim, each with its own Δ axis since claims come in different units (%, perplexity,
    percentage points): the mean Δ with its 95% interval, 0, the paper's effect and, for equal claims, the
    ±margin band, coloured by verdict. Headline claims are labelled in bold."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    judged = evaluate(claims, results)
    from ..plots import new_figure, save_figure  # matplotlib, only when a report draws

    fig, axes = new_figure(len(judged), 1, figsize=(9, 0.4 + 0.75 * len(judged)), squeeze=False)
    for ax, (claim, v) in zip(axes[:, 0], judged, strict=True):
        _plot_row(ax, claim, v)
    legend = [Line2D([], [], marker="o", color="gray", label="ours: Δ, 95% interval"),
              Line2D([], [], marker="D", color="black", mfc="none", ls="none", label="paper (our units)"),
              Patch(color="tab:blue", alpha=0.12, label="±margin"),
              *[Patch(color=c, label=verdict) for verdict, c in COLOURS.items()]]
    fig.legend(handles=legend, loc="upper center", ncol=len(legend), fontsize=7, frameon=False)
    # leave the top for the legend
    return save_figure(fig, Path(path), dpi=110, rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))
