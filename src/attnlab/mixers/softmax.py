"""Softmax attention, plain (the Transformer baseline) and with nonlinear queries, and sigmoid and stick-breaking
attention. The last two have weights that are not a softmax."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..nn import at_least_fp32, causal_mask, overwritten
from ..ops.sigmoid_attention import sigmoid_attention
from ..ops.stick_breaking import stick_breaking
from .attention import AttentionConfig, AttentionMixer
from .registry import register_mixer


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """softmax(scale q k^T) v with a causal mask, queries being the last positions of the keys; scale defaults
    to 1/sqrt(D)."""
    T, S = q.shape[-2], k.shape[-2]
    if T == S:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    if T == 1 and not q.is_cuda:  # one new token sees every cached key
        return _one_query_attention(q, k, v, scale)
    if T == 1:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    # is_causal would align the mask to the top-left corner; queries here are the bottom rows.
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(T, S, q.device), scale=scale)


def _one_query_attention(q, k, v, scale: float | None) -> torch.Tensor:
    """softmax(scale q k^T) v for one query [..., 1, D]: two matrix-vector products that read each cached key
    and value once. On CPUs this decodes about twice as fast as SDPA's fused kernel, which is built for query
    blocks (measured at 16K keys, head dim 64)."""
    return one_query_weights(q, k, scale).to(v.dtype) @ v


def one_query_weights(q, k, scale: float | None = None) -> torch.Tensor:
    """softmax(scale q k^T) in fp32 or wider for one query [..., 1, D] over every key [..., S, D]: [..., 1, S].
    The scores are computed as k q^T, the matrix-vector product that reads the keys in their stored order
    (about 25% faster on CPUs than q k^T)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (k @ q.transpose(-1, -2)).transpose(-1, -2)
    return torch.softmax(at_least_fp32(scores) * scale, dim=-1)


@register_mixer("softmax")
class SoftmaxAttention(AttentionMixer):
    """Causal multi-head softmax attention, o_i = sum_{j<=i} softmax_j(q_i . k_j / sqrt(D)) v_j.

    It runs through ``F.scaled_dot_product_attention``."""

    def attend(self, q, k, v):
        return causal_sdpa(q, k, v)


@dataclass
class NonlinearQConfig(AttentionConfig):
    # the width of f's hidden layer as a fraction of d_model: 0.5 gives f the d_model^2 weights of the W_q it
    # replaces (plus its biases)
    hidden_ratio: float = 0.5

    def validate(self) -> None:
        super().validate()
        if not self.hidden_ratio > 0:
            raise ConfigError(f"hidden_ratio={self.hidden_ratio} must be positive: f's hidden layer needs a width")


@register_mixer("nonlinear-q")
class NonlinearQueryAttention(SoftmaxAttention):
    """Softmax attention whose query is the input plus a bottleneck MLP of it, q = x + f(x), in place of W_q x
    (Karbevski 2026, "The Case for Nonlinear Queries").

    The identity anchors the query, f bends it: the uncoupled control of the coupled-QK follow-up, which bends q
    and k together. f = W_2 gelu(W_1 x + b_1) + b_2 (the activation is not given in the abstract: GELU, as the
    GPT-3-style models it reports on)."""

    config_class = NonlinearQConfig

    def __init__(self, cfg: NonlinearQConfig):
        super().__init__(cfg)
        del self.qkv  # the query is no projection: keys and values keep theirs
        hidden = max(1, round(cfg.hidden_ratio * cfg.d_model))
        self.kv = nn.Linear(cfg.d_model, 2 * cfg.d_model, bias=False)
        self.query_in = nn.Linear(cfg.d_model, hidden)
        self.query_out = nn.Linear(hidden, cfg.d_model)

    def heads(self, x):
        B, T, _ = x.shape
        q = x + self.query_out(F.gelu(self.query_in(x)))  # q = x + f(x)
        k, v = self.kv(x).view(B, T, 2, self.cfg.n_heads, self.cfg.head_dim).permute(2, 0, 3, 1, 4)
        return q.view(B, T, self.cfg.n_heads, self.cfg.head_dim).transpose(1, 2), k, v

    def ablated(self):
        """f set to zero (its output layer's weights and bias): the query is the input itself."""
        return overwritten((self.query_out.weight, 0.0), (self.query_out.bias, 0.0))


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


@dataclass
class StickBreakingConfig(AttentionConfig):
    # the nearest keys claim the stick first, which orders the keys by distance: the paper uses no position
    # encoding (RoPE stays available)
    rope: bool = False
    attend_current: bool = False  # True: a query may also read its own position's key


@register_mixer("stick-breaking")
class StickBreakingAttention(AttentionMixer):
    """Stick-breaking attention (Tan et al. 2024): key j gets sigmoid(z_ij) of what the keys nearer to query i left
    of a unit stick, so a near key's weight suppresses every farther key's; the weights sum to at most one."""

    config_class = StickBreakingConfig

    def attend(self, q, k, v):
        return stick_breaking(q, k, v, attend_current=self.cfg.attend_current)[0]  # blockwise: no [T, S] matrix
