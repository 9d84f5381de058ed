"""Differential attention (Ye et al. 2024, "Differential Transformer")."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..nn import rms_norm_fp32
from .attention import AttentionConfig, AttentionMixer
from .registry import register_mixer
from .softmax import causal_sdpa, one_query_weights


@dataclass
class DifferentialConfig(AttentionConfig):
    norm_eps: float = 1e-5

    def validate(self) -> None:
        super().validate()
        if self.n_heads % 2:
            raise ConfigError(
                f"differential attention pairs its heads: n_heads={self.n_heads} must be even"
            )


def lambda_init(layer_idx: int) -> float:
    """lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)) for the l-th layer, l = layer_idx + 1."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)


@register_mixer("differential")
class DifferentialAttention(AttentionMixer):
    """Per head pair: (softmax(q1 k1^T) - lambda softmax(q2 k2^T)) v, then RMSNorm and (1 - lambda_init).

    With ``n_heads = H`` the layer has H/2 differential heads; each uses two query/key heads of width
    d_model/H and one value head of width 2 d_model/H, so the parameter count equals softmax attention
    with H heads plus the 4 lambda vectors and the norm. lambda is re-parameterised as
    exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init and shared by the heads of a layer.
    """

    config_class = DifferentialConfig

    def __init__(self, cfg: DifferentialConfig):
        super().__init__(cfg)
        self.lambda_init = lambda_init(cfg.layer_idx)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(cfg.head_dim) * 0.1) for _ in range(4)
        )
        self.head_norm = nn.RMSNorm(2 * cfg.head_dim, eps=cfg.norm_eps)

    def lambda_full(self) -> torch.Tensor:
        return (
            torch.exp(torch.dot(self.lambda_q1, self.lambda_k1))
            - torch.exp(torch.dot(self.lambda_q2, self.lambda_k2))
            + self.lambda_init
        )

    def attend(self, q, k, v):
        y = self._one_query(q, k, v) if q.shape[-2] == 1 < k.shape[-2] else self._fused(q, k, v)
        return rms_norm_fp32(self.head_norm, y) * (1.0 - self.lambda_init)

    def _fused(self, q, k, v):
        """Both maps of every pair under the causal mask."""
        H, D = v.shape[1], v.shape[-1]
        # Heads 2i and 2i+1 form differential head i: (A_2i - lambda A_2i+1) [v_2i, v_2i+1], a value 2D wide.
        # SDPA's fused kernels need q, k and v of one width (else it materialises the [T, S] maps), so q and k
        # get D zero channels, which leave q . k unchanged (the scale stays 1/sqrt(D)), and both maps read
        # their pair's joined value, in one call over the H heads. Each map's exp is computed once, and the
        # products cost what two D-wide calls (A1 and A2 times each half of the value) would.
        v = v.unflatten(1, (H // 2, 2)).transpose(2, 3).flatten(-2).repeat_interleave(2, 1)  # [B, H, S, 2D]
        q, k = F.pad(q, (0, D)), F.pad(k, (0, D))
        y = causal_sdpa(q, k, v, scale=D**-0.5)
        return y[:, 0::2] - self.lambda_full() * y[:, 1::2]  # [B, H/2, T, 2D]

    def _one_query(self, q, k, v):
        """Decoding: the two maps of each pair for one query, read against the cache in place (padding or
        joining the cached keys and values would copy the whole cache every token)."""
        weights = one_query_weights(q, k)  # [B, H, 1, S]
        diff = (weights[:, 0::2] - self.lambda_full() * weights[:, 1::2]).to(v.dtype)  # [B, H/2, 1, S]
        return torch.cat((diff @ v[:, 0::2], diff @ v[:, 1::2]), dim=-1)  # [B, H/2, 1, 2D]
