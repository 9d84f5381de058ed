"""Shared machinery of the attention mixers: projections, heads, RoPE and the KV cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..nn import Rotary
from .registry import Mixer, MixerConfig


@dataclass
class AttentionConfig(MixerConfig):
    rope: bool = True
    rope_base: float = 10000.0


@dataclass
class KVCache:
    """Keys and values of every token seen so far: k [B, H, S, D_k], v [B, H, S, D_v]."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def length(self) -> int:
        return self.k.shape[2]

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> KVCache:
        return KVCache(torch.cat((self.k, k), dim=2), torch.cat((self.v, v), dim=2))


class AttentionMixer(Mixer):
    """q, k, v projections split into heads, RoPE on q and k, a KV cache, and an output projection.

    Subclasses define ``attend(q, k, v)`` -- queries [B, H, T, D] against all cached keys and values
    [B, H, S, D], S >= T, the queries being the last T positions -- returning [B, H', T, D'] with
    H' * D' = d_model.
    """

    config_class = AttentionConfig

    def __init__(self, cfg: AttentionConfig):
        super().__init__(cfg)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_base) if cfg.rope else None

    def forward(self, x: torch.Tensor, state: KVCache | None = None):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.cfg.n_heads, self.cfg.head_dim).permute(2, 0, 3, 1, 4)
        past = 0 if state is None else state.length
        q, k = self.prepare_qk(q, k)
        if self.rotary is not None:
            q, k = self.rotary(q, offset=past), self.rotary(k, offset=past)
        state = KVCache(k, v) if state is None else state.extend(k, v)
        y = self.attend(q, state.k, state.v)  # [B, H', T, D']
        return self.out_proj(y.transpose(1, 2).reshape(B, T, -1)), state

    def prepare_qk(self, q: torch.Tensor, k: torch.Tensor):
        """Per-token transform of q and k before RoPE and scoring (identity here)."""
        return q, k

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def init_state(self, batch: int, device=None, dtype=None) -> KVCache:
        empty = torch.zeros(batch, self.cfg.n_heads, 0, self.cfg.head_dim, device=device, dtype=dtype)
        return KVCache(empty, empty.clone())

    def state_size(self, seq_len: int) -> int:
        return 2 * self.cfg.d_model * seq_len  # one key and one value of width d_model per token
