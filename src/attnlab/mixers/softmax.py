"""Softmax attention (the Transformer baseline) and sigmoid attention."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..nn import causal_mask
from ..ops.sigmoid_attention import sigmoid_attention
from .attention import AttentionConfig, AttentionMixer
from .registry import register_mixer


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """softmax(scale q k^T) v with a causal mask, queries being the last positions of the keys; scale defaults
    to 1/sqrt(D)."""
    T, S = q.shape[-2], k.shape[-2]
    if T == S:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    if T == 1:  # one new token sees every cached key
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    # is_causal would align the mask to the top-left corner; queries here are the bottom rows.
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(T, S, q.device), scale=scale)


@register_mixer("softmax")
class SoftmaxAttention(AttentionMixer):
    """Causal multi-head softmax attention through ``F.scaled_dot_product_attention``."""

    def attend(self, q, k, v):
        return causal_sdpa(q, k, v)


@dataclass
class SigmoidConfig(AttentionConfig):
    # b = -log(n) for a context of n tokens keeps early attention mass near that of softmax
    # (Ramapuram et al. 2024). It is a constant, not the current length, so that decoding token by
    # token computes exactly what the full forward computes.
    bias: float = -math.log(256)


@register_mixer("sigmoid")
class SigmoidAttention(AttentionMixer):
    """Sigmoid attention: y_i = sum_{j<=i} sigmoid(q_i . k_j / sqrt(D) + b) v_j, no normalisation."""

    config_class = SigmoidConfig

    def attend(self, q, k, v):
        return sigmoid_attention(q, k, v, self.cfg.bias)  # blockwise: no [T, S] matrix
