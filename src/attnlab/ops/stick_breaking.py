"""Stick-breaking attention (Tan et al. 2024): each query breaks a unit stick among the earlier keys, nearest first.
So a near key's weight suppresses every farther key's.

With z_ij = scale q_i . k_j and beta = sigmoid(z), query i gives key j < i the weight

    A_ij = beta_ij prod_{j < l < i} (1 - beta_il),         o_i = sum_j A_ij v_j,

so sum_j A_ij <= 1; the rest of the stick, 1 - sum_j A_ij, is returned beside o. With attend_current the query's
own position counts too (j <= i, and the product runs to l <= i). In log space, log A_ij = log sigmoid(z_ij) +
sum_{j < l} log sigmoid(-z_il) over the keys l the query sees: a sum over the keys after j, taken right to left.
Shapes: q [B, H, T, D], k [B, H, S, D], v [B, H, S, D_v] with S >= T, the queries being the last T of the S
positions (as every attention op here), so one form serves training (T = S), a prefill that continues a cache and a
decoding step (T = 1). Forms: `stick_breaking_reference` (the dense [T, S] weights) and `stick_breaking` (blocks of
queries, recomputed in the backward: memory linear in S).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..nn import at_least_fp32


def stick_breaking_reference(q, k, v, scale: float | None = None, attend_current: bool = False):
    """(o [B, H, T, D_v], the stick left over [B, H, T]) from the whole [T, S] weight matrix at once."""
    out_dtype = v.dtype
    q, k, v = (at_least_fp32(x) for x in (q, k, v))
    T, S = q.shape[-2], k.shape[-2]
    z = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    key = torch.arange(S, device=q.device)
    position = key[S - T :, None]  # each query's own key position
    seen = key <= position if attend_current else key < position
    keep = F.logsigmoid(-z).masked_fill(~seen, 0.0)  # log(1 - beta) of the keys the query sees, 0 elsewhere
    after = keep.flip(-1).cumsum(-1).flip(-1) - keep  # sum over the keys l > j
    weights = (F.logsigmoid(z) + after).exp().masked_fill(~seen, 0.0)
    return (weights @ v).to(out_dtype), (1 - weights.sum(-1)).to(out_dtype)


def stick_breaking(q, k, v, scale: float | None = None, attend_current: bool = False, block_size: int = 128):
    """The reference form on `block_size` queries at a time, each block's weights recomputed in the backward, so
    that at most [block_size, S] weights per head exist at once (a row of weights depends on its own query
    alone)."""
    S, T = k.shape[-2], q.shape[-2]
    outputs, left = [], []
    for start in range(0, T, block_size):
        stop = min(start + block_size, T)
        keys = S - T + stop  # the keys the block's last query can see
        rows = (q[..., start:stop, :], k[..., :keys, :], v[..., :keys, :])
        if torch.is_grad_enabled() and any(x.requires_grad for x in rows):
            o, rest = checkpoint(stick_breaking_reference, *rows, scale, attend_current, use_reentrant=False)
        else:
            o, rest = stick_breaking_reference(*rows, scale, attend_current)
        outputs.append(o)
        left.append(rest)
    return torch.cat(outputs, dim=-2), torch.cat(left, dim=-1)
