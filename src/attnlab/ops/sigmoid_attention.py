"""Sigmoid attention (Ramapuram et al. 2024): y_i = sum_{j<=i} sigmoid(q_i . k_j / sqrt(D) + b) v_j.

Shapes: q [B, H, T, D], k [B, H, S, D], v [B, H, S, D_v] with S >= T, the queries being the last T of the S
positions: query i sits at key position S - T + i and sees keys 0 .. S - T + i (a decoding step has T = 1, a
prefill that continues a cache T < S). Output [B, H, T, D_v] in the inputs' dtype.
Two forms compute the same thing: `sigmoid_attention_reference` (the dense [T, S] weights) and
`sigmoid_attention` (blocks of queries, memory linear in S, the backward recomputing each block's weights).
"""

from __future__ import annotations

import torch

from ..nn import at_least_fp32, causal_mask, no_autocast
from .packing import autocast_off


def sigmoid_attention_reference(q, k, v, bias: float):
    """The whole [T, S] weight matrix at once."""
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias
    weights = torch.sigmoid(scores) * causal_mask(q.shape[-2], k.shape[-2], q.device)
    return weights @ v


@autocast_off
def sigmoid_attention(q, k, v, bias: float, block_size: int = 128):
    """Blockwise form: `block_size` queries at a time against the keys they can see, so that at most
    [block_size, S] weights per head exist at once. Each weight depends on its own score alone (there is no
    normalisation), so unlike flash attention no running max or sum is carried between blocks. It computes in
    the inputs' common dtype with autocast off (under autocast the mixer's q, k, v arrive in bf16 already)."""
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    return _BlockwiseSigmoidAttention.apply(q.to(dtype), k.to(dtype), v.to(dtype), bias, block_size)


def _query_blocks(q, k, bias: float, block_size: int):
    """For each block of queries: (its rows, n = how many keys its last query sees, its weights [..., rows, n]).

    With s_ij = q_i . k_j / sqrt(D) + b, the weights are p_ij = sigmoid(s_ij), and 0 for keys after query i.
    Queries start..stop-1 sit at key positions n - (stop - start) .. n - 1, so only the block's last
    stop - start keys need the causal mask, a lower triangle (diagonal included).
    """
    T, S = q.shape[-2], k.shape[-2]
    for start in range(0, T, block_size):
        stop = min(start + block_size, T)
        n = S - T + stop
        weights = (q[..., start:stop, :] @ k[..., :n, :].mT).mul_(q.shape[-1] ** -0.5).add_(bias).sigmoid_()
        weights[..., n - (stop - start) :].tril_()
        yield slice(start, stop), n, weights


class _BlockwiseSigmoidAttention(torch.autograd.Function):
    """Saves only q, k and v; the backward recomputes p block by block. With dy the output's gradient:
        dv_j = sum_i p_ij dy_i,   ds_ij = (dy_i . v_j) p_ij (1 - p_ij)   (sigmoid' = sigmoid (1 - sigmoid)),
        dq_i = sum_j ds_ij k_j / sqrt(D),   dk_j = sum_i ds_ij q_i / sqrt(D).
    dk and dv are sums over query blocks, accumulated in at least fp32."""

    @staticmethod
    def forward(ctx, q, k, v, bias, block_size):
        ctx.save_for_backward(q, k, v)
        ctx.bias, ctx.block_size = bias, block_size
        y = v.new_empty(*q.shape[:-1], v.shape[-1])
        for rows, n, p in _query_blocks(q, k, bias, block_size):
            y[..., rows, :] = p @ v[..., :n, :]
        return y

    @staticmethod
    def backward(ctx, dy):
        q, k, v = ctx.saved_tensors
        with no_autocast(dy.device):  # the backward may run under the caller's autocast too
            scale = q.shape[-1] ** -0.5
            dq = torch.empty_like(q)
            dk, dv = at_least_fp32(torch.zeros_like(k)), at_least_fp32(torch.zeros_like(v))
            for rows, n, p in _query_blocks(q, k, ctx.bias, ctx.block_size):
                dy_rows = dy[..., rows, :]
                dv[..., :n, :] += p.mT @ dy_rows
                ds = torch.ops.aten.sigmoid_backward(dy_rows @ v[..., :n, :].mT, p)  # 0 where p is masked to 0
                dq[..., rows, :] = (ds @ k[..., :n, :]).mul_(scale)
                dk[..., :n, :] += (ds.mT @ q[..., rows, :]).mul_(scale)
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None
