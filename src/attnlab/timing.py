"""Timing callables: seconds with the GPU's queued work included, round-robin medians and paired ratios."""

from __future__ import annotations

import statistics
import time

import torch


def synchronize() -> None:
    """Wait for the GPU's queued work (a no-op without CUDA): a timer must stop when the work is done, not
    when it was launched."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(fn) -> float:
    """Seconds one call of fn takes, queued GPU work included."""
    synchronize()
    start = time.perf_counter()
    fn()
    synchronize()
    return time.perf_counter() - start


def round_robin(tasks: dict, repeats: int, warmup: bool = True) -> dict:
    """Median seconds of each zero-argument callable, after one warm-up call each (unless warmup is false).
    Contenders take turns, so drift in the machine's speed hits all of them alike."""
    return {name: statistics.median(ts) for name, ts in round_robin_times(tasks, repeats, warmup).items()}


def round_robin_times(tasks: dict, repeats: int, warmup: bool = True) -> dict[str, list[float]]:
    """Seconds of each callable in each of `repeats` rounds (after one warm-up call each, unless warmup is false):
    round r of every contender ran back to back, so ratios within a round share the machine's state."""
    if warmup:
        for fn in tasks.values():
            fn()
    times = {name: [] for name in tasks}
    for _ in range(repeats):
        for name, fn in tasks.items():
            times[name].append(timed(fn))
    return times


def paired_ratio(times: dict[str, list[float]], numerator: str, denominator: str) -> float:
    """The median over rounds of numerator's time over denominator's in the same round: steadier than the
    ratio of medians when the machine's speed drifts between rounds."""
    return statistics.median(a / b for a, b in zip(times[numerator], times[denominator], strict=True))
