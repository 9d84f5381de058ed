"""Summaries over seeds: mean and standard deviation, and paired differences with a t-based 95% interval."""

from __future__ import annotations

import math

# two-sided 95% critical values of Student's t for 1..10 degrees of freedom (above 10: 2.228 is used,
# which is conservative there; 1.96 is the normal limit)
T_95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228]


def mean_std(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else float("nan")
    return mean, std


def paired_difference(values: list[float], baseline: list[float]) -> tuple[float, float]:
    """Mean of the per-seed differences and the half-width of its 95% interval (nan for one seed)."""
    diffs = [a - b for a, b in zip(values, baseline, strict=True)]
    mean, std = mean_std(diffs)
    n = len(diffs)
    if n < 2:
        return mean, float("nan")
    return mean, T_95[min(n - 1, len(T_95)) - 1] * std / math.sqrt(n)
