"""The paper's claims as data, and the fixed rules (RULES) that judge their per-seed differences.

A claim's Δ per seed, its 95% t-interval, the verdict the interval gives and the seeds the paper's effect would
need; verdicts.py makes the checks RULES lists before judging, verdict_table.py and claim_plots.py show them."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .stats import (
    detectable_effect,
    fewest_seeds,
    holm,
    mean_interval,
    mean_std,
    seeds_needed,
    sign_flip_p,
    t_test_p,
)
from .store import Results, RunKey

DIRECTIONS = ("lower", "higher", "equal")

MIN_SEEDS = 3  # a directional verdict needs this many seeds: with 2 the spread has one degree of freedom
FRAGILE = 0.2  # an interval that clears 0 by less than this fraction of its half-width is marked fragile
ALPHA = 0.05  # the level of the tests behind the 95% intervals, and of Holm's correction over a suite's claims
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
  arm and its baseline both score no more than the bar above the task's chance floor, or both within the bar of
  100%. The bar is the paper's effect (an equal claim: its margin), or where the paper gives none the smallest
  effect these seeds detect (Power, below). The chance floor is what a model scores without learning the task,
  declared by the task for each test: on MQAR, copying a value from the context (1/P with P pairs, and pooled over
  slices as the accuracy pools them: 3/7 over 1, 2 and 4 pairs), on a word problem guessing an element of the group
  (parity 50%), on multikey S-NIAH answering one of its needles; 0% where a task declares none. At the floor
  neither arm learned what would separate them; at 100% they agree whatever their mechanisms. The row names the
  floor;
- *inconclusive* if the claim checks engagement (below) and the arm has not been measured with its component
  removed, with or without a paper's effect: whether the trained model uses its mechanism is unknown;
- *mechanism not engaged* if removing the mechanism's own component at evaluation (its couplings, its step, its
  correction, its query path) moves the metric by less than the paper's effect (an equal claim: less than its
  margin, so the arm without the component would be at parity too) in the median seed: the trained model does not
  use it enough to show it (one seed's large move does not make it engaged while the others' are small). Not
  where the arm scores so near the task's chance floor (or an accuracy's 0) that no removal could lower it that far:
  a model that has not learned the task cannot show how it uses the component;
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

**Another protocol.** A claim whose arms a second experiment trains under another protocol (a longer patience) is
judged there too, by the same rules and anchors; the row gives both intervals and words, and marks *the protocol
decides* where the words differ.

**Interim.** A verdict read while fewer seeds have values than the tier plans is marked *interim, n of N planned
seeds*: the tier fixes its seed count before the runs, and a verdict read as they come in may still change (adding
seeds until an interval leaves 0 would overstate it).

**Stopped at the cap, not converged; sweep going on.** A verdict whose runs (the claim's arm and baseline) stop
early, but of which some ended at their step cap instead, is marked *stopped at the cap, k of n runs at their cap,
where their cosine schedule ends* for runs under the cosine schedule, whose rate falls until the cap, and the loss
with it, so that patience seldom runs out first: those models were trained to the cap, not shown to be converged,
and a longer cap may change the verdict. Under the wsd schedule, where patience starts the decay and ends a run
before its cap, such runs are marked *not converged, k of n runs at their cap*: they were still improving. One
whose arm or baseline trains at the best rate so far of a sweep still under way (its best rate lay at an edge, and
the rate beyond it has not run yet) is marked *sweep going on*.

**Multiplicity and fragility.** Each row with a test gives the p-value behind its interval (that Δ = 0; for an
equal claim, that |Δ| exceeds the margin, by two one-sided tests) and the same p-value after Holm's correction over
every claim of the suite that has one (from {MIN_SEEDS} seeds, with a spread); a verdict that cleared 0 (or the
margin) is marked *not significant after Holm's correction* where the adjusted p-value is {ALPHA:g} or more. Beside
a directional headline's t-interval, the exact sign-flip p-value (the share of the 2^n ways of flipping the seeds'
Δs whose mean is as far from 0), which assumes no normality: with n seeds it cannot go below 2 / 2^n, so a row
with fewer than {fewest_seeds(ALPHA)} seeds is marked *few seeds*, since no result of theirs could reach {ALPHA:g} by
it. An interval that clears 0 by less than {FRAGILE:g} of its half-width is marked *fragile*: a seed more or less
could move it across.

**Power.** "Detects ≥ d" is the smallest |effect| that a paired t-test on these seeds finds with 80% power at
two-sided α = 0.05, from the observed standard deviation s of the Δs (exact, from the noncentral t distribution
with n − 1 degrees of freedom and noncentrality d·√n / s; about (t₀.₉₇₅,ₙ₋₁ + t₀.₈₀,ₙ₋₁) · s / √n), given from
{MIN_SEEDS} seeds on. For equal claims it is the smallest margin whose interval would lie within ±margin with 80% power
when the true Δ is 0: d = (t₀.₉₇₅,ₙ₋₁ + t₀.₉₀,ₙ₋₁) · s / √n. "Needs N seeds" is the smallest n whose d at the same s is
at most the paper's |effect| (the margin for equal claims).
"""

VERDICTS = ("agrees", "agrees in sign; smaller than the paper's", "agrees in sign; larger than the paper's", "opposite",
            "smaller than the paper's", "inconclusive", "untestable here", "not calibrated", "mechanism not engaged",
            "not run yet")


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
class Ratio:
    """A metric that is the per-run ratio of two results keys: Ratio("ppl@448", "ppl@128") is a growth factor."""

    numerator: str
    denominator: str

    def __post_init__(self):
        if not (self.numerator and self.denominator):
            raise ValueError(f"a ratio needs two results keys, not {self.numerator!r} and {self.denominator!r}")

    def __str__(self) -> str:
        return f"{self.numerator}/{self.denominator}"  # how a report names it: "ppl@448/ppl@128"

    def of(self, run: dict) -> float | None:
        """The ratio in one run's values; None where either key is missing."""
        a, b = run.get(self.numerator), run.get(self.denominator)
        return None if a is None or b is None else a / b


def _check_metric(metric: str | Ratio, owner: str) -> None:
    """A ratio of two keys is declared as a Ratio: a key spelled "a/b" would name no results key and read nothing."""
    if isinstance(metric, str) and "/" in metric:
        numerator, _, denominator = metric.partition("/")
        raise ValueError(f"{owner}: a ratio of two keys is Ratio({numerator!r}, {denominator!r}), not {metric!r}")


@dataclass(frozen=True)
class Anchor:
    """An absolute number of the paper's that a tier running the paper's protocol must reproduce before it
    compares anything: the mean of `arm`'s `metric` on `experiment` (times scale) within paper ± tolerance."""

    experiment: str
    arm: str
    metric: str | Ratio
    paper: float
    tolerance: float
    scale: float = 1.0
    basis: str = ""  # where the tolerance comes from ("two of the paper's standard deviations of 0.019")

    def __post_init__(self):
        _check_metric(self.metric, f"the anchor of {self.arm} on {self.experiment}")

    def check(self, results: Results) -> tuple[bool | None, str]:
        """(whether it holds, None without values; the calibration line)."""
        values = arm_values(results, self.experiment, self.arm, self.metric)
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
    metric: str | Ratio  # a results key ("val_ppl"), or the per-run ratio of two (Ratio("ppl@448", "ppl@128"))
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
    # a claim on growth factors ppl@long / ppl@short (a Ratio metric): the paper's arm's and baseline's, per token
    paper_growths: tuple[float, float] | None = None
    paper_scale: str | None = None  # the paper's model size ("60M"), shown beside ours
    # the paper's numbers that the baselines must first reproduce: the claim's experiment's, and its contrast's
    calibration: tuple[Anchor, ...] = ()
    bounds: tuple[float, float] | None = None  # the least and most the metric can be (accuracies: 0 and 1)
    ablation: str | None = None  # the results key of the metric with the mechanism's component removed
    # why the arm has no learned component of its own ("as specified, it attends uniformly"): it is a control, and
    # its claim tests the baseline against it, not a mechanism (no result of the mechanism's can fail it)
    control_arm: str | None = None
    # an experiment that trains the same arms under another protocol (a longer patience): the row shows the claim's
    # verdict there too, calibrated by the same anchors moved to it, and says where the two words differ
    rerun: str | None = None

    def __post_init__(self):
        _check_metric(self.metric, repr(self.statement))
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

    def signed(self, x: float) -> str:
        """x as reports show a Δ in the claim's units: its sign, three significant digits ("+1.2%")."""
        return f"{x:+.3g}{self.units}"

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
        # a growth factor's denominator is the perplexity at the training length
        key = self.metric.denominator if isinstance(self.metric, Ratio) else self.metric
        ours = arm_mean(results, self.experiment, self.baseline, key) if self.paper_ppl else None
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
class TokenInterval:
    """What token_interval found: the interval, and the blocks and seeds it resampled."""

    interval: tuple[float, float] | None  # None: fewer than MIN_SEEDS seeds keep their blocks
    blocks: int
    seeds: int  # the paired seeds whose records keep their blocks
    paired: int  # the paired seeds in all


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
    # a directional claim's exact sign-flip p-value that Δ = 0 (no normality assumed; nan: an equal claim, under 2
    # seeds): with n seeds it cannot go below 2 / 2^n, so under stats.fewest_seeds(ALPHA) seeds it cannot reach ALPHA
    sign_flip: float = float("nan")
    tokens: TokenInterval | None = None  # a relative perplexity claim's interval over the validation tokens alone
    params: int | None = None  # the size of the claim's arm here, beside the paper's (Claim.paper_scale)
    rerun: Verdict | None = None  # the claim's verdict on its rerun experiment (Claim.rerun)

    @property
    def fragile(self) -> bool:
        """Whether the interval clears 0, but by less than a fifth of its half-width."""
        half = (self.high - self.low) / 2
        return self.low * self.high > 0 and min(abs(self.low), abs(self.high)) < FRAGILE * half


def value_of(results: Results, experiment: str, arm: str, seed: int, metric: str | Ratio) -> float | None:
    """One run's value of a key, or of a Ratio of two keys; None if the run or a value is missing."""
    record = results.get(RunKey(experiment, arm, seed=seed))
    run = {} if record is None else record.values
    if isinstance(metric, Ratio):
        return metric.of(run)
    value = run.get(metric)
    return None if value is None else float(value)


def seeds_of(results: Results, experiments: list[str]) -> list[int]:
    """Every seed index that appears in the runs of these experiments."""
    return sorted({key.seed for experiment in experiments for key in results.of(experiment)})


def arm_values(results: Results, experiment: str, arm: str, metric: str | Ratio) -> list[float]:
    """The arm's value of the metric in each seed that has one, in seed order."""
    return [v for seed in seeds_of(results, [experiment]) if (v := value_of(results, experiment, arm, seed, metric))
            is not None]


def arm_mean(results: Results, experiment: str, arm: str, metric: str | Ratio) -> float | None:
    values = arm_values(results, experiment, arm, metric)
    return sum(values) / len(values) if values else None


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
        measured = len(arm_values(results, anchor.experiment, anchor.arm, anchor.metric))
        if held is False and measured >= planned(anchor.experiment, anchor.arm):
            failed[anchor.experiment] = line
    return failed


def _delta(claim: Claim, experiment: str, seed: int, results: Results) -> float | None:
    arm = value_of(results, experiment, claim.arm, seed, claim.metric)
    if claim.baseline is None:
        return None if arm is None else claim.scale * arm - claim.reference
    base = value_of(results, experiment, claim.baseline, seed, claim.metric)
    if arm is None or base is None:
        return None
    return 100 * (arm / base - 1) if claim.relative else claim.scale * (arm - base)


def paired_deltas(claim: Claim, results: Results) -> list[float]:
    """The per-seed Δs, pairing seeds by index; seeds where a needed value is missing or None are left out."""
    experiments = [claim.experiment, claim.contrast] if claim.contrast else [claim.experiment]
    deltas = []
    for seed in seeds_of(results, experiments):
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
    """The verdict of the Δs alone (verdicts.evaluate makes the checks that need the results first)."""
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
                   detectable_effect(sd, n, equivalence=equivalence), needed, p,
                   sign_flip=float("nan") if equivalence else sign_flip_p(deltas))


def rerun_of(claim: Claim) -> Claim:
    """The claim on its rerun experiment: its anchors on the claim's experiment moved there with it."""
    moved = tuple(replace(a, experiment=claim.rerun) if a.experiment == claim.experiment else a
                  for a in claim.calibration)
    return replace(claim, experiment=claim.rerun, rerun=None, calibration=moved)


def noted(claims: list[Claim], note: str) -> list[Claim]:
    """The claims with a note after each statement: the same claims tested again by another experiment read apart
    in its report."""
    return [replace(claim, statement=f"{claim.statement} ({note})") for claim in claims]


def holm_corrected(judged: list[tuple[Claim, Verdict]]) -> dict[int, float]:
    """Index in `judged` -> the Holm-adjusted p-value, over every claim of the suite that has a test (a verdict from
    MIN_SEEDS seeds with a spread): judged one at a time, some claim of a suite would clear 0 by chance more often
    than 1 in 20."""
    tested = [i for i, (_, v) in enumerate(judged) if v.n >= MIN_SEEDS and not math.isnan(v.p)]
    return dict(zip(tested, holm([judged[i][1].p for i in tested]), strict=True))
