"""Shared machinery of the attention mixers: projections, heads, RoPE and the KV cache."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..nn import Rotary, packed_windows, positions_in_sequences
from .registry import Mixer, MixerConfig, sequences


@dataclass
class AttentionConfig(MixerConfig):
    rope: bool = True
    rope_base: float = 10000.0


@dataclass
class KVCache:
    """The keys and values a layer keeps, k [B, H, S, D_k] and v [B, H, S, D_v]: views into buffers that grow
    geometrically, so that appending a token writes only that token. (torch.cat would copy the whole cache
    at every token, reading and writing it twice more per step than attention itself reads it.)

    Several caches may share buffers: a cache extends them in place only at their written end, and a cache
    further back (a branch, e.g. two continuations of one prompt) copies itself out first. Under autograd the
    cache is concatenated instead, since an in-place write would change tensors saved for the backward pass.
    `position` counts every token seen (RoPE's offset); it exceeds S once a sliding window drops old keys.
    """

    k_buffer: torch.Tensor  # [B, H, capacity, D_k]; the cache is k_buffer[:, :, start:start + length]
    v_buffer: torch.Tensor
    start: int
    length: int
    position: int
    written: list[int]  # [end of the data written into the buffers], shared by every cache on them

    @classmethod
    def holding(cls, k: torch.Tensor, v: torch.Tensor, position: int | None = None) -> KVCache:
        """A cache of exactly these keys and values (no copy)."""
        n = k.shape[2]
        return cls(k, v, 0, n, n if position is None else position, [n])

    @property
    def k(self) -> torch.Tensor:
        return self.k_buffer[:, :, self.start : self.start + self.length]

    @property
    def v(self) -> torch.Tensor:
        return self.v_buffer[:, :, self.start : self.start + self.length]

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> KVCache:
        T, end = k.shape[2], self.start + self.length
        tracked = (k, v, self.k_buffer, self.v_buffer)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tracked):
            return KVCache.holding(torch.cat((self.k, k), 2), torch.cat((self.v, v), 2), self.position + T)
        if self._must_move(T, k, v):
            return self._moved(T, k.dtype, v.dtype).extend(k, v)
        self.k_buffer[:, :, end : end + T] = k  # a narrower dtype is widened, as concatenating would
        self.v_buffer[:, :, end : end + T] = v
        self.written[0] = end + T
        return KVCache(self.k_buffer, self.v_buffer, self.start, self.length + T, self.position + T, self.written)

    def _must_move(self, room: int, k: torch.Tensor, v: torch.Tensor) -> bool:
        """Whether appending must copy the cache to new buffers first: it is not at their written end (a
        branch), they are full, the new keys or values need a wider dtype, or they were made in inference mode
        and can no longer be written in place."""
        end = self.start + self.length
        wider = any(torch.promote_types(buffer.dtype, new.dtype) != buffer.dtype
                    for buffer, new in ((self.k_buffer, k), (self.v_buffer, v)))
        frozen = self.k_buffer.is_inference() and not torch.is_inference_mode_enabled()
        return end != self.written[0] or end + room > self.k_buffer.shape[2] or wider or frozen

    def _moved(self, room: int, k_dtype: torch.dtype, v_dtype: torch.dtype) -> KVCache:
        """The cache copied to the front of new buffers with space for `room` more tokens and as many again,
        so that n appended tokens cause O(log n) moves (O(n / window) under a sliding window). The buffers
        take the dtypes concatenating would have given."""
        capacity = 2 * (self.length + room)
        buffers = []
        for buffer, cached, dtype in ((self.k_buffer, self.k, k_dtype), (self.v_buffer, self.v, v_dtype)):
            moved = buffer.new_empty(*buffer.shape[:2], capacity, buffer.shape[3],
                                     dtype=torch.promote_types(buffer.dtype, dtype))
            moved[:, :, : self.length] = cached
            buffers.append(moved)
        return KVCache(*buffers, 0, self.length, self.position, [self.length])

    def keep_last(self, n: int) -> KVCache:
        """The cache without all but its last n keys and values (a sliding window's)."""
        drop = max(0, self.length - n)
        return dataclasses.replace(self, start=self.start + drop, length=self.length - drop)


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
        past = 0 if state is None else state.position
        q, k = self.prepare_qk(q, k)
        if self.rotary is not None:
            q, k = self.rotary(q, offset=past), self.rotary(k, offset=past)
        state = KVCache.holding(k, v) if state is None else state.extend(k, v)
        y = self.attend(q, state.k, state.v)  # [B, H', T, D'], in fp32 where attend normalises in it
        return self.out_proj(y.transpose(1, 2).reshape(B, T, -1).to(x.dtype)), state

    def packed(self, x: torch.Tensor, cu_seqlens: torch.Tensor):
        """Every packed sequence at once where the mixer's attention takes a mask (``attend_masked``): the
        sequences regrouped into a batch of windows as wide as the longest (nn.packed_windows), a window of one
        sequence under plain causal attention and one of several under its block-diagonal causal mask, RoPE
        counted from each sequence's start, and each sequence's KV cache a view of its keys and values. Else each
        sequence on its own (Mixer.packed)."""
        if type(self).attend_masked is AttentionMixer.attend_masked:
            return super().packed(x, cu_seqlens)
        _, N, _ = x.shape
        q, k, v = self.qkv(x).view(1, N, 3, self.cfg.n_heads, self.cfg.head_dim).permute(2, 0, 3, 1, 4)
        q, k = self.prepare_qk(q, k)
        if self.rotary is not None:
            position = positions_in_sequences(cu_seqlens, x.device)
            q, k = self.rotary(q, positions=position), self.rotary(k, positions=position)
        index, mask, alone = packed_windows(cu_seqlens, x.device)
        windows = [F.pad(t[0], (0, 0, 0, 1))[:, index].transpose(0, 1) for t in (q, k, v)]  # [G, H, W, D]
        parts = []  # [G, H', W, D']
        if alone:  # one sequence a window: plain causal attention
            parts.append(self.attend(*(w[:alone] for w in windows)))
        if alone < len(index):
            parts.append(self.attend_masked(*(w[alone:] for w in windows), mask[alone:]))
        y = torch.cat(parts)
        slots = index.flatten()
        filled = (slots < N).nonzero().squeeze(1)
        y = y.transpose(0, 1).flatten(1, 2)[:, filled[slots[filled].argsort()]]  # back to the row's order: [H', N, D']
        states = [KVCache.holding(k[:, :, start:end], v[:, :, start:end]) for start, end in sequences(cu_seqlens)]
        return self.out_proj(y.transpose(0, 1).reshape(1, N, -1).to(x.dtype)), states

    def packed_outputs(self, x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        if type(self).attend_masked is AttentionMixer.attend_masked:
            return super().packed_outputs(x, cu_seqlens)
        return self.packed(x, cu_seqlens)[0]

    def prepare_qk(self, q: torch.Tensor, k: torch.Tensor):
        """Per-token transform of q and k before RoPE and scoring (identity here)."""
        return q, k

    def attend_masked(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """attend() of queries and keys at the same positions [B, H, T, D] where each query reads only the keys
        that mask [B, 1, T, T] allows (True), for packed sequences; a mixer whose attention has a masked form
        overrides it."""
        raise NotImplementedError

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def init_state(self, batch: int, device=None, dtype=None) -> KVCache:
        empty = torch.zeros(batch, self.cfg.n_heads, 0, self.cfg.head_dim, device=device, dtype=dtype)
        return KVCache.holding(empty, empty.clone())

    def state_size(self, seq_len: int) -> int:
        return 2 * self.cfg.d_model * seq_len  # one key and one value of width d_model per token
