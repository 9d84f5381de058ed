"""S4D-only: a token mixer around one complex S4D state per head, the Interdomain paper's iso-state baseline.

Generic inputs [a, b] (two projections of x, short-convolved and RMS-normalised per head) drive the recurrence
X_t = lambda X_{t-1} + B_bar [a_t, b_t] over M complex modes (``attnlab.ops.s4d``), and a learned contraction
over the modes reads it: y = sum_m w_m Re(C X_t)[m] = Re((C^T w) . X_t). The state's core (the poles, the
step sizes, the full C per head) is Interdomain attention's own, so the two hold the same state; interdomain
replaces the contraction with a read conditioned on the query (``attnlab.mixers.interdomain``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..nn import Rotary, ShortConv, at_least_fp32, log_uniform_dt, no_autocast, positions_in_sequences, set_optim
from ..ops import s4d
from ..ops.cp import Context
from .base import Mixer, MixerConfig, marked
from .registry import register_mixer


@dataclass
class S4DConfig(MixerConfig):
    modes: int = 64  # M complex modes per head
    rope: bool = False  # RoPE on the a half (the paper's "S4D-only + RoPE")
    rope_base: float = 10000.0
    gate: bool = False  # o <- silu(W_g x) * o before the output projection
    conv_size: int = 4
    discretization: Literal["zoh", "bilinear"] = "zoh"
    init: Literal["inv", "lin"] = "inv"  # S4D-Inv (the paper) | S4D-Lin
    inv_uses_2M: bool = False  # S4D-Inv with N = 2M (the s4 code) instead of the paper's N = M
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    ssm_max_lr: float = 1e-3  # S4D and input-norm parameters: lr = min(run lr, this), no weight decay
    norm_eps: float = 1e-6

    @property
    def halo(self) -> tuple[int, str] | None:
        return self.conv_size - 1, f"conv_size={self.conv_size}"

    def validate(self) -> None:
        super().validate()
        if self.modes < 1 or self.conv_size < 2:
            raise ConfigError("need modes >= 1 and conv_size >= 2")
        if not 0 < self.dt_min <= self.dt_max:
            raise ConfigError(f"need 0 < dt_min <= dt_max (got {self.dt_min}, {self.dt_max})")


@dataclass
class SSMState:
    memory: torch.Tensor  # X [B, H, M, width] complex
    conv: torch.Tensor  # the last conv_size - 1 inputs of the short convolution
    position: int = 0  # tokens seen, for RoPE
    mixer: str = ""  # the mixer that made it (mixers.base.check_state)


class HeadNorm(nn.Module):
    """Per-head RMSNorm with its own gains and an additive bias: RMSNorm_h(x) * g_h + b_h, x [B, H, T, D]."""

    def __init__(self, heads: int, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(heads, 1, dim))
        self.bias = nn.Parameter(torch.zeros(heads, 1, dim))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), eps=self.eps) * self.weight + self.bias


class StateSpaceMixer(Mixer):
    """A mixer around one complex S4D state per head: the core's parameters, their discretization and the state
    (the memory X [B, H, M, state_width] and the last inputs of a short convolution conv_channels wide)."""

    state_type = SSMState
    splits = True  # a rank's shard runs from the state the ranks before it leave (a diagonal scan)

    def __init__(self, cfg: S4DConfig, conv_channels: int):
        super().__init__(cfg)
        self.conv_channels = conv_channels

    def add_state_core(self, cfg: S4DConfig, *input_norms: nn.Module) -> None:
        """Step sizes log-uniform in [dt_min, dt_max], poles A = -1/2 + i Im (S4D-Inv or S4D-Lin) and
        C ~ CN(0, 1/M) [H, M, M], all at lr <= ssm_max_lr without weight decay, as the input norms are."""
        H, M = cfg.n_heads, cfg.modes
        dt = log_uniform_dt(H, cfg.dt_min, cfg.dt_max)
        imag = s4d.s4d_inv_imag(M, cfg.inv_uses_2M) if cfg.init == "inv" else s4d.s4d_lin_imag(M)
        C = torch.randn(H, M, M, dtype=torch.complex64) / math.sqrt(M)
        core = {"log_dt": dt.log(), "log_A_real": torch.full((H, M), math.log(0.5)),
                "A_imag": imag.float().expand(H, M).clone(), "C": torch.view_as_real(C).clone()}
        for name, value in core.items():
            self.register_parameter(name, nn.Parameter(value))
        for param in [*(getattr(self, name) for name in core), *(p for norm in input_norms for p in norm.parameters())]:
            set_optim(param, max_lr=cfg.ssm_max_lr, weight_decay=0.0)

    def ssm(self):
        """(lambda, B_bar, C) of every head, complex64 or wider: complex arithmetic in bf16 or fp16 is missing
        or too coarse for powers of lambda."""
        log_dt, log_A_real, A_imag, C = (at_least_fp32(p) for p in (self.log_dt, self.log_A_real, self.A_imag, self.C))
        lam, B_bar = s4d.discretize(log_dt, torch.complex(-log_A_real.exp(), A_imag), self.cfg.discretization)
        return lam, B_bar, torch.view_as_complex(C)

    def heads(self, x):
        B, T, _ = x.shape
        return x.view(B, T, self.cfg.n_heads, -1).transpose(1, 2)

    @staticmethod
    def positions(cu_seqlens, context: Context | None, length: int, device) -> torch.Tensor | None:
        """RoPE's positions where they are not the state's count on: in each packed sequence, or on a shard."""
        if context is not None:
            return context.documents(cu_seqlens, length).positions.to(device)
        return None if cu_seqlens is None else positions_in_sequences(cu_seqlens, device)

    def project_out(self, x, o, memory, conv_state, state: SSMState, cu_seqlens, context=None):
        """The heads' readouts o [B, H, T, width] merged, gated (if so) and projected, with the state carried on
        (on a shard, the whole sequence's; none for packed sequences)."""
        B, T, _ = x.shape
        y = o.transpose(1, 2).reshape(B, T, -1).to(x.dtype)
        if self.gate_proj is not None:
            y = F.silu(self.gate_proj(x)) * y
        if cu_seqlens is not None:
            return self.out_proj(y), None
        length = T if context is None else context.world * T  # a shard's sequence: every rank's shard
        return self.out_proj(y), SSMState(memory, conv_state, state.position + length)

    def state_width(self) -> int:
        """The inputs each mode holds: [a, b] or [xi(k), v], 2 head_dim."""
        return 2 * self.cfg.head_dim

    def init_state(self, batch: int, device=None, dtype=None) -> SSMState:
        cfg = self.cfg
        cdtype = torch.complex128 if self.log_dt.dtype == torch.float64 else torch.complex64
        memory = torch.zeros(batch, cfg.n_heads, cfg.modes, self.state_width(), dtype=cdtype, device=device)
        conv = torch.zeros(batch, cfg.conv_size - 1, self.conv_channels, device=device, dtype=dtype)
        return marked(self, SSMState(memory, conv))

    def state_size(self, seq_len: int) -> int:
        cfg = self.cfg
        return 2 * cfg.n_heads * cfg.modes * self.state_width() + (cfg.conv_size - 1) * self.conv_channels


@register_mixer("s4d")
class S4DMixer(StateSpaceMixer):
    """The S4D-only baseline at the same state size: generic inputs [a, b] and a learned contraction."""

    config_class = S4DConfig
    packs = "outputs"  # one convolution per group of lengths, each restarting at its sequences; no states: padding
    # after a sequence would decay them

    def __init__(self, cfg: S4DConfig):
        super().__init__(cfg, conv_channels=2 * cfg.d_model)  # the short convolution runs over [a, b]
        d, H, D, M = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.modes
        self.k_proj = nn.Linear(d, d, bias=False)  # a (named as interdomain's key half, which it replaces)
        self.v_proj = nn.Linear(d, d, bias=False)  # b
        self.conv = ShortConv(self.conv_channels, cfg.conv_size)
        self.rotary = Rotary(D, cfg.rope_base) if cfg.rope else None
        self.key_norm, self.value_norm = HeadNorm(H, D, cfg.norm_eps), HeadNorm(H, D, cfg.norm_eps)
        self.gate_proj = nn.Linear(d, 2 * d, bias=False) if cfg.gate else None
        self.out_proj = nn.Linear(2 * d, d, bias=False)
        self.add_state_core(cfg, self.key_norm, self.value_norm)
        self.contraction = nn.Parameter(torch.randn(H, M) / math.sqrt(M))  # w [H, M]

    def forward(self, x: torch.Tensor, state: SSMState | None = None, *, cu_seqlens: torch.Tensor | None = None,
                context: Context | None = None):
        """The layer over x [B, T, d_model] from state; or, given cu_seqlens, over the sequences packed in
        x [1, N, d_model], each from a fresh state (the short convolution, RoPE's positions and the convolution
        restart), returning no state; or, given a context, over this rank's shard of every sequence, returning
        the state at the end of the whole sequence."""
        state = state if state is not None else self.init_state(x.shape[0], x.device, x.dtype)
        ab = torch.cat((self.k_proj(x), self.v_proj(x)), dim=-1)
        ab, conv_state = self.conv(ab, state.conv, cu_seqlens, context)
        a, b = (self.heads(t) for t in ab.split(self.cfg.d_model, dim=-1))
        if self.rotary is not None:
            a = self.rotary(a, state.position, self.positions(cu_seqlens, context, x.shape[1], x.device))
        z = at_least_fp32(torch.cat((self.key_norm(a), self.value_norm(b)), dim=-1))
        with no_autocast(x.device):  # the state and its readout stay in fp32
            lam, B_bar, C = self.ssm()
            o, memory = s4d.s4d_contract(z, self.contraction, C, lam, B_bar, state.memory, cu_seqlens, context)
        return self.project_out(x, o, memory, conv_state, state, cu_seqlens, context)
