"""Interdomain attention (Kiyohara et al. 2026): a token mixer around one complex S4D state per head.

Keys xi(k) and values v are compressed onto M learned basis functions by a shared S4D recurrence, and each
query reads the coefficients through xi(q), with xi(x) = SiLU(conv(x)) / |SiLU(conv(x))| (see
``attnlab.ops.interdomain``). Its state core is the S4D-only baseline's (``attnlab.mixers.s4d``). The paper's
ablation cube is reachable with ``input`` (dual | single) x ``query`` (conditioned | linear: the baseline's
contraction) x ``rope``; its S4D-only corner is the ``s4d`` mixer.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..nn import Rotary, ShortConv, at_least_fp32, no_autocast
from ..ops import fla as fla_ops
from ..ops import interdomain as ops
from ..ops.cp import Context
from ..ops.s4d import s4d_contract
from .backends import BACKENDS, fla_or_torch
from .registry import register_mixer
from .s4d import HeadNorm, S4DConfig, SSMState, StateSpaceMixer


@dataclass
class InterdomainConfig(S4DConfig):
    # dual: [RMSNorm(xi(k)) + b, RMSNorm(v) + b] | single: generic halves [a, b]
    input: Literal["dual", "single"] = "dual"
    # conditioned: o = Gamma^T U xi(q) | linear: a learned contraction over modes
    query: Literal["conditioned", "linear"] = "conditioned"
    rope: bool = True  # on q and on the key half (k, or a)
    readout: Literal[ops.READOUTS] = "re_first"  # where the real part is taken
    normalize: bool = False  # divide by the readout of a constant channel (the derivation's denominator)
    normalize_eps: float = 1e-6
    form: Literal["chunk", "fft"] = "chunk"  # training form: chunk (bounded memory) | fft (all states at once)
    # where the chunk form's query read runs: torch (ours), fla (two reads on flash-linear-attention's Triton
    # kernels) or auto (fla on a CUDA GPU where it is installed, said once; else torch)
    backend: Literal[BACKENDS] = "auto"
    chunk_size: int = 64

    def validate(self) -> None:
        super().validate()
        if self.chunk_size < 1:
            raise ConfigError("need chunk_size >= 1")
        if self.query == "linear" and (self.normalize or self.readout != "re_first"):
            raise ConfigError("query=linear has no query readout: normalize and readout apply to query=conditioned")
        if self.backend == "fla":
            if self.query == "linear" or self.form == "fft":
                raise ConfigError(f"backend=fla runs the chunk form's query read (query=conditioned, form=chunk), "
                                  f"not query={self.query} with form={self.form}: use backend=torch or backend=auto")
            fla_ops.require()


@register_mixer("interdomain")
class InterdomainAttention(StateSpaceMixer):
    """Interdomain attention: queries read a fixed-size S4D state of keys and values through xi(q)."""

    config_class = InterdomainConfig
    backends = ("torch", "fla")
    compile_exclusion = ("the complex-valued state and the serial carry between chunks did not finish compiling "
                         "in 75 s for one small layer on a 2-core CPU")

    def __init__(self, cfg: InterdomainConfig):
        d, H, D, M = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.modes
        conditioned, dual = cfg.query == "conditioned", cfg.input == "dual"
        # the short conv runs over q (if any), the key half, and the value half only for generic inputs
        super().__init__(cfg, conv_channels=d * (int(conditioned) + 1 + int(not dual)))
        self.q_proj = nn.Linear(d, d, bias=False) if conditioned else None
        self.k_proj = nn.Linear(d, d, bias=False)  # the key half: k (dual) or a (single)
        self.v_proj = nn.Linear(d, d, bias=False)  # the value half: v (dual) or b (single)
        self.conv = ShortConv(self.conv_channels, cfg.conv_size)
        self.rotary = Rotary(D, cfg.rope_base) if cfg.rope else None
        self.key_norm, self.value_norm = HeadNorm(H, D, cfg.norm_eps), HeadNorm(H, D, cfg.norm_eps)
        self.gate_proj = nn.Linear(d, d * (1 if conditioned else 2), bias=False) if cfg.gate else None
        self.out_proj = nn.Linear(d * (1 if conditioned else 2), d, bias=False)

        self.add_state_core(cfg, self.key_norm, self.value_norm)
        # while Mixer.ablated runs: every token reads with one shared direction per head
        self.query_removed, self.mean_query = False, None
        if not conditioned:  # the contraction that replaces the query: y = sum_m w_m Re(C X)[m]
            self.contraction = nn.Parameter(torch.randn(H, M) / math.sqrt(M))

    @property
    def packs(self) -> str | None:
        """The chunk form's query read and the linear contraction's convolution restart at each packed sequence by
        themselves, in one forward; the FFT form's read does not, and mix runs it. No states: padding after a
        sequence would decay them."""
        return "outputs" if self.cfg.query == "linear" or self.cfg.form == "chunk" else None

    def route(self, x: torch.Tensor, machine: dict | None = None) -> tuple[str, str]:
        """The chunk form's query read on fla's kernels or ours (`backends.fla_or_torch`); the FFT form and the
        linear contraction have a torch form alone."""
        cfg = self.cfg
        if cfg.query == "linear" or cfg.form == "fft":
            return "torch", f"query={cfg.query}, form={cfg.form}: the torch form"
        return fla_or_torch(cfg.backend, x, machine=machine)

    def forward(self, x: torch.Tensor, state: SSMState | None = None, *, cu_seqlens: torch.Tensor | None = None,
                context: Context | None = None):
        """The layer over x [B, T, d_model] from state; or, given cu_seqlens (the chunk form's query read or the
        linear contraction), over the sequences packed in x [1, N, d_model], each from a fresh state (the short
        convolution, RoPE's positions and the scan or the convolution restart), returning no state; or, given a
        context, over this rank's shard of every sequence, returning the state at the end of the whole
        sequence."""
        cfg = self.cfg
        state = state if state is not None else self.init_state(x.shape[0], x.device, x.dtype)
        conditioned, dual = cfg.query == "conditioned", cfg.input == "dual"
        streams = ([self.q_proj(x)] if conditioned else []) + [self.k_proj(x)] + ([] if dual else [self.v_proj(x)])
        streams = torch.cat(streams, dim=-1)
        convolved, conv_state = self.conv(streams, state.conv, cu_seqlens, context)
        convolved = [self.heads(t) for t in convolved.split(cfg.d_model, dim=-1)]
        q = convolved.pop(0) if conditioned else None
        key_half = convolved.pop(0)
        value_half = convolved.pop(0) if not dual else self.heads(self.v_proj(x))
        if self.rotary is not None:
            positions = self.positions(cu_seqlens, context, x.shape[1], x.device)
            q = None if q is None else self.rotary(q, state.position, positions)
            key_half = self.rotary(key_half, state.position, positions)
        if dual:
            key_half = F.normalize(key_half, dim=-1, eps=cfg.norm_eps)  # xi(k)
        z = at_least_fp32(torch.cat((self.key_norm(key_half), self.value_norm(value_half)), dim=-1))
        with no_autocast(x.device):  # the state and its readout stay in fp32
            lam, B_bar, C = self.ssm()
            if conditioned:
                xi_q = F.normalize(at_least_fp32(q), dim=-1, eps=cfg.norm_eps)
                if self.query_removed:
                    xi_q = self.shared_direction(xi_q, state)
                if cfg.normalize:  # a constant channel whose readout is the denominator
                    z = torch.cat((z, torch.ones_like(z[..., :1])), dim=-1)
                o, memory = self.read(xi_q, z, lam, B_bar, C, state.memory, cu_seqlens, context)
                if cfg.normalize:
                    o = o[..., :-1] / (o[..., -1:] + cfg.normalize_eps)
            else:
                o, memory = s4d_contract(z, self.contraction, C, lam, B_bar, state.memory, cu_seqlens, context)
        return self.project_out(x, o, memory, conv_state, state, cu_seqlens, context)

    def ablated(self):
        """The query path removed: each head reads its state with one direction for every token, the mean of
        its queries' xi(q) over a call from a fresh state (renormalised), kept for the tokens decoded after it,
        so what a token asks no longer shapes what it reads: o_t = Gamma_t^T U_t xi_bar. A scored window (128
        tokens or more) gives a later token a share of at most 1/128 in the mean: too little to leak an answer,
        and a leak could only flatter the ablated model, never make the component look more used. None for
        query=linear, which has no query."""
        return self._query_removed() if self.cfg.query == "conditioned" else None

    @contextmanager
    def _query_removed(self):
        self.query_removed, self.mean_query = True, None
        try:
            yield
        finally:
            self.query_removed, self.mean_query = False, None

    def shared_direction(self, xi_q: torch.Tensor, state: SSMState) -> torch.Tensor:
        """xi_q [B, H, T, R] -> the direction every token reads with: set per head by a call from a fresh state
        (the mean over its B x T positions), kept while decoding goes on from it."""
        if not state.position:
            self.mean_query = F.normalize(xi_q.mean(dim=(0, 2), keepdim=True), dim=-1)
        elif self.mean_query is None:
            raise ValueError("the interdomain ablation takes its query direction from a call that starts a "
                             "sequence: enter it before the prompt, not part-way through decoding")
        return self.mean_query.expand_as(xi_q)

    def read(self, xi_q, z, lam, B_bar, C, memory, cu_seqlens=None, context=None):
        """The query read (`ops.interdomain.interdomain_read`), its chunk form on the layer's route: fla's kernels
        or ours."""
        chunk = fla_ops.interdomain_fla if self.route(z)[0] == "fla" else ops.interdomain_chunk
        return ops.interdomain_read(xi_q, z, lam, B_bar, C, self.cfg.readout, memory, self.cfg.chunk_size, cu_seqlens,
                                    context, fft=self.cfg.form == "fft", chunk=chunk)

    def state_width(self) -> int:
        return 2 * self.cfg.head_dim + int(self.cfg.normalize)  # and the constant channel, if normalized
