"""Boltzmann attention with fields only, on FlexAttention.

With no couplings the spins are independent, so key j's marginal is P(s_j = +1) = sigma(2 h_ij), and the
normalised weights are
    alpha_ij = sigma(2 h_ij) / sum_k sigma(2 h_ik) = softmax_j(log sigma(2 h_ij)),   h_ij = q_i . k_j / sqrt(D),
over each query's last `window` keys: softmax attention with a score modification and a sliding causal
block mask, which FlexAttention compiles into one fused kernel on a GPU. Shapes: q [B, H, T_q, D] (the last
T_q of the keys), k, v [B, H, S, D] -> [B, H, T_q, D].
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F


def field_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """softmax_j(log sigma(2 q_i . k_j / sqrt(D))) v over each query's last `window` keys."""

    def marginal(score, b, h, i, j):  # log sigma(2 h): a field's log-marginal
        return F.logsigmoid(2 * score)

    mask = _window_mask(q.shape[-2], k.shape[-2], window, q.device)
    return _flex(q.is_cuda)(q, k, v, score_mod=marginal, block_mask=mask, scale=1 / math.sqrt(q.shape[-1]))


@functools.lru_cache(maxsize=32)  # every layer and step of a run asks for the same few
def _window_mask(n_queries: int, n_keys: int, window: int, device: torch.device):
    """The block mask of queries that are the last n_queries keys, each seeing its last `window` keys."""
    from torch.nn.attention.flex_attention import create_block_mask

    offset = n_keys - n_queries  # query i sits at key position offset + i

    def in_window(b, h, i, j):
        return (j <= i + offset) & (i + offset - j < window)

    return create_block_mask(in_window, None, None, n_queries, n_keys, device=device)


@functools.cache
def _flex(cuda: bool):
    """flex_attention, compiled into a fused kernel on a GPU; its eager reference elsewhere (forward only on a
    CPU, where torch has no backward for it)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False) if cuda else flex_attention
