"""S4D (Gu et al. 2022): a diagonal, complex state-space model, per head or channel.

    x_t = lambda * x_{t-1} + B_bar u_t      (M complex modes),      y_t = Re(c . x_t)
with lambda = exp(dt A) and B_bar = (lambda - 1) / A (zero-order hold, B = 1), or the bilinear
transform. The impulse response is the kernel K[tau] = Re sum_n c_n B_bar_n lambda_n^tau, so a whole
sequence is one causal convolution (done with FFTs), and so are sequences packed along time, each from a zero
state (`s4d_fft_sequences`); decoding is the recurrence. `s4d_contract` reads a state of several channels
through learned weights in whichever of these forms a call needs.
Shapes: lam, B_bar, c [H, M] complex; inputs u [B, H, T, D] real (D channels share the SSM of head H).
"""

from __future__ import annotations

import math

import torch

from .cp import split
from .packing import pad_time, span_groups


def s4d_inv_imag(modes: int, inv_uses_2M: bool = False) -> torch.Tensor:
    """S4D-Inv imaginary parts (N/pi)(N/(2n+1) - 1), n = 0..modes-1, with N = modes (as the Interdomain
    paper writes it) or N = 2 * modes (the s4 code, where every frequency is positive)."""
    N = 2 * modes if inv_uses_2M else modes
    n = torch.arange(modes, dtype=torch.float64)
    return (N / math.pi) * (N / (2 * n + 1) - 1)


def s4d_lin_imag(modes: int) -> torch.Tensor:
    """S4D-Lin imaginary parts pi n."""
    return math.pi * torch.arange(modes, dtype=torch.float64)


def discretize(log_dt: torch.Tensor, A: torch.Tensor, method: str = "zoh"):
    """(lambda, B_bar) [H, M] from log step sizes [H] and continuous poles A [H, M] (Re A < 0)."""
    dtA = log_dt.exp()[:, None] * A
    if method == "zoh":
        lam = torch.exp(dtA)
        return lam, (lam - 1) / A
    if method == "bilinear":
        lam = (1 + dtA / 2) / (1 - dtA / 2)
        return lam, log_dt.exp()[:, None] / (1 - dtA / 2)
    raise ValueError(f"unknown discretisation {method!r}: zoh or bilinear")


def powers(lam: torch.Tensor, length: int, start: int = 0) -> torch.Tensor:
    """lambda^tau for tau = start..start+length-1: [H, M, length], by exp(tau log lambda) (a Vandermonde matrix)."""
    tau = torch.arange(start, start + length, device=lam.device, dtype=lam.real.dtype)
    return torch.exp(torch.log(lam)[..., None] * tau)


def s4d_kernel(c: torch.Tensor, lam: torch.Tensor, B_bar: torch.Tensor, length: int) -> torch.Tensor:
    """K [H, length] = Re sum_n c_n B_bar_n lambda_n^tau, the response to a unit impulse."""
    return torch.einsum("hm,hml->hl", c * B_bar, powers(lam, length)).real


def causal_conv(u: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """y_t = sum_{s<=t} K[t-s] u_s along dim 2 of u [B, H, T, D], with kernel [H, T], by zero-padded FFTs."""
    T = u.shape[2]
    n = 2 * T
    spectrum = torch.fft.rfft(u, n=n, dim=2) * torch.fft.rfft(kernel, n=n, dim=-1)[None, :, :, None]
    return torch.fft.irfft(spectrum, n=n, dim=2)[:, :, :T]


def s4d_reference(u, c, lam, B_bar, initial_state=None):
    """Loop over time. u [B, H, T, D] -> (y [B, H, T, D], final state x [B, H, M, D] complex)."""
    B, H, T, D = u.shape
    x = initial_state if initial_state is not None else u.new_zeros(B, H, lam.shape[-1], D, dtype=lam.dtype)
    outputs = []
    for t in range(T):
        x = lam[..., None] * x + B_bar[..., None] * u[:, :, t, None, :]
        outputs.append(torch.einsum("hm,bhmd->bhd", c, x).real)
    return torch.stack(outputs, dim=2), x


def s4d_step(u, c, lam, B_bar, state):
    """One token: u [B, H, D] -> (y [B, H, D], state [B, H, M, D])."""
    state = lam[..., None] * state + B_bar[..., None] * u[:, :, None, :]
    return torch.einsum("hm,bhmd->bhd", c, state).real, state


def s4d_fft(u, c, lam, B_bar, initial_state=None):
    """The convolution form: y = K * u, plus Re sum_n c_n lambda_n^(t+1) x0_n for a carried state.
    The final state is sum_s B_bar lambda^(T-1-s) u_s (+ lambda^T x0), one more Vandermonde contraction."""
    T = u.shape[2]
    y = causal_conv(u, s4d_kernel(c, lam, B_bar, T).to(u.dtype))
    decay = powers(lam, T)  # [H, M, T]
    state = torch.einsum("hm,hms,bhsd->bhmd", B_bar, decay.flip(-1), u.to(lam.dtype))
    if initial_state is not None:
        y = y + torch.einsum("hm,hmt,bhmd->bhtd", c * lam, decay, initial_state).real
        state = state + (lam**T)[..., None] * initial_state
    return y, state


def s4d_fft_sequences(u, c, lam, B_bar, groups):
    """The convolution form over sequences packed along time in u [1, H, N, D], each from a zero state: groups
    lists the sequences' (start, end) spans in batches, and every batch runs as rows padded at their ends to its
    longest (padding after a sequence changes none of its outputs), with the kernel cut to that length.
    -> y [1, H, N, D]; no states (use s4d_fft on a sequence for its state)."""
    longest = max(end - start for group in groups for start, end in group)
    kernel = s4d_kernel(c, lam, B_bar, longest).to(u.dtype)
    outputs = {}
    for group in groups:
        width = max(end - start for start, end in group)
        rows = torch.stack([pad_time(u[0, :, start:end], width, dim=1) for start, end in group])  # [G, H, width, D]
        y = causal_conv(rows, kernel[:, :width])
        for row, (start, end) in enumerate(group):
            outputs[start] = y[row, :, : end - start]
    return torch.cat([outputs[start] for start in sorted(outputs)], dim=1)[None]


def s4d_contract(z, w, C, lam, B_bar, initial_state=None, cu_seqlens=None, context=None):
    """y = sum_m w_m Re(C X_t)[m] = Re(c . X_t) with c = C^T w, over inputs z [B, H, T, width] -> (y, final state):
    one convolution per sequence (packed ones, each from zeros, in batches of similar lengths, no states), the
    recurrence for a single token that continues a state; a rank's shard of a split sequence (context,
    `ops.cp.split`) from the state the ranks before it leave (its powers of lambda: a diagonal transition)."""
    if context is not None:
        return split(s4d_contract, (z,), context, cu_seqlens, diagonal=True, w=w, C=C, lam=lam, B_bar=B_bar)
    c = torch.einsum("hm,hmn->hn", w.to(C.dtype), C)
    if cu_seqlens is not None:
        return s4d_fft_sequences(z, c, lam, B_bar, span_groups(cu_seqlens)), None
    if z.shape[2] == 1 and initial_state is not None:
        o, state = s4d_step(z[:, :, 0], c, lam, B_bar, initial_state)
        return o[:, :, None], state
    return s4d_fft(z, c, lam, B_bar, initial_state)
