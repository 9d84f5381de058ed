"""Summaries over seeds: mean and standard deviation, t-based 95% intervals, and the power of a paired t-test."""

from __future__ import annotations

import math

MAX_SEEDS = 10_000  # seeds_needed searches no further; MAX_SEEDS + 1 stands for "more than MAX_SEEDS"


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with df degrees of freedom."""
    from scipy.stats import t as student_t  # scipy when a number is computed: declaring suites stays light

    return float(student_t.ppf(p, df))


def mean_std(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else float("nan")
    return mean, std


def mean_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its two-sided t-interval: t_{(1+level)/2, n-1} · sd / √n (nan for one value)."""
    mean, std = mean_std(values)
    n = len(values)
    if n < 2:
        return mean, float("nan")
    return mean, t_quantile((1 + level) / 2, n - 1) * std / math.sqrt(n)


def paired_difference(values: list[float], baseline: list[float]) -> tuple[float, float]:
    """Mean of the per-seed differences and the half-width of its 95% interval (nan for one seed)."""
    return mean_interval([a - b for a, b in zip(values, baseline, strict=True)])


def detectable_effect(sd: float, n: int, power: float = 0.80, equivalence: bool = False) -> float:
    """The smallest |effect| δ that a two-sided paired t-test at α = 0.05 on n seeds finds with the given power,
    when the differences have standard deviation sd: the t statistic is then noncentral t with n - 1 degrees
    of freedom and noncentrality δ√n / sd, and P(|T| > t_{0.975,n-1}) = power is solved for δ.

    equivalence=True: the smallest margin m for which, when the true effect is 0, the 95% interval lies within
    ±m with the given power. The interval's centre must then stay within m - half-width on both sides, so the
    power quantile is two-sided: (t_{0.975,n-1} + t_{(1+power)/2,n-1}) · sd / √n."""
    if n < 2 or not sd >= 0:
        return float("nan")
    critical, df = t_quantile(0.975, n - 1), n - 1
    if equivalence:
        return (critical + t_quantile((1 + power) / 2, df)) * sd / math.sqrt(n)
    if sd == 0:
        return 0.0
    from scipy.optimize import brentq
    from scipy.stats import nct as noncentral_t

    def power_at(effect: float) -> float:
        shift = effect * math.sqrt(n) / sd
        wrong_side = float(noncentral_t.sf(critical, df, -shift))  # P(T < -critical), negligible far out
        return float(noncentral_t.sf(critical, df, shift)) + (0.0 if math.isnan(wrong_side) else wrong_side)

    guess = (critical + t_quantile(power, df)) * sd / math.sqrt(n)  # the normal approximation, a little low
    return brentq(lambda effect: power_at(effect) - power, 0.0, 4 * guess)


def seeds_needed(sd: float, effect: float, power: float = 0.80, equivalence: bool = False) -> int | None:
    """The smallest n >= 2 with detectable_effect(sd, n) <= |effect|; MAX_SEEDS + 1 if even MAX_SEEDS seeds are too
    few; None where sd is 0 or undefined (nothing to extrapolate from)."""
    if not sd > 0:  # also catches nan
        return None

    def enough(n: int) -> bool:
        return detectable_effect(sd, n, power, equivalence) <= abs(effect)

    if not enough(MAX_SEEDS):
        return MAX_SEEDS + 1
    low, high = 1, MAX_SEEDS  # detectable_effect falls with n: bisect for the first n that is enough
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def t_test_p(mean: float, sd: float, n: int, null: float = 0.0, side: int = 0) -> float:
    """The p-value of a t-test that the mean of n values (standard deviation sd) is `null`: two-sided (side 0), or
    one-sided against the alternative mean > null (side 1) or mean < null (side -1); nan under 2 values or no spread."""
    if n < 2 or not sd > 0:
        return float("nan")
    from scipy.stats import t as student_t

    t = (mean - null) / (sd / math.sqrt(n))
    if side == 0:
        return float(2 * student_t.sf(abs(t), n - 1))
    return float(student_t.sf(side * t, n - 1))


SIGN_FLIP_MOST = 20  # seeds up to which the sign-flip test enumerates every one of its 2^n assignments


def sign_flip_p(deltas: list[float]) -> float:
    """The exact two-sided sign-flip (paired permutation) p-value that the mean Δ is 0: the share of the 2^n ways
    of flipping the Δs' signs whose |mean| is at least the observed one. It assumes no normality, and cannot go
    below 2 / 2^n (fewest_seeds says how many seeds reach a level); nan under 2 values or past SIGN_FLIP_MOST."""
    n = len(deltas)
    if n < 2 or n > SIGN_FLIP_MOST:
        return float("nan")
    import numpy as np  # when a test is computed: importing the report stays light

    signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)  # [2^n, n]: every assignment of ±1
    means = np.abs(signs @ np.asarray(deltas, dtype=float)) / n
    observed = abs(sum(deltas)) / n
    return float(np.mean(means >= observed - 1e-12 * max(1.0, observed)))


def fewest_seeds(alpha: float) -> int:
    """The fewest seeds whose sign-flip test can give p < alpha: its least p is 2 / 2^n."""
    return next(n for n in range(2, 64) if 2.0 / 2**n < alpha)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of m p-values, in their order: the i-th smallest is multiplied by m - i + 1,
    capped at 1 and never below the adjusted p-value before it. A family rejected where adjusted p < α keeps the
    chance of any false rejection under α."""
    order = sorted(range(len(p_values)), key=p_values.__getitem__)
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
