"""Helpers shared by the chunkwise forms: padding to whole chunks and splitting time into chunks."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..nn import no_autocast


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """States and decay sums are accumulated in at least fp32 (fp64 stays fp64)."""
    return torch.promote_types(x.dtype, torch.float32)


def autocast_off(op):
    """Run op with autocast disabled on its inputs' device. The op casts its inputs to `compute_dtype`
    itself; without this, autocast would still run its products in bf16 and round the states, decay sums
    and statistics they produce."""

    @functools.wraps(op)
    def run(*args, **kwargs):
        with no_autocast(args[0].device):
            return op(*args, **kwargs)

    return run


def pad_time(x: torch.Tensor, length: int, dim: int = 2) -> torch.Tensor:
    """Zero-pad dimension `dim` (time) of x up to `length`."""
    missing = length - x.shape[dim]
    if missing == 0:
        return x
    pad = [0, 0] * (x.ndim - 1 - dim) + [0, missing]
    return F.pad(x, pad)


def to_chunks(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """[B, H, T, ...] with T a multiple of chunk -> [B, H, T/chunk, chunk, ...]."""
    B, H, T = x.shape[:3]
    return x.reshape(B, H, T // chunk, chunk, *x.shape[3:])


def causal_mask(size: int, device) -> torch.Tensor:
    """Boolean lower-triangular [size, size] mask: True where key j <= query i."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


def decay_matrix(b: torch.Tensor) -> torch.Tensor:
    """Gamma_ij = exp(b_i - b_j) for j <= i, else 0, from cumulative log-decays b [..., C].

    The exponent is masked before exp, so no overflow however strong the decay.
    """
    C = b.shape[-1]
    mask = causal_mask(C, b.device)
    return (b[..., :, None] - b[..., None, :]).masked_fill(~mask, float("-inf")).exp()
