"""Helpers shared by the chunkwise forms: casting inputs, padding to whole chunks and splitting time into chunks."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..nn import at_least_fp32, causal_mask, no_autocast


def autocast_off(op):
    """Run op with autocast disabled on its inputs' device, so that the op alone chooses the precision of its
    products: the recurrent ops cast their inputs to `at_least_fp32` (autocast would otherwise run their
    products in bf16 and round the states, decay sums and statistics they produce); others compute in their
    inputs' dtype."""

    @functools.wraps(op)
    def run(*args, **kwargs):
        with no_autocast(args[0].device):
            return op(*args, **kwargs)

    return run


def prepare_memory_inputs(q, k, v, *gates, scale=None, state=None):
    """The inputs of a linear-attention recurrence in q's compute dtype (`at_least_fp32`): (q * scale, k, v,
    *gates, state). q, k [..., D_k], v [..., D_v] with leading [B, H]; scale defaults to D_k^-1/2; a missing
    state is zeros [B, H, D_k, D_v]."""
    q = at_least_fp32(q)
    dtype = q.dtype
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if state is None:
        state = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
    return q * scale, k.to(dtype), v.to(dtype), *(x.to(dtype) for x in gates), state.to(dtype)


def pad_time(x: torch.Tensor, length: int, dim: int = 2) -> torch.Tensor:
    """Zero-pad dimension `dim` (time) of x up to `length`."""
    missing = length - x.shape[dim]
    if missing == 0:
        return x
    pad = [0, 0] * (x.ndim - 1 - dim) + [0, missing]
    return F.pad(x, pad)


def chunk_layout(length: int, chunk_size: int) -> tuple[int, int]:
    """(C, padded) for a time axis of `length`: the chunk length (chunk_size, or the whole sequence when it is
    shorter; at least 1) and the length rounded up to whole chunks."""
    C = min(chunk_size, max(length, 1))
    return C, -(-length // C) * C


def to_chunks(x: torch.Tensor, chunk: int, padded: int) -> torch.Tensor:
    """[B, H, T, ...] zero-padded in time to `padded` (a multiple of chunk) -> [B, H, padded/chunk, chunk, ...]."""
    x = pad_time(x, padded)
    return x.reshape(*x.shape[:2], padded // chunk, chunk, *x.shape[3:])


def decay_matrix(b: torch.Tensor) -> torch.Tensor:
    """Gamma_ij = exp(b_i - b_j) for j <= i, else 0, from cumulative log-decays b [..., C].

    The exponent is masked before exp, so no overflow however strong the decay.
    """
    C = b.shape[-1]
    mask = causal_mask(C, C, b.device)
    return (b[..., :, None] - b[..., None, :]).masked_fill(~mask, float("-inf")).exp()


class SequenceStarts:
    """The state scan over chunks of packed sequences that each begin at a chunk (B = 1): the state entering a
    chunk that begins a sequence is zeros, and the states kept are each sequence's last, stacked on dim 0.
    starts: bool [N_chunks], True at the chunks that begin a sequence; None: one sequence per row, as usual."""

    def __init__(self, starts: torch.Tensor | None, h: torch.Tensor):
        if starts is not None and h.shape[0] != 1:
            raise ValueError(f"packed sequences come in one row; got a batch of {h.shape[0]}")
        self.starts = None if starts is None else starts.tolist()
        self.ends: list[torch.Tensor] = []

    def entering(self, n: int, h: torch.Tensor) -> torch.Tensor:
        """The state that enters chunk n, given the state the chunk before it left."""
        if self.starts is None or not self.starts[n]:
            return h
        if n:
            self.ends.append(h)
        return torch.zeros_like(h)

    def final(self, h: torch.Tensor) -> torch.Tensor:
        """The state after the last chunk, or with starts the last state of every sequence."""
        return h if self.starts is None else torch.cat((*self.ends, h))


def chunk_starts(cu_seqlens: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """bool [N / chunk_size]: which chunks of a packed row begin a sequence, for sequences that all begin at a
    multiple of chunk_size (a ValueError otherwise)."""
    if bool((cu_seqlens % chunk_size).any()):
        raise ValueError(f"packed sequences must begin at multiples of the chunk ({chunk_size}): {cu_seqlens.tolist()}")
    starts = torch.zeros(int(cu_seqlens[-1]) // chunk_size, dtype=torch.bool)
    starts[cu_seqlens[:-1].cpu() // chunk_size] = True
    return starts


class ChunkAlignment:
    """Packed sequences (cu_seqlens, in one row) moved to begin at multiples of chunk_size, for a chunk form that
    starts its scan afresh at each (`starts`): spread moves a tensor's time axis there, zeros filling the rest of
    each sequence's last chunk (read after the sequence, so they change none of its outputs); gather takes the
    sequences' positions back."""

    def __init__(self, cu_seqlens: torch.Tensor, chunk_size: int):
        cu_seqlens = cu_seqlens.cpu()
        lengths = cu_seqlens.diff()
        aligned = F.pad((-(-lengths // chunk_size) * chunk_size).cumsum(0), (1, 0))
        shift = torch.repeat_interleave(aligned[:-1] - cu_seqlens[:-1], lengths)  # of each token
        self.index = shift + torch.arange(int(cu_seqlens[-1]))
        self.length = int(aligned[-1])
        self.starts = chunk_starts(aligned, chunk_size)

    def spread(self, x: torch.Tensor, dim: int = 2) -> torch.Tensor:
        shape = list(x.shape)
        shape[dim] = self.length
        return x.new_zeros(shape).index_copy(dim, self.index.to(x.device), x)

    def gather(self, x: torch.Tensor, dim: int = 2) -> torch.Tensor:
        return x.index_select(dim, self.index.to(x.device))
