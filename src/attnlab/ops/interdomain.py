"""Interdomain attention (Kiyohara et al. 2026): a query-conditioned read of a fixed-size S4D state.

Per head, keys and values are projected onto M learned basis functions by one S4D recurrence over
the concatenated input z_t = [k_t ; v_t] (widths R and D):
    X_t = lambda * X_{t-1} + B_bar z_t^T                      X [M, R + D] complex
    U_t = Re(C X_t[:, :R]),  Gamma_t = Re(C X_t[:, R:])        C [M, M] complex (the learned basis)
    o_t = Gamma_t^T U_t xi(q_t)                                 (no denominator)
All readout conventions reduce to one cheap form: with u = C (X_k xi(q)) in C^M and a = Re(u) ('re_first',
the default), u ('bilinear': Re(xi^T U^T Gamma) with complex U, Gamma) or conj(u) ('hermitian'),
    o = Re((C^T a)^T X_v),
which costs O(M (R + D) + M^2) per token. Shapes: xi_q [B, H, T, R]; z [B, H, T, R + D]; lam, B_bar
[H, M]; C [H, M, M]; states [B, H, M, R + D] complex. Forms: `interdomain_reference` (loop over time,
the naive readout), `interdomain_fft` (all states from one FFT convolution), `interdomain_chunk`
(training: no per-position state beyond a chunk) and `interdomain_step` (decoding); `ops.fla.interdomain_fla`
runs the chunk form's contract on fla's kernels, and `interdomain_read` picks the form a call needs.
"""

from __future__ import annotations

import torch

from .cp import split
from .packing import SequenceStarts, aligned, chunk_layout, to_chunks
from .s4d import causal_conv, powers

READOUTS = ("re_first", "bilinear", "hermitian")


def _coefficients(u: torch.Tensor, readout: str) -> torch.Tensor:
    if readout == "re_first":
        return u.real.to(u.dtype)
    if readout == "bilinear":
        return u
    if readout == "hermitian":
        return u.conj()
    raise ValueError(f"unknown readout {readout!r}; one of {READOUTS}")


def _zeros_state(z, lam):
    B, H, _, width = z.shape
    return z.new_zeros(B, H, lam.shape[-1], width, dtype=lam.dtype)


def interdomain_reference(xi_q, z, lam, B_bar, C, readout="re_first", initial_state=None):
    """Loop over time with the readout written as in the paper: alpha = U xi(q), o = Gamma^T alpha."""
    R = xi_q.shape[-1]
    X = initial_state if initial_state is not None else _zeros_state(z, lam)
    outputs = []
    for t in range(z.shape[2]):
        X = lam[..., None] * X + B_bar[..., None] * z[:, :, t, None, :]
        U, Gamma = C @ X[..., :R], C @ X[..., R:]  # [B, H, M, R], [B, H, M, D] complex
        if readout == "re_first":
            alpha = (U.real @ xi_q[:, :, t, :, None]).squeeze(-1)
            outputs.append((Gamma.real.transpose(-1, -2) @ alpha[..., None]).squeeze(-1))
        else:
            alpha = (U @ xi_q[:, :, t, :, None].to(U.dtype)).squeeze(-1)
            alpha = alpha.conj() if readout == "hermitian" else alpha
            outputs.append((Gamma.transpose(-1, -2) @ alpha[..., None]).squeeze(-1).real)
    return torch.stack(outputs, dim=2), X


def interdomain_step(xi_q, z, lam, B_bar, C, state, readout="re_first"):
    """One token: xi_q [B, H, R], z [B, H, R + D] -> (o [B, H, D], state). O(M (R + D) + M^2)."""
    R = xi_q.shape[-1]
    state = lam[..., None] * state + B_bar[..., None] * z[:, :, None, :]
    u = (C @ (state[..., :R] @ xi_q[..., None].to(state.dtype))).squeeze(-1)  # C (X_k xi) [B, H, M]
    beta = (C.transpose(-1, -2) @ _coefficients(u, readout)[..., None]).squeeze(-1)
    return torch.einsum("bhn,bhnd->bhd", beta, state[..., R:]).real, state


def _read(xi_q, X, C, readout):
    """o_t = Re((C^T a_t)^T X_t[:, R:]) for states X [B, H, T, M, R + D] at every position."""
    R = xi_q.shape[-1]
    u = torch.einsum("hmn,bhtnr,bhtr->bhtm", C, X[..., :R], xi_q.to(X.dtype))
    beta = torch.einsum("hmn,bhtm->bhtn", C, _coefficients(u, readout))
    return torch.einsum("bhtn,bhtnd->bhtd", beta, X[..., R:]).real


def interdomain_fft(xi_q, z, lam, B_bar, C, readout="re_first", initial_state=None):
    """Every state X_t at once: a causal convolution of z with B_bar lambda^tau per mode (by FFT), then the
    readout at every position. Memory O(T M (R + D))."""
    T = z.shape[2]
    kernel = B_bar[..., None] * powers(lam, T)  # [H, M, T] complex
    X = torch.stack([causal_conv(z, kernel[:, m].real) + 1j * causal_conv(z, kernel[:, m].imag)
                     for m in range(lam.shape[-1])], dim=3)  # [B, H, T, M, R + D]
    if initial_state is not None:
        X = X + powers(lam, T, start=1).transpose(-1, -2)[None, :, :, :, None] * initial_state[:, :, None]
    return _read(xi_q, X, C, readout), X[:, :, -1]


def as_real(x: torch.Tensor, dim: int) -> torch.Tensor:
    """A complex vector along dim as the real vector [Re x ; Im x] of twice the length."""
    return torch.cat([x.real, x.imag], dim)


def rotate(rho: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """rho * y for complex rho [..., M] and y stacked as [Re ; Im] along the last dimension [..., 2M]."""
    re, im = y.chunk(2, -1)
    return torch.cat([rho.real * re - rho.imag * im, rho.imag * re + rho.real * im], -1)


def real_matrix(C: torch.Tensor) -> torch.Tensor:
    """[[Re C, -Im C], [Im C, Re C]]: C acting on stacked [Re ; Im] vectors, [..., 2M, 2M]."""
    return torch.cat([torch.cat([C.real, -C.imag], -1), torch.cat([C.imag, C.real], -1)], -2)


def readout_real(u: torch.Tensor, readout: str) -> torch.Tensor:
    """_coefficients on stacked [Re ; Im] vectors."""
    re, im = u.chunk(2, -1)
    if readout == "re_first":
        return torch.cat([re, torch.zeros_like(im)], -1)
    if readout == "bilinear":
        return u
    if readout == "hermitian":
        return torch.cat([re, -im], -1)
    raise ValueError(f"unknown readout {readout!r}; one of {READOUTS}")


def conjugate_real(y: torch.Tensor) -> torch.Tensor:
    """[Re ; -Im], so that Re(beta . x) for complex beta, x is the real dot product of the result with [Re x ; Im x]."""
    re, im = y.chunk(2, -1)
    return torch.cat([re, -im], -1)


def beta_map(C: torch.Tensor, readout: str) -> torch.Tensor:
    """beta = C^T readout(C y) is linear in y: one real [2M, 2M] matrix per head, [H, 2M, 2M], acting on
    stacked [Re y ; Im y] (two products per position become one)."""
    return real_matrix(C.transpose(-1, -2)) @ readout_real(real_matrix(C).mT, readout).mT


def _chunk_kernels(lam, B_bar, K: int):
    """What every chunk of K positions shares: W[tau] = B_bar lambda^tau [H, M, K] complex, W on stacked real modes
    [H, 2M, K], W[i - j] as a lag matrix [H, 2M, K, K] (zero above the diagonal) and lambda^(i+1) [H, 1, K, M]."""
    W = B_bar[..., None] * powers(lam, K)
    W_real = as_real(W, 1)
    steps = torch.arange(K, device=lam.device)
    lag = steps[:, None] - steps[None, :]  # i - j
    W_lag = W_real[:, :, lag.clamp_min(0)] * (lag >= 0).to(lam.real.dtype)
    rise = powers(lam, K, start=1).transpose(-1, -2)[:, None]
    return W, W_real, W_lag, rise


def interdomain_chunk(xi_q, z, lam, B_bar, C, readout="re_first", initial_state=None, chunk_size: int = 64,
                      cu_seqlens=None, starts=None):
    """Chunkwise scan. Within a chunk (local rows i, j < K) with carried state X0 and W[tau] = B_bar lambda^tau:
        u_i   = C (lambda^(i+1) X0_k xi_i + sum_{j<=i} W[i-j] (k_j . xi_i)),   a_i = readout(u_i)
        beta_i = C^T a_i
        o_i   = Re(beta_i . lambda^(i+1) X0_v) + sum_{j<=i} Re(beta_i . W[i-j]) v_j
        X0   <- lambda^K X0 + sum_j W[K-1-j] z_j^T.
    Only chunk-boundary states exist; only non-negative powers of lambda appear. The big products run in
    real arithmetic on complex mode vectors stacked as [Re ; Im] (2M real modes; real BLAS, several times
    faster than complex einsums on a CPU); only the serial carry between chunks stays complex.
    cu_seqlens (and starts; see `gla_chunk`): packed sequences, X0 zeros at every chunk that begins one, and no
    state is returned (None): padding after a sequence would have decayed it."""
    if cu_seqlens is not None:
        return aligned(interdomain_chunk, cu_seqlens, chunk_size, (xi_q, z), lam, B_bar, C, readout)
    B, H, T, _ = z.shape
    R = xi_q.shape[-1]
    K, padded = chunk_layout(T, chunk_size)
    N = padded // K
    zc, qc = (to_chunks(x, K, padded).to(lam.real.dtype) for x in (z, xi_q))
    W, W_real, W_lag, rise = _chunk_kernels(lam, B_bar, K)

    # chunk-end states: a serial pass over chunk boundaries only (contributions computed in parallel)
    contributions = torch.einsum("hmj,bhgjc->bhgmc", W_real.flip(-1), zc)
    contributions = torch.complex(*contributions.chunk(2, dim=3))  # [B, H, N, M, R + D]
    X = initial_state.to(lam.dtype) if initial_state is not None else _zeros_state(z, lam)
    scan, entering = SequenceStarts(starts, X), []
    for n, contribution in enumerate(contributions.unbind(2)):
        X = scan.entering(n, X)
        entering.append(X)
        X = (lam**K)[..., None] * X + contribution
    X0 = torch.stack(entering, dim=2)  # [B, H, N, M, R + D]  (index g below: the chunk)
    # the final state ends at T, not at the padded end (padding cannot stop lambda from decaying the state)
    r = T - (N - 1) * K
    final = None if starts is not None else (
        (lam**r)[..., None] * entering[-1] + torch.einsum("hmj,bhjc->bhmc", W[..., :r].flip(-1),
                                                          zc[:, :, -1, :r].to(lam.dtype)))
    X0 = as_real(X0, 3)  # [B, H, N, 2M, R + D]

    scores = qc @ zc[..., :R].transpose(-1, -2)  # xi_i . k_j: [B, H, N, K, K]
    carried_k = rotate(rise, torch.einsum("bhgmr,bhgir->bhgim", X0[..., :R], qc))
    beta = torch.einsum("hpm,bhgim->bhgip", beta_map(C, readout),
                        carried_k + torch.einsum("hmij,bhgij->bhgim", W_lag, scores))
    mix = torch.einsum("bhgip,hpij->bhgij", conjugate_real(beta), W_lag)  # Re(beta_i . W[i-j]): [B, H, N, K, K]
    o = mix @ zc[..., R:]
    o = o + torch.einsum("bhgim,bhgmd->bhgid", conjugate_real(rotate(rise, beta)), X0[..., R:])
    return o.reshape(B, H, padded, -1)[:, :, :T], final


def interdomain_read(xi_q, z, lam, B_bar, C, readout="re_first", initial_state=None, chunk_size: int = 64,
                     cu_seqlens=None, context=None, fft: bool = False, chunk=interdomain_chunk):
    """The read in the form that suits the call: the step for one token that continues a state, the FFT form
    (where asked, on one sequence), else the chunk form `chunk` (ours, or `ops.fla.interdomain_fla`), which takes
    packed sequences; a rank's shard of a split sequence (context, `ops.cp.split`) in pieces of these, from the
    state the ranks before it leave (lambda's powers: a diagonal transition)."""
    if context is not None:
        return split(interdomain_read, (xi_q, z), context, cu_seqlens, diagonal=True, lam=lam, B_bar=B_bar, C=C,
                     readout=readout, chunk_size=chunk_size, fft=fft, chunk=chunk)
    if cu_seqlens is None and z.shape[2] == 1 and initial_state is not None:
        o, state = interdomain_step(xi_q[:, :, 0], z[:, :, 0], lam, B_bar, C, initial_state, readout)
        return o[:, :, None], state
    if cu_seqlens is None and fft:
        return interdomain_fft(xi_q, z, lam, B_bar, C, readout, initial_state)
    return chunk(xi_q, z, lam, B_bar, C, readout, initial_state, chunk_size, cu_seqlens=cu_seqlens)
