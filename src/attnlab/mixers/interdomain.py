"""Interdomain attention and its S4D-only baseline: token mixers around one complex S4D state per head.

``interdomain`` (Kiyohara et al. 2026): keys xi(k) and values v are compressed onto M learned basis
functions by a shared S4D recurrence, and each query reads the coefficients through xi(q), with
xi(x) = SiLU(conv(x)) / |SiLU(conv(x))| (see ``attnlab.ops.interdomain``). ``s4d`` is the paper's
iso-state baseline: generic inputs [a, b] and a learned contraction over the modes instead of a query.
The paper's ablation cube is reachable with ``input`` (dual | single) x ``query`` (conditioned |
linear) x ``rope``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, unknown_name
from ..nn import Rotary, ShortConv, at_least_fp32, log_uniform_dt, no_autocast, positions_in_sequences, set_optim
from ..ops import fla as fla_ops
from ..ops import interdomain as ops
from ..ops import s4d
from ..ops._chunks import ChunkAlignment
from .packing import span_groups
from .registry import Mixer, MixerConfig, register_mixer


@dataclass
class InterdomainConfig(MixerConfig):
    modes: int = 64  # M complex modes per head
    input: str = "dual"  # dual: [RMSNorm(xi(k)) + b, RMSNorm(v) + b] | single: generic halves [a, b]
    query: str = "conditioned"  # conditioned: o = Gamma^T U xi(q) | linear: a learned contraction over modes
    rope: bool = True  # on q and on the key half (k, or a)
    rope_base: float = 10000.0
    readout: str = "re_first"  # re_first | bilinear | hermitian (where the real part is taken)
    gate: bool = False  # o <- silu(W_g x) * o before the output projection
    normalize: bool = False  # divide by the readout of a constant channel (the derivation's denominator)
    normalize_eps: float = 1e-6
    form: str = "chunk"  # training form: chunk (bounded memory) | fft (all states at once)
    # where the chunk form's query read runs: torch (ours), fla (two reads on flash-linear-attention's Triton
    # kernels) or auto (fla on a CUDA GPU where it is installed, said once; else torch)
    backend: str = "auto"
    chunk_size: int = 64
    conv_size: int = 4
    discretization: str = "zoh"  # zoh | bilinear
    init: str = "inv"  # S4D-Inv (the paper) | lin
    inv_uses_2M: bool = False  # S4D-Inv with N = 2M (the s4 code) instead of the paper's N = M
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    ssm_max_lr: float = 1e-3  # S4D and input-norm parameters: lr = min(run lr, this), no weight decay
    norm_eps: float = 1e-6

    def validate(self) -> None:
        super().validate()
        choices = {"input": ("dual", "single"), "query": ("conditioned", "linear"), "readout": ops.READOUTS,
                   "form": ("chunk", "fft"), "discretization": ("zoh", "bilinear"), "init": ("inv", "lin")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(unknown_name(name, getattr(self, name), allowed))
        if self.modes < 1 or self.chunk_size < 1 or self.conv_size < 2:
            raise ConfigError("need modes >= 1, chunk_size >= 1 and conv_size >= 2")
        if not 0 < self.dt_min <= self.dt_max:
            raise ConfigError(f"need 0 < dt_min <= dt_max (got {self.dt_min}, {self.dt_max})")
        if self.query == "linear" and (self.normalize or self.readout != "re_first"):
            raise ConfigError("query=linear has no query readout: normalize and readout apply to query=conditioned")
        if self.backend not in fla_ops.BACKENDS:
            raise ConfigError(unknown_name("backend", self.backend, fla_ops.BACKENDS))
        if self.backend == "fla":
            if self.query == "linear" or self.form == "fft":
                raise ConfigError(f"backend=fla runs the chunk form's query read (query=conditioned, form=chunk), "
                                  f"not query={self.query} with form={self.form}: use backend=torch or backend=auto")
            fla_ops.require()


@dataclass
class S4DConfig(InterdomainConfig):
    input: str = "single"
    query: str = "linear"
    rope: bool = False


@dataclass
class SSMState:
    memory: torch.Tensor  # X [B, H, M, width] complex
    conv: torch.Tensor  # the last conv_size - 1 inputs of the short convolution
    position: int = 0  # tokens seen, for RoPE


class HeadNorm(nn.Module):
    """Per-head RMSNorm with its own gains and an additive bias: RMSNorm_h(x) * g_h + b_h, x [B, H, T, D]."""

    def __init__(self, heads: int, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(heads, 1, dim))
        self.bias = nn.Parameter(torch.zeros(heads, 1, dim))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), eps=self.eps) * self.weight + self.bias


@register_mixer("interdomain")
class InterdomainAttention(Mixer):
    """Interdomain attention: queries read a fixed-size S4D state of keys and values through xi(q)."""

    config_class = InterdomainConfig
    backends = ("torch", "fla")
    compile_exclusion = ("the complex-valued state and the serial carry between chunks did not finish compiling "
                         "in 75 s for one small layer on a 2-core CPU")

    def __init__(self, cfg: InterdomainConfig):
        super().__init__(cfg)
        d, H, D, M = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.modes
        conditioned, dual = cfg.query == "conditioned", cfg.input == "dual"
        self.q_proj = nn.Linear(d, d, bias=False) if conditioned else None
        self.k_proj = nn.Linear(d, d, bias=False)  # the key half: k (dual) or a (single)
        self.v_proj = nn.Linear(d, d, bias=False)  # the value half: v (dual) or b (single)
        # the short conv runs over q (if any), the key half, and the value half only for generic inputs
        self.conv_channels = d * (int(conditioned) + 1 + int(not dual))
        self.conv = ShortConv(self.conv_channels, cfg.conv_size)
        self.rotary = Rotary(D, cfg.rope_base) if cfg.rope else None
        self.key_norm, self.value_norm = HeadNorm(H, D, cfg.norm_eps), HeadNorm(H, D, cfg.norm_eps)
        self.gate_proj = nn.Linear(d, d * (1 if conditioned else 2), bias=False) if cfg.gate else None
        self.out_proj = nn.Linear(d * (1 if conditioned else 2), d, bias=False)

        dt = log_uniform_dt(H, cfg.dt_min, cfg.dt_max)
        imag = s4d.s4d_inv_imag(M, cfg.inv_uses_2M) if cfg.init == "inv" else s4d.s4d_lin_imag(M)
        C = torch.randn(H, M, M, dtype=torch.complex64) / math.sqrt(M)  # CN(0, 1/M)
        ssm = {"log_dt": dt.log(), "log_A_real": torch.full((H, M), math.log(0.5)),
               "A_imag": imag.float().expand(H, M).clone(), "C": torch.view_as_real(C).clone()}
        for name, value in ssm.items():
            self.register_parameter(name, nn.Parameter(value))
        if not conditioned:  # the contraction that replaces the query: y = sum_m w_m Re(C X)[m]
            self.contraction = nn.Parameter(torch.randn(H, M) / math.sqrt(M))
        ssm_params = [self.log_dt, self.log_A_real, self.A_imag, self.C, *self.key_norm.parameters(),
                      *self.value_norm.parameters()]
        for param in ssm_params:
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

    def forward(self, x: torch.Tensor, state: SSMState | None = None, cu_seqlens: torch.Tensor | None = None):
        """The layer over x [B, T, d_model] from state; or, given cu_seqlens (the chunk form's query read or the
        linear contraction), over the sequences packed in x [1, N, d_model], each from a fresh state (the short
        convolution, RoPE's positions and the scan or the convolution restart), returning no state."""
        cfg = self.cfg
        B, T, _ = x.shape
        state = state if state is not None else self.init_state(B, x.device, x.dtype)
        conditioned, dual = cfg.query == "conditioned", cfg.input == "dual"
        streams = ([self.q_proj(x)] if conditioned else []) + [self.k_proj(x)] + ([] if dual else [self.v_proj(x)])
        streams = torch.cat(streams, dim=-1)
        convolved, conv_state = (self.conv(streams, state.conv) if cu_seqlens is None else
                                 self.conv.packed(streams, cu_seqlens))
        convolved = [self.heads(t) for t in convolved.split(cfg.d_model, dim=-1)]
        q = convolved.pop(0) if conditioned else None
        key_half = convolved.pop(0)
        value_half = convolved.pop(0) if not dual else self.heads(self.v_proj(x))
        if self.rotary is not None:
            positions = None if cu_seqlens is None else positions_in_sequences(cu_seqlens, x.device)
            q = None if q is None else self.rotary(q, state.position, positions)
            key_half = self.rotary(key_half, state.position, positions)
        if dual:
            key_half = F.normalize(key_half, dim=-1, eps=cfg.norm_eps)  # xi(k)
        z = at_least_fp32(torch.cat((self.key_norm(key_half), self.value_norm(value_half)), dim=-1))
        with no_autocast(x.device):  # the state and its readout stay in fp32
            lam, B_bar, C = self.ssm()
            if conditioned:
                xi_q = F.normalize(at_least_fp32(q), dim=-1, eps=cfg.norm_eps)
                if cfg.normalize:  # a constant channel whose readout is the denominator
                    z = torch.cat((z, torch.ones_like(z[..., :1])), dim=-1)
                o, memory = self.read(xi_q, z, lam, B_bar, C, state.memory, cu_seqlens)
                if cfg.normalize:
                    o = o[..., :-1] / (o[..., -1:] + cfg.normalize_eps)
            else:
                c = torch.einsum("hm,hmn->hn", self.contraction.to(C.dtype), C)  # (C^T w): y = Re(c . X)
                o, memory = self.contract(z, c, lam, B_bar, state.memory, cu_seqlens)
        y = o.transpose(1, 2).reshape(B, T, -1).to(x.dtype)
        if self.gate_proj is not None:
            y = F.silu(self.gate_proj(x)) * y
        if cu_seqlens is not None:
            return self.out_proj(y), None
        return self.out_proj(y), SSMState(memory, conv_state, state.position + T)

    def packed_outputs(self, x, cu_seqlens):
        """One forward where the read restarts at each sequence by itself (the chunk form's query read, the
        linear contraction's convolution); else batches of similar lengths (Mixer.packed_outputs). No state:
        padding after a sequence would decay it."""
        if self.cfg.query == "linear" or self.cfg.form == "chunk":
            return nn.Module.__call__(self, x, None, cu_seqlens)[0]
        return super().packed_outputs(x, cu_seqlens)

    def auto_backend(self, **machine) -> tuple[str, str]:
        if self.cfg.query == "linear" or self.cfg.form == "fft":
            return "torch", f"query={self.cfg.query}, form={self.cfg.form}: the torch form"
        uses_fla, why = fla_ops.auto_route(False, **machine)
        return ("fla" if uses_fla else "torch"), why

    def read(self, xi_q, z, lam, B_bar, C, memory, cu_seqlens=None):
        fla_read = self.cfg.form == "chunk" and fla_ops.runs_fla(self.cfg.backend, z)
        if fla_read and (cu_seqlens is not None or z.shape[2] > 1):  # fla's kernels take the boundaries themselves
            return fla_ops.interdomain_fla(xi_q, z, lam, B_bar, C, self.cfg.readout, memory, cu_seqlens=cu_seqlens)
        if cu_seqlens is not None:  # every sequence moved to begin at a chunk, where the scan starts afresh
            align = ChunkAlignment(cu_seqlens, self.cfg.chunk_size)
            o, _ = ops.interdomain_chunk(align.spread(xi_q), align.spread(z), lam, B_bar, C, self.cfg.readout, None,
                                         **align.packing)
            return align.gather(o), None
        if z.shape[2] == 1:
            o, memory = ops.interdomain_step(xi_q[:, :, 0], z[:, :, 0], lam, B_bar, C, memory, self.cfg.readout)
            return o[:, :, None], memory
        if self.cfg.form == "fft":
            return ops.interdomain_fft(xi_q, z, lam, B_bar, C, self.cfg.readout, memory)
        return ops.interdomain_chunk(xi_q, z, lam, B_bar, C, self.cfg.readout, memory, self.cfg.chunk_size)

    def contract(self, z, c, lam, B_bar, memory, cu_seqlens=None):
        if cu_seqlens is not None:  # one convolution per batch of sequences of similar lengths, each from zeros
            return s4d.s4d_fft_sequences(z, c, lam, B_bar, span_groups(cu_seqlens)), None
        if z.shape[2] == 1:
            o, memory = s4d.s4d_step(z[:, :, 0], c, lam, B_bar, memory)
            return o[:, :, None], memory
        return s4d.s4d_fft(z, c, lam, B_bar, memory)

    def state_width(self) -> int:
        return 2 * self.cfg.head_dim + int(self.cfg.normalize)

    def init_state(self, batch: int, device=None, dtype=None) -> SSMState:
        cfg = self.cfg
        cdtype = torch.complex128 if self.log_dt.dtype == torch.float64 else torch.complex64
        memory = torch.zeros(batch, cfg.n_heads, cfg.modes, self.state_width(), dtype=cdtype, device=device)
        conv = torch.zeros(batch, cfg.conv_size - 1, self.conv_channels, device=device, dtype=dtype)
        return SSMState(memory, conv)

    def state_size(self, seq_len: int) -> int:
        cfg = self.cfg
        return 2 * cfg.n_heads * cfg.modes * self.state_width() + (cfg.conv_size - 1) * self.conv_channels


@register_mixer("s4d")
class S4DMixer(InterdomainAttention):
    """The S4D-only baseline at the same state size: generic inputs [a, b] and a learned contraction."""

    config_class = S4DConfig
    backends = ("torch",)
    compile_exclusion = None  # its FFT convolution compiles (the interdomain read does not)
