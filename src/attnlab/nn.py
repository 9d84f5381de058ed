"""Small building blocks shared by the decoder and the mixers."""

import math
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """x in fp32, or wider if it already is (the numerics policy for states, sums and partition functions)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def rms_norm_fp32(norm: nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """norm(x) computed in fp32 or wider, its gains cast up alike: the norm of a read from a state, which
    bf16 or fp16 gains and inputs would round again."""
    x = at_least_fp32(x)
    weight = None if norm.weight is None else norm.weight.to(x.dtype)
    return F.rms_norm(x, norm.normalized_shape, weight, norm.eps)


def inverse_softplus(y):
    """softplus^-1(y) = log(exp(y) - 1), written y + log(-expm1(-y)) so that it is exact for small y and does
    not overflow for large y: of a float (in Python floats) or of a tensor."""
    if isinstance(y, torch.Tensor):
        return y + torch.log(-torch.expm1(-y))
    return y + math.log(-math.expm1(-y))


def log_uniform_dt(n: int, dt_min: float, dt_max: float) -> torch.Tensor:
    """n SSM time steps drawn log-uniformly in [dt_min, dt_max] (S4, Mamba), from one torch.rand(n)."""
    return torch.exp(torch.rand(n) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))


def positions_in_sequences(cu_seqlens: torch.Tensor, device=None) -> torch.Tensor:
    """The position of every token of a packed row in its own sequence: [0, 1, .., 0, 1, ..] [N]."""
    cu_seqlens = cu_seqlens.to(device)
    lengths = cu_seqlens.diff()
    return torch.arange(int(cu_seqlens[-1]), device=device) - torch.repeat_interleave(cu_seqlens[:-1], lengths)


def causal_mask(n_queries: int, n_keys: int, device=None, window: int | None = None) -> torch.Tensor:
    """Boolean [n_queries, n_keys] mask (True = attend) for queries that are the last n_queries keys.

    The diagonal offset matters when a cache holds earlier keys: query i sits at key position
    n_keys - n_queries + i and may see every key up to and including that one. With a window, each query
    sees only its last `window` keys (itself included).
    """
    full = torch.ones(n_queries, n_keys, dtype=torch.bool, device=device)
    mask = full.tril(diagonal=n_keys - n_queries)
    if window is not None:
        mask = mask & ~full.tril(diagonal=n_keys - n_queries - window)
    return mask


def no_autocast(device: torch.device):
    """A region where autocast is off (devices without autocast, such as `meta`, need no region)."""
    if not torch.amp.is_autocast_available(device.type):
        return nullcontext()
    return torch.autocast(device.type, enabled=False)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), the Llama feed-forward block."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def reset_parameters(self, n_layers: int = 1) -> None:
        """N(0, 0.02), and 0.02 / sqrt(2 n_layers) for down, which writes into the residual stream (GPT-2)."""
        nn.init.normal_(self.gate.weight, std=0.02)
        nn.init.normal_(self.up.weight, std=0.02)
        nn.init.normal_(self.down.weight, std=0.02 / math.sqrt(2 * n_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class GeluMLP(nn.Module):
    """down(gelu(up(x))), the two-layer feed-forward block of GPT-2 and of the original transformer (with
    biases)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def reset_parameters(self, n_layers: int = 1) -> None:
        """N(0, 0.02) and zero biases, and 0.02 / sqrt(2 n_layers) for down (GPT-2)."""
        nn.init.normal_(self.up.weight, std=0.02)
        nn.init.normal_(self.down.weight, std=0.02 / math.sqrt(2 * n_layers))
        nn.init.zeros_(self.up.bias)
        nn.init.zeros_(self.down.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


# the decoder's choices of feed-forward block (model.ffn_kind) and of norm (model.norm)
FFNS = {"swiglu": SwiGLU, "gelu": GeluMLP}
NORMS = {"rms": nn.RMSNorm, "layer": nn.LayerNorm}


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021), rotate-half layout.

    Channel pair (i, i + D/2) of the vector at position p is rotated by the angle p * base^(-2i/D).
    Mixers that use positions own one of these and pass the absolute position of their first token,
    so that decoding from a state rotates exactly as the full forward does.
    """

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        self.head_dim, self.base = head_dim, base
        self.register_buffer("inv_freq", self._frequencies(), persistent=False)

    def _frequencies(self, device=None) -> torch.Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=device) / self.head_dim
        return (self.base ** -exponents).float()

    def reset_buffers(self) -> None:
        """Recompute the frequencies in place: they are not saved with the weights (for loaders that build
        the model on the meta device, such as transformers')."""
        device = None if self.inv_freq.is_meta else self.inv_freq.device
        self.inv_freq = self._frequencies(device)

    def forward(self, x: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, H, T, D] holding positions offset .. offset + T - 1, or the given positions [T] (packed
        sequences, each counted from its start)."""
        if positions is None:
            positions = torch.arange(offset, offset + x.shape[-2], device=x.device)
        positions = positions.to(x.device, torch.float32)
        angles = positions[:, None] * self.inv_freq[None, :]  # [T, D/2]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class ShortConv(nn.Module):
    """Depthwise causal convolution over time with a small kernel, then SiLU (as in Mamba and fla).

    Its decoding state is the last kernel_size - 1 inputs [B, kernel_size - 1, channels].
    """

    def __init__(self, channels: int, kernel_size: int = 4):
        super().__init__()
        self.kernel_size = kernel_size
        self.conv = nn.Conv1d(channels, channels, kernel_size, groups=channels, bias=False)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
                context=None):
        """x [B, T, channels] -> (y [B, T, channels], state), from state; or the sequences packed in x at
        cu_seqlens, each from zeros, with each one's state (`packed`); or, given a context (`ops.cp.Context`), this
        rank's shard of a split sequence after the previous rank's last inputs, with the whole sequence's last
        (`continued`; cu_seqlens then the whole row's boundaries)."""
        if context is not None:
            before, last = context.boundary(x, self.kernel_size - 1)
            return self.continued(x, before, context.documents(cu_seqlens, x.shape[1]).positions), last
        if cu_seqlens is not None:
            return self.packed(x, cu_seqlens)
        if state is None:
            state = x.new_zeros(x.shape[0], self.kernel_size - 1, x.shape[2])
        window = torch.cat((state.to(x.dtype), x), dim=1)
        y = self.conv(window.transpose(1, 2)).transpose(1, 2)
        return F.silu(y), window[:, window.shape[1] - (self.kernel_size - 1) :]

    def continued(self, x: torch.Tensor, before: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [B, T, channels] after the inputs `before` [B, kernel_size - 1, channels] (another rank's last), each
        token's window reaching back no further than its sequence's start: positions [T], each token's position in
        its sequence (a token at position p reads min(p, kernel_size - 1) earlier inputs)."""
        K, T = self.kernel_size, x.shape[1]
        window = torch.cat((before.to(x.dtype), x), dim=1)
        weight = self.conv.weight[:, 0]  # [channels, K]; tap i reads x_(t-K+1+i)
        reads = positions.to(x.device)[None, :, None]
        return F.silu(sum(window[:, K - 1 - lag : K - 1 - lag + T] * (reads >= lag) * weight[:, K - 1 - lag]
                          for lag in range(K)))

    def packed(self, x: torch.Tensor, cu_seqlens: torch.Tensor):
        """x [1, N, channels] holding sequences that start at cu_seqlens -> (y, the state of each sequence
        [N_seq, kernel_size - 1, channels]): each token's window reads no input before its sequence's start,
        y_t = sum_d w_(K-1-d) x_(t-d) over the lags d the sequence has, as if it started from zeros."""
        K, N = self.kernel_size, x.shape[1]
        position = positions_in_sequences(cu_seqlens, x.device)[None, :, None]
        weight = self.conv.weight[:, 0]  # [channels, K]; tap i reads x_(t-K+1+i)
        y = sum(F.pad(x, (0, 0, lag, 0))[:, :N] * (position >= lag) * weight[:, K - 1 - lag] for lag in range(K))
        starts, ends = cu_seqlens[:-1, None].to(x.device), cu_seqlens[1:, None].to(x.device)
        lags = torch.arange(K - 1, 0, -1, device=x.device)  # a state holds x_(end - K + 1) .. x_(end - 1)
        inside = (ends - lags >= starts)[..., None]  # zeros for the lags before the sequence's start
        return F.silu(y), F.pad(x, (0, 0, K - 1, 0))[0, ends - lags + K - 1] * inside


def set_optim(param: nn.Parameter, **options) -> nn.Parameter:
    """Give a parameter its own optimizer settings (``lr``, ``max_lr``: a cap on the run's learning rate,
    ``weight_decay``), which the training loop puts in a parameter group of their own: e.g. no decay and
    a capped rate for SSM time constants, a separate learning rate for couplings."""
    param._optim = options
    return param


@contextmanager
def overwritten(*settings: tuple[torch.Tensor, float]):
    """Each (parameter, value) pair's parameter filled with value while the block runs, then restored: a
    mechanism's own component switched off for an ablation at evaluation."""
    saved = [param.detach().clone() for param, _ in settings]
    try:
        with torch.no_grad():
            for param, value in settings:
                param.fill_(value)
        yield
    finally:
        with torch.no_grad():
            for (param, _), old in zip(settings, saved, strict=True):
                param.copy_(old)
