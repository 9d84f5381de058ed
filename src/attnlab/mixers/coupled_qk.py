"""Coupled query-key attention and its ablations.

The coupling is a pre-scoring step: after the q/k projections and the head split, before RoPE and the
1/sqrt(d_h) scaling, each token's (q, k) is integrated for a few steps of a learned dynamical system
(``attnlab.ops.coupled_qk``). Values are untouched, and the KV cache stores the evolved keys, so
decoding works as for the wrapped attention. It wraps softmax attention (``coupled-qk``) and
Differential attention (``coupled-differential``); ``uncoupled-qk`` is the matched-capacity ablation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..nn import inverse_softplus, overwritten
from ..ops.coupled_qk import INTEGRATORS, affine, head_mlp
from .attention import AttentionConfig
from .differential import DifferentialAttention, DifferentialConfig
from .registry import register_mixer
from .softmax import SoftmaxAttention

MAX_STEPS = 7  # the range the paper tested; it found one step enough


@dataclass
class CouplingOptions:
    steps: int = 1  # integration steps, 1..7
    dt_init: float = 0.1  # initial step size; dt = softplus(raw) > 0, one per head
    per_head_mlp: bool = False  # give each head its own force network (default: shared by the layer's heads)

    def validate_coupling(self) -> None:
        if not 1 <= self.steps <= MAX_STEPS:
            raise ConfigError(f"steps={self.steps} must be between 1 and {MAX_STEPS}")
        if not self.dt_init > 0:
            raise ConfigError(f"dt_init={self.dt_init} must be positive (dt = softplus(raw) > 0)")


@dataclass
class IntegratorOption:
    # euler | leapfrog: the paper's dynamics | affine: alternating affine coupling layers that start as the
    # identity (the follow-up's invertible coupling, reconstructed from its abstract; steps = layer pairs)
    integrator: Literal["euler", "leapfrog", "affine"] = "euler"


@dataclass
class CoupledQKConfig(CouplingOptions, IntegratorOption, AttentionConfig):
    def validate(self) -> None:
        super().validate()
        self.validate_coupling()


@dataclass
class UncoupledQKConfig(CouplingOptions, AttentionConfig):
    def validate(self) -> None:
        super().validate()
        self.validate_coupling()


@dataclass
class CoupledDifferentialConfig(CouplingOptions, IntegratorOption, DifferentialConfig):
    def validate(self) -> None:
        super().validate()
        self.validate_coupling()


class QKCoupling(nn.Module):
    """Integrates (q, k) [B, H, T, D] with a learned force network and a learned per-head step size."""

    def __init__(self, n_heads: int, head_dim: int, integrator: str, steps: int, dt_init: float,
                 per_head_mlp: bool):
        super().__init__()
        self.integrate = INTEGRATORS[integrator]
        self.steps = steps
        shape = (n_heads, head_dim, head_dim) if per_head_mlp else (head_dim, head_dim)
        # nn.Linear's default init (these are not nn.Linear, so reset_parameters keeps them): the output
        # layer is not zero, so the force carries gradient from the first step.
        bound = 1 / math.sqrt(head_dim)
        self.w_in = nn.Parameter(torch.empty(shape).uniform_(-bound, bound))
        self.w_out = nn.Parameter(torch.empty(shape).uniform_(-bound, bound))
        self.dt_raw = nn.Parameter(torch.full((n_heads, 1, 1), inverse_softplus(dt_init)))

    @property
    def dt(self) -> torch.Tensor:
        return F.softplus(self.dt_raw)

    def force(self, x: torch.Tensor) -> torch.Tensor:
        return head_mlp(x, self.w_in, self.w_out)

    def forward(self, q: torch.Tensor, k: torch.Tensor):
        return self.integrate(q, k, self.force, self.dt, self.steps)

    def ablated(self):
        """dt = softplus(dt_raw) set to 0 (dt_raw = -30: dt ≈ 1e-13), so q and k stay as projected."""
        return overwritten((self.dt_raw, -30.0))


class AffineQKCoupling(nn.Module):
    """`steps` pairs of affine coupling layers on (q, k) [B, H, T, D]: k rescaled (by exp tanh s) and shifted by
    a net of q, then q by a net of the new k (ops.coupled_qk.affine). Each net is W_out silu(W_in x) with a hidden
    width of D and an output of 2D (s and t); W_out starts at zero, so the map starts as the identity and costs
    6 D^2 weights a step (shared by the heads; per_head_mlp: each head its own)."""

    def __init__(self, n_heads: int, head_dim: int, steps: int, per_head_mlp: bool):
        super().__init__()
        heads = (n_heads,) if per_head_mlp else ()
        bound = 1 / math.sqrt(head_dim)
        self.w_in = nn.Parameter(torch.empty(steps, 2, *heads, head_dim, head_dim).uniform_(-bound, bound))
        self.w_out = nn.Parameter(torch.zeros(steps, 2, *heads, 2 * head_dim, head_dim))

    def layers(self) -> list[tuple]:
        return [tuple(partial(head_mlp, w_in=self.w_in[i, j], w_out=self.w_out[i, j]) for j in range(2))
                for i in range(self.w_in.shape[0])]

    def forward(self, q: torch.Tensor, k: torch.Tensor):
        return affine(q, k, self.layers())

    def ablated(self):
        """Every net's output layer set to zero: the identity, q and k as projected."""
        return overwritten((self.w_out, 0.0))


class CoupledPreScoring:
    """Mixin for an AttentionMixer: replaces its identity ``prepare_qk`` with the coupling. integrator: the one
    the mixer fixes, or None to read cfg.integrator."""

    def __init__(self, cfg, integrator: str | None = None):
        super().__init__(cfg)
        integrator = integrator or cfg.integrator
        if integrator == "affine":
            self.coupling = AffineQKCoupling(cfg.n_heads, cfg.head_dim, cfg.steps, cfg.per_head_mlp)
        else:
            self.coupling = QKCoupling(cfg.n_heads, cfg.head_dim, integrator, cfg.steps, cfg.dt_init,
                                       cfg.per_head_mlp)

    def prepare_qk(self, q, k):
        return self.coupling(q, k)

    def ablated(self):
        """The coupling switched off, so q and k stay as projected: the wrapped attention with this layer's
        projections."""
        return self.coupling.ablated()


@register_mixer("coupled-qk")
class CoupledQKAttention(CoupledPreScoring, SoftmaxAttention):
    """Softmax attention scoring coupled (q_N, k_N): Euler q' = q + dt k, k' = k + dt f(q), leapfrog, or affine
    coupling layers."""

    config_class = CoupledQKConfig


@register_mixer("uncoupled-qk")
class UncoupledQKAttention(CoupledPreScoring, SoftmaxAttention):
    """Ablation: the same network applied to q and k separately, q' = q + dt g(q), k' = k + dt g(k)."""

    config_class = UncoupledQKConfig

    def __init__(self, cfg: UncoupledQKConfig):
        super().__init__(cfg, integrator="uncoupled")


@register_mixer("coupled-differential")
class CoupledDifferentialAttention(CoupledPreScoring, DifferentialAttention):
    """Differential attention whose query/key heads are coupled before scoring."""

    config_class = CoupledDifferentialConfig
