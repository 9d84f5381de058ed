"""Linear-attention mixers: plain linear attention, GLA, Gated DeltaNet, and their CCQ variants.

The layers follow flash-linear-attention's structure: q/k/v projections (with a short causal conv
where the backbone uses one), the recurrence from ``attnlab.ops``, then a per-head RMSNorm gated by
swish(W_g x) and an output projection. Training and prefill use the chunkwise forms; a single new
token uses the recurrent step, so decoding holds a state whose size does not grow with the context.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..nn import ShortConv, at_least_fp32, inverse_softplus, log_uniform_dt, overwritten, rms_norm_fp32, set_optim
from ..ops import fla as fla_ops
from ..ops.ccq import CCQStats, ccq_chunk, ccq_step
from ..ops.ccq_ridge import ccq_ridge, ccq_ridge_reference
from ..ops.cp import Context
from ..ops.delta_rule import delta_rule_chunk, delta_rule_step
from ..ops.gla import gla_chunk, gla_step
from ..ops.packing import state_row
from .backends import BACKENDS, fla_or_torch
from .base import Mixer, MixerConfig, marked
from .registry import register_mixer


@dataclass
class LinearConfig(MixerConfig):
    expand_k: float = 0.5  # key width = expand_k * d_model, split over the heads
    expand_v: float = 1.0  # value width = expand_v * d_model
    short_conv: bool = False  # depthwise causal conv (kernel conv_size) + SiLU on q, k, v
    conv_size: int = 4
    chunk_size: int = 64
    norm_eps: float = 1e-5
    # where sequences (training, prefill) run: torch (our chunkwise forms), fla (flash-linear-attention's
    # Triton kernels) or auto (fla on a CUDA GPU where its kernels train correctly, said once; else torch).
    # Single tokens always use our steps.
    backend: Literal[BACKENDS] = "auto"

    @property
    def key_dim(self) -> int:
        return round(self.expand_k * self.d_model)

    @property
    def value_dim(self) -> int:
        return round(self.expand_v * self.d_model)

    @property
    def halo(self) -> tuple[int, str] | None:
        return (self.conv_size - 1, f"conv_size={self.conv_size}") if self.short_conv else None

    def validate(self) -> None:
        super().validate()
        for name, width in (("expand_k", self.key_dim), ("expand_v", self.value_dim)):
            ratio = getattr(self, name)
            if width <= 0 or not math.isclose(width, ratio * self.d_model) or width % self.n_heads:
                raise ConfigError(
                    f"{name}={ratio} gives a width of {ratio * self.d_model:g} for d_model={self.d_model}; it must be "
                    f"a positive whole number divisible by n_heads={self.n_heads}"
                )
        if self.conv_size < 2:
            raise ConfigError(f"conv_size={self.conv_size} must be at least 2")
        if self.chunk_size < 1:
            raise ConfigError(f"chunk_size={self.chunk_size} must be positive")
        if self.backend == "fla":
            fla_ops.require()


@dataclass
class GLAConfig(LinearConfig):
    gate_rank: int = 16  # the forget gate is low rank: W2 (W1 x), W1: d_model -> gate_rank
    gate_normalizer: float = 16.0  # log-decay = logsigmoid(.) / gate_normalizer keeps early decay slow


@dataclass
class GDNConfig(LinearConfig):
    expand_k: float = 0.75
    expand_v: float = 1.5
    short_conv: bool = True
    # beta = 2 sigmoid(.) in (0, 2) instead of sigmoid(.) in (0, 1): the transition I - beta k k^T then has the
    # eigenvalue 1 - beta in (-1, 1) along k, which lets the state flip a sign each token, as parity and
    # permutation groups need (Grazzi et al. 2025; fla's allow_neg_eigval)
    negative_eigenvalues: bool = False


@dataclass
class CCQOptions:
    ccq_lambda_init: float = 0.1  # lambda = sigmoid(w . q + b) with w = 0 and sigmoid(b) = this at start
    ccq_decay: bool = False  # age the key statistics with the backbone's gate (not in the paper)
    # first-order: (I - lambda Sigma) q, the paper's | ridge: (I + lambda Sigma)^-1 q, the full regularised read
    # that the paper's truncates (a solve per position: what the truncation costs; torch forms only)
    read: Literal["first-order", "ridge"] = "first-order"

    def validate_ccq(self) -> None:
        if not 0.0 < self.ccq_lambda_init < 1.0:
            raise ConfigError(f"ccq_lambda_init={self.ccq_lambda_init} must be in (0, 1): lambda is a sigmoid")


@dataclass
class CCQGLAConfig(CCQOptions, GLAConfig):
    def validate(self) -> None:
        super().validate()
        self.validate_ccq()


@dataclass
class CCQGDNConfig(CCQOptions, GDNConfig):
    def validate(self) -> None:
        super().validate()
        self.validate_ccq()


@dataclass
class LinearState:
    """memory [B, H, D_k, D_v]; conv: the last conv_size - 1 projected inputs; ccq: key statistics."""

    memory: torch.Tensor
    conv: torch.Tensor | None = None
    ccq: CCQStats | None = None
    mixer: str = ""  # the mixer that made it (mixers.base.check_state)


@dataclass(frozen=True)
class Recurrence:
    """A backbone's recurrence in its three forms: the step for a single token, and the chunkwise forms for
    sequences, ours (torch) and fla's, which share one signature, packed sequences' cu_seqlens included. The
    gates follow (q, k, v) in the order the mixer's `gates` returns them. scalar_gates: whether its gates are one
    per head (fla's scalar-gated kernels, which backend=auto does not take everywhere)."""

    step: Callable
    torch: Callable
    fla: Callable
    scalar_gates: bool = False


def _linear_fla(q, k, v, g, **kwargs):
    """`linear_fla` in `gla_chunk`'s signature: plain linear attention's log-decays g are all zero."""
    return fla_ops.linear_fla(q, k, v, **kwargs)


LINEAR = Recurrence(gla_step, gla_chunk, _linear_fla)
GLA = Recurrence(gla_step, gla_chunk, fla_ops.gla_fla)
DELTA_RULE = Recurrence(delta_rule_step, delta_rule_chunk, fla_ops.delta_rule_fla, scalar_gates=True)


class LinearAttention(Mixer):
    """Shared layer structure around a recurrence. Subclasses provide ``gates(x)``; unit_qk: whether read_query
    returns L2-normalised queries and keys."""

    config_class = LinearConfig
    backends = ("torch", "fla")
    state_type = LinearState
    packs = "states"  # the chunkwise forms, fla's and ours, take the boundaries and return each sequence's state
    splits = True  # a rank's shard runs from the state that the ranks before it leave (ops.cp)

    def __init__(self, cfg: LinearConfig, recurrence: Recurrence, unit_qk: bool = False):
        super().__init__(cfg)
        self.recurrence, self.unit_qk = recurrence, unit_qk
        self.head_k, self.head_v = cfg.key_dim // cfg.n_heads, cfg.value_dim // cfg.n_heads
        self.q_proj = nn.Linear(cfg.d_model, cfg.key_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.key_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.value_dim, bias=False)
        self.conv = ShortConv(2 * cfg.key_dim + cfg.value_dim, cfg.conv_size) if cfg.short_conv else None
        self.gate_proj = nn.Linear(cfg.d_model, cfg.value_dim, bias=False)
        self.out_norm = nn.RMSNorm(self.head_v, eps=cfg.norm_eps)
        self.out_proj = nn.Linear(cfg.value_dim, cfg.d_model, bias=False)

    @property
    def scalar_gates(self) -> bool:
        """Whether the layer runs scalar-gated kernels (one gate per head), which backend=auto routes apart."""
        return self.recurrence.scalar_gates

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.cfg.n_heads, -1).transpose(1, 2)

    def route(self, x: torch.Tensor, machine: dict | None = None) -> tuple[str, str]:
        """The chunkwise forms on "fla"'s kernels (backend=fla, or auto where they train correctly:
        `backends.fla_or_torch`) or on ours, "torch", every op of the layer alike; both take packed sequences'
        boundaries."""
        return fla_or_torch(self.cfg.backend, x, self.scalar_gates, machine)

    def form(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None, context: Context | None = None) -> str:
        """How this call runs: "step" for a single token (the recurrent steps), else its `route` (a rank's shard
        of a split sequence too)."""
        if cu_seqlens is None and context is None and x.shape[1] == 1:
            return "step"
        return self.route(x)[0]

    def forward(self, x: torch.Tensor, state: LinearState | None = None, *, cu_seqlens: torch.Tensor | None = None,
                context: Context | None = None):
        """The layer over x [B, T, d_model] from state; or, given cu_seqlens, over the sequences packed in
        x [1, N, d_model], each from a fresh state, returning each one's state; or, given a context, over this
        rank's shard of every sequence, returning on every rank the state at the end of the whole sequence (none
        for packed documents, which end on different ranks)."""
        B, T, _ = x.shape
        form = self.form(x, cu_seqlens, context)
        state = state if state is not None else self.init_state(B, x.device)
        qkv = torch.cat((self.q_proj(x), self.k_proj(x), self.v_proj(x)), dim=-1)
        conv_state = None
        if self.conv is not None:
            qkv, conv_state = self.conv(qkv, state.conv, cu_seqlens, context)
        q, k, v = (self.split_heads(t) for t in qkv.split([self.cfg.key_dim, self.cfg.key_dim, self.cfg.value_dim], -1))
        gates = self.gates(x)
        memory, ccq_state = (state.memory, state.ccq) if cu_seqlens is None else (None, None)  # packed: from zeros
        q, k, ccq_state = self.read_query(q, k, gates, ccq_state, form=form, cu_seqlens=cu_seqlens, context=context)
        o, memory = self.recur(q, k, v, gates, memory, form=form, cu_seqlens=cu_seqlens, context=context)
        o = rms_norm_fp32(self.out_norm, o) * F.silu(self.split_heads(self.gate_proj(x)))
        y = self.out_proj(o.transpose(1, 2).reshape(B, T, -1).to(x.dtype))
        state = LinearState(memory, conv_state, ccq_state)
        if cu_seqlens is None:
            return y, state
        if context is not None or self.packs != "states":
            return y, None
        return y, [state_row(state, row) for row in range(len(cu_seqlens) - 1)]

    def read_query(self, q, k, gates, ccq_state, form: str, cu_seqlens=None, context=None):
        """Transform the queries before the read (identity here; CCQ cleans them): (q, k, the read's state)."""
        return q, k, ccq_state

    def recur(self, q, k, v, gates: dict, memory, form: str, cu_seqlens=None, context=None):
        """The recurrence over q, k, v and the gates from memory (None: zeros): (outputs, final memory)."""
        if form == "step":
            o, memory = self.recurrence.step(*(t[:, :, 0] for t in (q, k, v, *gates.values())), memory)
            return o[:, :, None], memory
        chunk = self.recurrence.fla if form == "fla" else self.recurrence.torch
        return chunk(q, k, v, *gates.values(), initial_state=memory, chunk_size=self.cfg.chunk_size,
                     cu_seqlens=cu_seqlens, context=context)

    def gates(self, x: torch.Tensor) -> dict:
        raise NotImplementedError

    def init_state(self, batch: int, device=None, dtype=None) -> LinearState:
        memory = torch.zeros(batch, self.cfg.n_heads, self.head_k, self.head_v, device=device, dtype=torch.float32)
        conv = None
        if self.conv is not None:
            conv = torch.zeros(batch, self.cfg.conv_size - 1, 2 * self.cfg.key_dim + self.cfg.value_dim,
                               device=device, dtype=dtype or torch.float32)
        return marked(self, LinearState(memory, conv))

    def state_size(self, seq_len: int) -> int:
        conv = (self.cfg.conv_size - 1) * (2 * self.cfg.key_dim + self.cfg.value_dim) if self.conv is not None else 0
        return self.cfg.n_heads * self.head_k * self.head_v + conv


@register_mixer("linear")
class PlainLinearAttention(LinearAttention):
    """Linear attention without forgetting: h_t = h_{t-1} + k_t v_t^T, o_t = RMSNorm(h_t^T q_t / sqrt(D_k))."""

    def __init__(self, cfg: LinearConfig, recurrence: Recurrence = LINEAR):
        super().__init__(cfg, recurrence)

    def gates(self, x):
        B, T, _ = x.shape
        return {"log_decay": x.new_zeros(B, self.cfg.n_heads, T, self.head_k)}


@register_mixer("gla")
class GatedLinearAttention(PlainLinearAttention):
    """GLA (Yang et al. 2024): per-key-channel forget gates exp(g_t), g_t = logsigmoid(W2 W1 x) / 16."""

    config_class = GLAConfig

    def __init__(self, cfg: GLAConfig):
        super().__init__(cfg, GLA)
        self.forget_gate = nn.Sequential(nn.Linear(cfg.d_model, cfg.gate_rank, bias=False),
                                         nn.Linear(cfg.gate_rank, cfg.key_dim, bias=True))

    def gates(self, x):
        log_decay = F.logsigmoid(at_least_fp32(self.forget_gate(x))) / self.cfg.gate_normalizer  # fp32 decays
        return {"log_decay": self.split_heads(log_decay)}


@register_mixer("gdn")
class GatedDeltaNet(LinearAttention):
    """Gated DeltaNet (Yang et al. 2025): L2-normalised q and k, the gated delta rule with a scalar
    log-decay g = -exp(A_log) softplus(W_a x + dt_bias) and write strength beta = sigmoid(W_b x) per head."""

    config_class = GDNConfig

    def __init__(self, cfg: GDNConfig):
        super().__init__(cfg, DELTA_RULE, unit_qk=True)
        H = cfg.n_heads
        self.decay_proj = nn.Linear(cfg.d_model, H, bias=False)
        self.beta_proj = nn.Linear(cfg.d_model, H, bias=False)
        # Mamba-2's time constants: A ~ U(0, 16) stored as a log, dt log-uniform in [1e-3, 0.1] (floor 1e-4)
        # stored as softplus^-1(dt). Neither is an nn.Linear, so reset_parameters keeps them, and neither gets
        # weight decay.
        self.A_log = set_optim(nn.Parameter(torch.empty(H).uniform_(0, 16).clamp_min(1e-4).log()), weight_decay=0.0)
        dt = log_uniform_dt(H, 1e-3, 0.1).clamp_min(1e-4)
        self.dt_bias = set_optim(nn.Parameter(inverse_softplus(dt)), weight_decay=0.0)

    def gates(self, x):
        # gates in fp32 or wider (fp64 stays fp64)
        log_decay = -at_least_fp32(self.A_log).exp() * F.softplus(at_least_fp32(self.decay_proj(x)) + self.dt_bias)
        beta = torch.sigmoid(at_least_fp32(self.beta_proj(x)))
        if self.cfg.negative_eigenvalues:
            beta = 2 * beta
        return {"log_decay": log_decay.transpose(1, 2), "beta": beta.transpose(1, 2)}  # [B, H, T]

    def read_query(self, q, k, gates, ccq_state, form, cu_seqlens=None, context=None):
        return F.normalize(q, dim=-1, eps=1e-6), F.normalize(k, dim=-1, eps=1e-6), ccq_state


class CCQRead:
    """Mixin: clean the queries with the running key covariance before the backbone reads its memory.

    Sigma is built from the L2-normalised (post-conv) keys k_bar; lambda = sigmoid(w . q_bar + b) per
    token and head. The paper reads with q_bar - lambda Sigma q_bar; we read with the backbone's own query
    q - lambda Sigma q = |q| (q_bar - lambda Sigma q_bar). The two differ by a positive per-token factor,
    which the per-head RMSNorm after the read removes (up to its eps), and ours makes lambda = 0 give
    back the backbone exactly. The backbone's write keys are unchanged (raw for GLA, normalised for
    Gated DeltaNet)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        H, D = cfg.n_heads, cfg.key_dim // cfg.n_heads
        self.lambda_weight = nn.Parameter(torch.zeros(H, D))  # zero: lambda starts at ccq_lambda_init exactly
        self.lambda_bias = nn.Parameter(torch.full((H,), math.log(cfg.ccq_lambda_init / (1 - cfg.ccq_lambda_init))))

    @property
    def scalar_gates(self) -> bool:
        return super().scalar_gates or self.cfg.ccq_decay  # decayed statistics age with one gate per head

    @property
    def packs(self) -> str | None:
        """On the layer's device, as its `route` goes: fla's kernel returns each packed sequence's key statistics;
        ours keep none (the zeros that move the sequences to their chunks would count), so where states are kept
        mix runs the sequences one at a time. The ridge read solves its sequences one after another in any case:
        mix runs them as rows."""
        if self.cfg.read == "ridge":
            return None
        return "states" if self.route(self.lambda_bias)[0] == "fla" else "outputs"

    def ablated(self):
        """lambda = sigmoid(w . q_bar + b) set to 0 (w = 0, b = -30): the backbone's own read."""
        return overwritten((self.lambda_weight, 0.0), (self.lambda_bias, -30.0))

    def read_inputs(self, q, k, gates, form):
        """(q, k as the backbone reads and writes them, k_bar, lambda, the statistics' log-decays or None)."""
        q, k, _ = super().read_query(q, k, gates, None, form=form)
        if self.unit_qk:
            q_bar, k_bar = q, k
        else:
            q_bar, k_bar = F.normalize(q, dim=-1, eps=1e-6), F.normalize(k, dim=-1, eps=1e-6)
        lam = torch.sigmoid(torch.einsum("bhtd,hd->bht", q_bar, self.lambda_weight) + self.lambda_bias[:, None])
        log_decay = None
        if self.cfg.ccq_decay:
            log_decay = gates["log_decay"]
            log_decay = log_decay.mean(-1) if log_decay.ndim == 4 else log_decay  # GLA: mean over channels
        return q, k, k_bar, lam, log_decay

    def read_query(self, q, k, gates, ccq_state, form, cu_seqlens=None, context=None):
        """The read from the statistics ccq_state; a rank's shard (context) from those the ranks before it leave."""
        q, k, k_bar, lam, log_decay = self.read_inputs(q, k, gates, form)
        if self.cfg.read == "ridge":  # the loop over time for one token; else a chunk's statistics at a time
            ridge = ccq_ridge_reference if form == "step" else partial(
                ccq_ridge, chunk_size=self.cfg.chunk_size, cu_seqlens=cu_seqlens, context=context)
            q_clean, ccq_state = ridge(q, k_bar, lam, ccq_state, log_decay)
            return q_clean, k, ccq_state
        if form == "step":
            stats = ccq_state if ccq_state is not None else CCQStats.empty(*q.shape[:2], q.shape[-1], q.device)
            q_clean, ccq_state = ccq_step(q[:, :, 0], k_bar[:, :, 0], lam[:, :, 0], stats,
                                          None if log_decay is None else log_decay[:, :, 0])
            return q_clean[:, :, None], k, ccq_state
        chunk = fla_ops.ccq_fla if form == "fla" else ccq_chunk
        q_clean, ccq_state = chunk(q, k_bar, lam, ccq_state, log_decay, self.cfg.chunk_size, cu_seqlens=cu_seqlens,
                                   context=context)
        return q_clean, k, ccq_state

    def init_state(self, batch, device=None, dtype=None):
        state = super().init_state(batch, device, dtype)
        state.ccq = CCQStats.empty(batch, self.cfg.n_heads, self.head_k, device)
        return state

    def state_size(self, seq_len):
        return super().state_size(seq_len) + self.cfg.n_heads * (self.head_k**2 + self.head_k + 1)


@register_mixer("ccq-gla")
class CCQGatedLinearAttention(CCQRead, GatedLinearAttention):
    """GLA whose read uses the curvature-conditioned query."""

    config_class = CCQGLAConfig


@register_mixer("ccq-gdn")
class CCQGatedDeltaNet(CCQRead, GatedDeltaNet):
    """Gated DeltaNet whose read uses the curvature-conditioned query."""

    config_class = CCQGDNConfig
