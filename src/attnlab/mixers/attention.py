"""Shared machinery of the attention mixers: projections, heads, RoPE and the KV cache."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from ..nn import Rotary
from ..ops.cp import Context, attend_prefix
from .base import Mixer, MixerConfig, marked


@dataclass
class AttentionConfig(MixerConfig):
    rope: bool = True
    rope_base: float = 10000.0
    # o <- sigmoid(W_g x) * o before the output projection, one gate per channel: the gated attention of
    # hybrid models' full-attention layers (Qiu et al. 2025, Qwen3-Next), which lets a head output nothing
    output_gate: bool = False


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
    mixer: str = ""  # the mixer that made it (mixers.base.check_state)

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

    def row(self, row: int, length: int) -> KVCache:
        """Row `row`'s cache, cut to its first `length` keys and values (a row padded at its end: mix's padded
        batches of packed sequences), as batch 1."""
        return KVCache.holding(self.k[row : row + 1, :, :length], self.v[row : row + 1, :, :length])

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
    state_type = KVCache
    # packed sequences as batches of similar lengths padded at their ends: causal attention reads no padding, and
    # each sequence's KV cache is its row's first keys and values. (Cheaper than one block-diagonal mask over
    # the row: its attention costs the sum of the squared lengths, under the causal kernels.)
    packs = "padded"
    splits = True  # a rank's queries are the last positions of the keys gathered up to its shard

    def __init__(self, cfg: AttentionConfig):
        super().__init__(cfg)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_base) if cfg.rope else None
        self.gate = nn.Linear(cfg.d_model, cfg.d_model, bias=False) if cfg.output_gate else None

    def forward(self, x: torch.Tensor, state: KVCache | None = None, *, cu_seqlens: torch.Tensor | None = None,
                context: Context | None = None):
        """x from the state's KV cache; or this rank's shard under a context, cu_seqlens then the whole row's
        document boundaries (packed calls outside a context reach it as padded batches: `packs`)."""
        if context is not None:  # a shard keeps no state
            q, k, v = self.projections(x, positions=context.documents(cu_seqlens, x.shape[1]).positions.to(x.device))
            return self.output(attend_prefix(self.attend, q, k, v, context, cu_seqlens), x), None
        q, k, v = self.projections(x, 0 if state is None else state.position)
        state = KVCache.holding(k, v) if state is None else state.extend(k, v)
        y = self.attend(q, state.k, state.v)  # [B, H', T, D'], in fp32 where attend normalises in it
        return self.output(y, x), state

    def projections(self, x: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None):
        """q, k, v [B, H, T, D] of x [B, T, d_model], q and k rotated to positions offset.. (or the given ones)."""
        q, k, v = self.heads(x)
        q, k = self.prepare_qk(q, k)
        if self.rotary is not None:
            q, k = self.rotary(q, offset, positions), self.rotary(k, offset, positions)
        return q, k, v

    def heads(self, x: torch.Tensor):
        """q, k, v [B, H, T, D] of x [B, T, d_model], as projected."""
        B, T, _ = x.shape
        return self.qkv(x).view(B, T, 3, self.cfg.n_heads, self.cfg.head_dim).permute(2, 0, 3, 1, 4)

    def output(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The output projection of attend's y [B, H', T, D'] (gated by x where output_gate), in x's dtype."""
        B, T, _ = x.shape
        y = y.transpose(1, 2).reshape(B, T, -1).to(x.dtype)
        if self.gate is not None:
            y = torch.sigmoid(self.gate(x)) * y
        return self.out_proj(y)

    def prepare_qk(self, q: torch.Tensor, k: torch.Tensor):
        """Per-token transform of q and k before RoPE and scoring (identity here)."""
        return q, k

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def init_state(self, batch: int, device=None, dtype=None) -> KVCache:
        empty = torch.zeros(batch, self.cfg.n_heads, 0, self.cfg.head_dim, device=device, dtype=dtype)
        return marked(self, KVCache.holding(empty, empty.clone()))

    def state_size(self, seq_len: int) -> int:
        return 2 * self.cfg.d_model * seq_len  # one key and one value of width d_model per token
