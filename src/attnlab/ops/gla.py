"""Gated linear attention (Yang et al. 2024): linear attention with per-channel forget gates.

Per head, with state h [D_k, D_v] and log-decays g_t <= 0 per key channel:
    h_t = diag(exp(g_t)) h_{t-1} + k_t v_t^T,        o_t = h_t^T (scale * q_t)
Shapes: q, k, g [B, H, T, D_k]; v [B, H, T, D_v]; states [B, H, D_k, D_v]. scale defaults to
D_k^-1/2. Plain (ungated) linear attention is the special case g = 0.
Three forms compute the same thing: `gla_reference` (a loop over time in the transposed layout
S = h^T, S_t = S_{t-1} diag(exp g_t) + v_t k_t^T), `gla_chunk` (training) and `gla_step` (decoding).
"""

from __future__ import annotations

import torch

from .cp import split
from .packing import SequenceStarts, aligned, autocast_off, chunk_layout, pad_time, prepare_memory_inputs, to_chunks


@autocast_off
def gla_reference(q, k, v, g, scale=None, initial_state=None):
    """Loop over time, one token at a time, in the layout S = h^T. Returns (o, final_state)."""
    out_dtype = v.dtype
    q, k, v, g, h0 = prepare_memory_inputs(q, k, v, g, scale=scale, state=initial_state)
    S = h0.transpose(-1, -2)
    outputs = []
    for t in range(q.shape[2]):
        S = S * g[:, :, t].exp()[..., None, :] + v[:, :, t, :, None] * k[:, :, t, None, :]
        outputs.append((S @ q[:, :, t, :, None]).squeeze(-1))
    o = torch.stack(outputs, dim=2) if outputs else v.new_zeros(v.shape)
    return o.to(out_dtype), S.transpose(-1, -2)


@autocast_off
def gla_step(q, k, v, g, state, scale=None):
    """One token: q, k, g [B, H, D_k], v [B, H, D_v], state [B, H, D_k, D_v] -> (o [B, H, D_v], state)."""
    out_dtype = v.dtype
    q, k, v, g, state = prepare_memory_inputs(q, k, v, g, scale=scale, state=state)
    state = state * g.exp()[..., None] + k[..., None] * v[..., None, :]
    o = torch.einsum("bhk,bhkv->bhv", q, state)
    return o.to(out_dtype), state


def decayed_scores(q: torch.Tensor, k: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A_ij = sum_c q_ic k_jc exp(b_ic - b_jc) for j <= i (else 0), per chunk: q, k, b [..., C, D].

    b are cumulative log-decays (non-increasing along the chunk). The matrix is built by halving: a block
    is [[A_first, 0], [L, A_second]] with its halves' blocks built the same way, and for a query i in the
    second half and a key j in the first, L factors around r = b at the end of the first half:
    (q_i exp(b_i - r)) . (k_j exp(r - b_j)). Both exponents are <= 0, so no factor can overflow however
    strong the decay: exact for any decay, with no data-dependent branch (no host sync, no graph break).
    """
    C = q.shape[-2]
    size = 1 << (C - 1).bit_length()  # halving needs a power of two: pad q, k with zeros, b with its last row
    q, k = pad_time(q, size, dim=q.ndim - 2), pad_time(k, size, dim=k.ndim - 2)
    b = torch.cat((b, b[..., -1:, :].expand(*b.shape[:-2], size - C, b.shape[-1])), dim=-2)
    scores = (q * k).sum(-1)[..., None, None]  # blocks of one position: [..., size, 1, 1]
    half = 1
    while half < size:
        q2, k2, b2 = (x.unflatten(-2, (size // (2 * half), 2, half)) for x in (q, k, b))  # [..., m, 2, half, D]
        r = b2[..., 0, -1:, :]
        lower = (q2[..., 1, :, :] * (b2[..., 1, :, :] - r).exp()) @ (k2[..., 0, :, :] * (r - b2[..., 0, :, :]).exp()).mT
        first, second = scores.unflatten(-3, (-1, 2)).unbind(-3)
        scores = torch.cat((torch.cat((first, torch.zeros_like(lower)), -1), torch.cat((lower, second), -1)), -2)
        half *= 2
    return scores[..., 0, :C, :C]


@autocast_off
def gla_chunk(q, k, v, g, scale=None, initial_state=None, chunk_size: int = 64, cu_seqlens=None, starts=None,
              context=None):
    """Chunkwise-parallel form. Within a chunk with cumulative log-decays b (from its start):
        o_i = (q_i exp(b_i)) h_prev + sum_{j<=i} A_ij v_j,   A from `decayed_scores`
        h_next = exp(b_C) h_prev + (k exp(b_C - b))^T v
    Every chunk's contribution is computed in parallel; only the cheap state scan runs in order.
    Lengths that are not a multiple of chunk_size are zero-padded (k = 0, g = 0 leave the state alone).
    cu_seqlens (packed sequences, B = 1, as `ops.fla`'s forms take them): each sequence from a zero state, and the
    final states one per sequence, [N_seq, H, D_k, D_v]; the sequences run moved to begin at a chunk
    (`ops.packing.aligned`), where starts, bool [B, T / chunk_size], marks the chunks that begin one: their
    h_prev is zeros, and the states returned are those after every chunk, [B, T / chunk_size, H, D_k, D_v].
    context (`ops.cp.Context`): this rank's shard of a sequence split across ranks, from the state the ranks before
    it leave, returning the whole sequence's final state (cu_seqlens then the whole row's boundaries).
    """
    if context is not None:
        return split(gla_chunk, (q, k, v, g), context, cu_seqlens, scale=scale, chunk_size=chunk_size)
    if cu_seqlens is not None:
        return aligned(gla_chunk, cu_seqlens, chunk_size, (q, k, v, g), scale)
    out_dtype = v.dtype
    q, k, v, g, h = prepare_memory_inputs(q, k, v, g, scale=scale, state=initial_state)
    T = q.shape[2]
    C, padded = chunk_layout(T, chunk_size)
    q, k, v, g = (to_chunks(x, C, padded) for x in (q, k, v, g))
    b = g.cumsum(dim=-2)  # [B, H, N, C, D_k]
    b_last = b[..., -1:, :]
    chunk_decay = b_last.squeeze(-2).exp()  # [B, H, N, D_k]
    chunk_update = (k * (b_last - b).exp()).transpose(-1, -2) @ v  # [B, H, N, D_k, D_v]

    scan = SequenceStarts(starts, h)
    states = []  # unbind once: indexing inside the loop would make the backward quadratic in chunks
    for n, (decay, update) in enumerate(zip(chunk_decay.unbind(2), chunk_update.unbind(2), strict=True)):
        h = scan.entering(n, h)
        states.append(h)
        h = decay[..., None] * h + update
    h_prev = torch.stack(states, dim=2)

    o = (q * b.exp()) @ h_prev + decayed_scores(q, k, b) @ v
    o = o.reshape(*o.shape[:2], -1, o.shape[-1])[:, :, :T]
    return o.to(out_dtype), scan.final(h)
