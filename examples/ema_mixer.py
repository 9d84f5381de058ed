"""A token mixer added from one file: a multi-head exponential moving average.

    h_t = a * h_{t-1} + (1 - a) * v_t,   y_t = W_o h_t,   v_t = W_v x_t,   a = sigmoid(theta) per head

Importing this file registers the mixer as "ema": `build_mixer("ema", d_model=..., n_heads=...)` builds it,
`model.mixer=ema` puts it in a decoder, and attnlab's contract and property tests cover it (causality,
prefill + decode == forward, gradients, state size, ...) because they enumerate the registry. The state is
h [B, H, D]: constant in the length, like the linear-attention mixers'. It runs through an op that takes a
context (`ops.gla.gla_chunk`), so it splits a sequence across ranks with no code of its own for that.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from attnlab.errors import ConfigError
from attnlab.mixers import Mixer, MixerConfig, register_mixer
from attnlab.ops.gla import gla_chunk


@dataclass
class EMAConfig(MixerConfig):
    decay_init: float = 0.9  # a at the start, the same for every head

    def validate(self) -> None:
        super().validate()
        if not 0.0 < self.decay_init < 1.0:
            raise ConfigError(f"decay_init={self.decay_init} must be in (0, 1): it is a sigmoid")


@register_mixer("ema")
class ExponentialMovingAverage(Mixer):
    """A multi-head exponential moving average of the values, h_t = a h_{t-1} + (1 - a) v_t, a learned per head."""

    config_class = EMAConfig
    splits = True  # its op runs one rank's shard of a sequence split across ranks (context=)

    def __init__(self, cfg: EMAConfig):
        super().__init__(cfg)
        self.v_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)  # reset_parameters scales it for depth
        self.decay_logit = nn.Parameter(torch.full((cfg.n_heads,), math.log(cfg.decay_init / (1 - cfg.decay_init))))

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None, *, cu_seqlens=None, context=None):
        B, T, _ = x.shape
        H, D = self.cfg.n_heads, self.cfg.head_dim
        v = self.v_proj(x).view(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
        h0 = state if state is not None else self.init_state(B, x.device, x.dtype)
        a = torch.sigmoid(self.decay_logit)[:, None, None].to(v.dtype).expand(B, H, T, 1)  # [B, H, T, 1]
        # the average is gated linear attention with a key of one channel: k_t = 1 - a, decay log a, q_t = 1, so
        # the op's state [D_k = 1, D] is h and its output h_t; the op runs a rank's shard given a context
        h, final = gla_chunk(torch.ones_like(a), 1 - a, v, a.log(), scale=1.0, initial_state=h0[:, :, None],
                             cu_seqlens=cu_seqlens, context=context)
        y = self.out_proj(h.transpose(1, 2).reshape(B, T, -1))
        return y, None if cu_seqlens is not None else final[:, :, 0]

    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        return torch.zeros(batch, self.cfg.n_heads, self.cfg.head_dim, device=device, dtype=dtype)

    def state_size(self, seq_len: int) -> int:
        return self.cfg.d_model  # h: one number per channel, whatever the length
