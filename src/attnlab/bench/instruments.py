"""Measuring instruments: the machine's matmul peak, FLOPs and activation memory (the timers are attnlab.timing)."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from ..timing import timed

PEAK_SIZES = (256, 512, 1024, 2048)


def matmul_gflops(size: int, dtype: torch.dtype, seconds: float = 0.1) -> float:
    """The best GFLOP/s of a square product of this size and dtype, over repeats that fill about `seconds`
    (at least three, after a warm-up)."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    first = timed(lambda: a @ b)
    best = min(timed(lambda: a @ b) for _ in range(max(3, int(seconds / first))))
    return 2 * size**3 / best / 1e9


def matmul_peak(dtypes=(torch.float32,), sizes=PEAK_SIZES) -> dict:
    """The machine's matmul peak, measured now: the best GFLOP/s over square products of every size and dtype.
    No one size is best everywhere (small products run from cache, large ones amortise the BLAS's set-up),
    and bf16 can run several times faster than fp32 (AMX, tensor cores), so each dtype a run measures counts.
    Returns {"gflops", "dtype", "size"} of the best and "measured": {"<dtype> <size>": GFLOP/s}."""
    measured = {(str(dtype).removeprefix("torch."), n): matmul_gflops(n, dtype) for dtype in dtypes for n in sizes}
    (dtype, size), gflops = max(measured.items(), key=lambda item: item[1])
    return {"gflops": gflops, "dtype": dtype, "size": size,
            "measured": {f"{d} {n}": g for (d, n), g in measured.items()}}


def peak_share(gflops: float, peak: float) -> float | None:
    """gflops as a share of the peak; None (to be flagged) above it. The peak is the best the BLAS does on
    products built to be fast, so a figure above it means its FLOP count or its timing is wrong, and raising
    the peak to it would spread that error over every share."""
    return gflops / peak if gflops <= peak else None


def causal_pairs(queries: int, keys: int) -> int:
    """(query, key) pairs a top-left causal mask keeps, SDPA's is_causal: query i sees keys 0..i."""
    if queries <= keys:
        return queries * (queries + 1) // 2
    return keys * (keys + 1) // 2 + (queries - keys) * keys


def _attention_formula(causal_at: int, backward: bool):
    """A FLOP formula for an SDPA kernel whose is_causal is argument `causal_at`: torch counts every (query,
    key) pair (and nothing at all for the CPU kernels), but a causal kernel skips the masked ones."""

    def formula(*args, out_shape=None, **kwargs) -> int:
        shapes = args[:4] if backward else args[:3]
        full = sdpa_backward_flop_count(*shapes) if backward else sdpa_flop_count(*shapes)
        causal = args[causal_at] if len(args) > causal_at else kwargs.get("is_causal", False)
        if not causal:
            return full
        queries, keys = shapes[-3][-2], shapes[-2][-2]
        return full * causal_pairs(queries, keys) // (queries * keys)

    return formula


aten = torch.ops.aten
ATTENTION_FLOPS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _attention_formula(4, backward=False),
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _attention_formula(7, backward=True),
    aten._scaled_dot_product_flash_attention: _attention_formula(4, backward=False),
    aten._scaled_dot_product_flash_attention_backward: _attention_formula(11, backward=True),
    aten._scaled_dot_product_efficient_attention: _attention_formula(6, backward=False),
    aten._scaled_dot_product_efficient_attention_backward: _attention_formula(11, backward=True),
    aten._scaled_dot_product_cudnn_attention: _attention_formula(6, backward=False),
    aten._scaled_dot_product_cudnn_attention_backward: _attention_formula(14, backward=True),
}


def count_flops(fn) -> int:
    """Floating-point operations of the matrix products (mm, bmm, einsum, attention, conv) fn runs; causal
    attention counts only the pairs its mask keeps."""
    with FlopCounterMode(display=False, custom_mapping=ATTENTION_FLOPS) as counter:
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
