"""Measuring instruments: round-robin medians, the machine's matmul peak, FLOPs and activation memory."""

from __future__ import annotations

import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode


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


def round_robin(tasks: dict, repeats: int) -> dict:
    """Median seconds of each zero-argument callable, after one warm-up call each. Contenders take turns,
    so drift in the machine's speed hits all of them alike."""
    for fn in tasks.values():
        fn()
    times = {name: [] for name in tasks}
    for _ in range(repeats):
        for name, fn in tasks.items():
            times[name].append(timed(fn))
    return {name: statistics.median(ts) for name, ts in times.items()}


def matmul_peak_gflops(size: int = 1024, repeats: int = 10) -> float:
    """The best fp32 GFLOP/s of a square matrix product: what this machine's BLAS reaches at its best."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = min(timed(lambda: a @ b) for _ in range(repeats))
    return 2 * size**3 / best / 1e9


def count_flops(fn) -> int:
    """Floating-point operations of the matrix products (mm, bmm, einsum, attention, conv) fn runs."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def saved_bytes(fn) -> int:
    """Bytes of the tensors autograd keeps for the backward pass while fn runs (each storage once): the
    activation memory of training."""
    storages = {}

    def pack(t):
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())
