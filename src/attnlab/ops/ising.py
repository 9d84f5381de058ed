"""Marginals of the Ising models behind Boltzmann attention (Kim & Park 2026).

For one query, key positions j = 0..n-1 carry spins s_j in {-1, +1} with
    E(s) = - sum_j h_j s_j - sum_{j<k} J_jk s_j s_k  [- sum_{j<k<l} K_jkl s_j s_k s_l],   P(s) ∝ exp(-E(s)),
and the attention weight of key j is its marginal alpha_j = P(s_j = +1) = (<s_j> + 1) / 2.
Only the strict upper triangle of J (and of K) enters. Everything is computed in the log domain.

- Exact enumeration of all 2^n configurations (`log_marginals`, `causal_log_weights`).
- Exact marginals for banded couplings (J_jk = 0 for k - j > w) by a forward-backward pass over the
  2^w states of the last w spins, O(n 2^w) per query (`banded_log_marginals`).
- A differentiable mean-field approximation for any n (`mean_field_fields`).
- The covariance form of the gradient (`ising_vjp`), so that a sampler can supply gradients.
"""

from __future__ import annotations

import functools
import math

import torch

from ..errors import UserError

# ------------------------------------------------------------------------------------------------------
# exact enumeration


@functools.lru_cache(maxsize=32)
def _configurations(n: int, device: str) -> torch.Tensor:
    codes = torch.arange(2**n, device=device)[:, None]
    bits = (codes >> torch.arange(n, device=device)) & 1  # spin j is bit j of the configuration index
    return (2 * bits - 1).to(torch.int8)


def configurations(n: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """All 2^n spin configurations [2^n, n]; row c has s_j = +1 where bit j of c is set."""
    return _configurations(n, str(torch.device(device or "cpu"))).to(dtype)


def strict_triples(n: int, device=None) -> torch.Tensor:
    """Boolean [n, n, n] mask of the index triples j < k < l, the entries of K that enter the energy."""
    idx = torch.arange(n, device=device)
    return (idx[:, None, None] < idx[None, :, None]) & (idx[None, :, None] < idx[None, None, :])


def coupling_energy(spins: torch.Tensor, J: torch.Tensor | None = None, K: torch.Tensor | None = None):
    """sum_{j<k} J_jk s_j s_k + sum_{j<k<l} K_jkl s_j s_k s_l for every configuration.

    spins [C, n]; J [..., n, n]; K [..., n, n, n] -> [..., C]. Lower triangles and diagonals are ignored.
    """
    energy = spins.new_zeros(spins.shape[0])
    if J is not None:
        energy = energy + torch.einsum("cj,...jk,ck->...c", spins, J.triu(1), spins)
    if K is not None:
        strict = strict_triples(spins.shape[-1], spins.device)
        energy = energy + torch.einsum("cj,ck,cl,...jkl->...c", spins, spins, spins, K * strict)
    return energy


def log_marginals(h: torch.Tensor, energy: torch.Tensor | float = 0.0):
    """Exact log P(s_j = +1) [..., n] and log Z [...] from fields h [..., n] and the coupling part of
    -E for every configuration, energy [..., 2^n] (broadcast), by enumeration in the log domain."""
    n = h.shape[-1]
    spins = configurations(n, h.device, h.dtype)
    log_weight = h @ spins.T + energy  # [..., 2^n]
    log_z = torch.logsumexp(log_weight, dim=-1)
    batch = log_weight.shape[:-1]
    plus = []
    for j in range(n):  # configurations with bit j set form a strided half of the table
        half = log_weight.reshape(*batch, 2 ** (n - 1 - j), 2, 2**j)[..., 1, :]
        plus.append(torch.logsumexp(half, dim=(-2, -1)))
    return torch.stack(plus, dim=-1) - log_z[..., None], log_z


DEFAULT_MEMORY_BUDGET = 2 * 2**30  # bytes of configuration log-weights held at once in exact inference


@functools.lru_cache(maxsize=64)
def _nonempty_configurations(n: int, device: str, dtype: torch.dtype):
    """Spins [2^n - 1, n] of configurations 1..2^n - 1 (all but the all-minus one) and their indicators (s + 1) / 2."""
    spins = _configurations(n, device)[1:].to(dtype)
    return spins, (spins + 1) / 2


class _NormalisedMarginals(torch.autograd.Function):
    """log alpha_j / sum_k alpha_k [..., n] from fields h [..., n] and coupling energies [..., C] of the
    configurations in `spins` [C, n] (all but the all-minus one; `plus` = (spins + 1) / 2).

    With log-weights L = h s + energy and w = exp(L - max L), alpha_j = P_j / Z with P = w @ plus, and Z
    cancels in the normalisation: log alpha_tilde = log P - log sum_k P_k. The all-minus configuration
    enters no P_j, so the maximum is taken without it: the largest remaining w is 1 and sum_k P_k >= 1,
    whatever the fields. A P_j below the smallest normal number (alpha_tilde_j < ~1e-38 in fp32) is
    clamped to it. Backward: with a = dloss/dP, dloss/dL = w * (a @ plus^T), dloss/dh = (dloss/dL) @ spins.
    """

    @staticmethod
    def forward(ctx, h, energy, spins, plus):
        w = h @ spins.T
        w += energy
        w -= w.amax(-1, keepdim=True)  # exact: the result does not depend on a shift of L
        w.exp_()
        P = w @ plus
        tiny = torch.finfo(P.dtype).tiny
        ctx.save_for_backward(w, P, spins, plus)
        ctx.energy_shape = energy.shape
        return P.clamp_min(tiny).log() - P.sum(-1, keepdim=True).log()

    @staticmethod
    def backward(ctx, grad):
        w, P, spins, plus = ctx.saved_tensors
        seen = P > torch.finfo(P.dtype).tiny  # the clamped P_j get no gradient
        a = torch.where(seen, grad / P, 0) - grad.sum(-1, keepdim=True) / P.sum(-1, keepdim=True)
        grad_L = (a @ plus.T).mul_(w)
        grad_h = grad_L @ spins if ctx.needs_input_grad[0] else None
        grad_energy = grad_L.sum_to_size(ctx.energy_shape) if ctx.needs_input_grad[1] else None
        return grad_h, grad_energy, None, None


def causal_log_weights(h, J=None, K=None, memory_budget: int = DEFAULT_MEMORY_BUDGET):
    """Boltzmann attention weights by exact enumeration with causal prefixes.

    h [B, H, Tq, S]: fields of Tq queries, which are the last Tq of S positions; query r sees keys
    0..p with p = S - Tq + r, and its Ising model holds those p + 1 spins and the leading block of
    J [H, S', S'] and K [H, S', S', S'] (S' >= S). Returns log alpha_tilde [B, H, Tq, S]: the
    log of alpha_j / sum_k alpha_k over the visible keys, -inf for the invisible ones.
    The batch is processed in pieces so that at most `memory_budget` bytes of log-weights exist at once.
    """
    B, H, Tq, S = h.shape
    bytes_per_row = H * 2**S * h.element_size() * 3  # log-weights, their exp in the backward, slack
    if bytes_per_row > memory_budget:
        raise UserError(
            f"exact Boltzmann inference enumerates 2^{S} configurations per query, {bytes_per_row / 2**30:.1f} GiB "
            f"for one sequence, above the memory budget of {memory_budget / 2**30:.1f} GiB (memory_budget_gib); "
            "use inference=banded (couplings within a band), mean-field or dqa, or a shorter window"
        )
    piece = max(1, min(B, memory_budget // bytes_per_row))
    rows = []
    for r in range(Tq):
        n = S - Tq + r + 1
        spins, plus = _nonempty_configurations(n, str(h.device), h.dtype)
        J_n = None if J is None else J[:, :n, :n]
        K_n = None if K is None else K[:, :n, :n, :n]
        energy = coupling_energy(spins, J_n, K_n)  # [H, 2^n - 1], or [2^n - 1] zeros without couplings
        h_n = h[:, :, r, :n]
        row = torch.cat([_NormalisedMarginals.apply(h_n[b : b + piece], energy, spins, plus)
                         for b in range(0, B, piece)], dim=0)
        rows.append(torch.nn.functional.pad(row, (0, S - n), value=float("-inf")))
    return torch.stack(rows, dim=2)


# ------------------------------------------------------------------------------------------------------
# banded couplings: forward-backward over the states of the last w spins


def band_couplings(J: torch.Tensor, width: int) -> torch.Tensor:
    """J [..., n, n] -> Jb [..., n, w] with Jb[k, d - 1] = J[k - d, k] (0 before the first spin)."""
    n = J.shape[-1]
    cols = []
    for d in range(1, width + 1):
        diag = torch.diagonal(J, offset=d, dim1=-2, dim2=-1)  # J[k - d, k] for k = d..n-1
        cols.append(torch.nn.functional.pad(diag, (min(d, n), 0))[..., :n])
    return torch.stack(cols, dim=-1)


def banded_log_marginals(h: torch.Tensor, Jb: torch.Tensor):
    """Exact log P(s_j = +1) [Q, n] for couplings only between spins at most w apart.

    h [Q, n]; Jb [Q or 1, n, w] from `band_couplings`. The state after spin j holds spins j..j-w+1
    (bit d = spin j - d; spins before the first are free and change nothing). Forward messages
    a_j(state) = log-sum over earlier spins, backward messages b_j(state) = log-sum over later ones;
    log P(s_j = +1) = logsumexp over states with bit 0 set of a_j + b_j, minus log Z.
    """
    Q, n = h.shape
    w = Jb.shape[-1]
    states = configurations(w, h.device, h.dtype)  # [2^w, w]: spin of bit d in each state
    # s_new * (h_j + sum_d J_{j-d, j} s_{j-d}) for every previous state and both new spins: [Q, n, 2^w, 2]
    local = h[..., None] + torch.einsum("sd,qnd->qns", states, Jb.expand(Q, n, w))
    new_spin = torch.tensor([-1.0, 1.0], dtype=h.dtype, device=h.device)
    steps = (local[..., None] * new_spin).unbind(1)  # unbound once: indexing in the loops would make
    half = 2 ** (w - 1)  # the backward quadratic in n

    forward = [h.new_zeros(Q, 2**w)]  # before spin 0 the w "previous" spins are free
    for step in steps:  # sum out the dropped (oldest) spin; logaddexp is the two-term logsumexp in one kernel
        total = (forward[-1][..., None] + step).reshape(Q, 2, half, 2)  # [dropped bit, kept bits, new bit]
        forward.append(torch.logaddexp(total[:, 0], total[:, 1]).reshape(Q, 2**w))
    backward = [h.new_zeros(Q, 2**w)]
    for step in steps[:0:-1]:  # sum out the next spin
        total = step.reshape(Q, 2, half, 2) + backward[-1].reshape(Q, 1, half, 2)  # next state = (kept, new)
        backward.append(torch.logaddexp(total[..., 0], total[..., 1]).reshape(Q, 2**w))
    backward = backward[::-1]
    log_z = torch.logsumexp(forward[-1], dim=-1)
    plus = [torch.logsumexp((forward[j + 1] + backward[j]).reshape(Q, half, 2)[..., 1], dim=-1) for j in range(n)]
    return torch.stack(plus, dim=-1) - log_z[:, None]


# ------------------------------------------------------------------------------------------------------
# mean field


def mean_field_fields(h, J=None, K=None, mask=None, iterations: int = 30, damping: float = 0.5):
    """Naive mean field. Returns the effective fields phi [..., n], with magnetisations m = tanh(phi):
        phi = h + J_sym m [+ 1/2 sum_{k,l} K_sym[j,k,l] m_k m_l],   m <- (1 - damping) m + damping tanh(phi),
    damped fixed-point iterations from m = tanh(h), unrolled so that they are differentiable.
    h [..., n]; J [..., n, n] and K [..., n, n, n] act on the last dimension of h through matrix products,
    so for h [B, H, T, n] they may be per head, [H, n, n] (strict upper triangles used); mask [..., n]
    marks the spins that exist (others are held at m = 0). Exact without couplings.
    """
    mask = torch.ones_like(h) if mask is None else mask.to(h.dtype)
    if J is None and K is None:
        return h
    J_sym = None if J is None else J.triu(1) + J.triu(1).transpose(-1, -2)
    K_sym = None
    if K is not None:
        K_up = K * strict_triples(h.shape[-1], h.device)
        lead = list(range(K.ndim - 3))
        K_sym = sum(K_up.permute(*lead, *[K.ndim - 3 + a for a in order]) for order in
                    [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)])
    n = h.shape[-1]
    K_flat = None if K_sym is None else K_sym.reshape(*K_sym.shape[:-3], n, n * n).transpose(-1, -2)
    m = torch.tanh(h) * mask
    for _ in range(iterations):
        phi = h
        if J_sym is not None:
            phi = phi + m @ J_sym  # sum_k J_jk m_k (J_sym is symmetric)
        if K_flat is not None:  # 1/2 sum_{k,l} K_jkl m_k m_l
            phi = phi + 0.5 * (m[..., :, None] * m[..., None, :]).flatten(-2) @ K_flat
        m = ((1 - damping) * m + damping * torch.tanh(phi)) * mask
    return phi


# ------------------------------------------------------------------------------------------------------
# gradients as connected correlations


def ising_vjp(spins: torch.Tensor, weights: torch.Tensor, grad_m: torch.Tensor):
    """Gradients of a loss through the magnetisations m = E_p[s], with p ∝ exp(-E):
        dL/dh_k = Cov_p(g . s, s_k),    dL/dJ_jk = Cov_p(g . s, s_j s_k)   (j < k),   g = dL/dm.
    spins [Q, N, n] are configurations (all 2^n, or N samples); weights [Q, N] their probabilities
    (exact) or 1/N (samples). Returns (grad_h [Q, n], grad_J [Q, n, n] upper triangle)."""
    w = weights[..., None]
    score = (spins * grad_m[:, None, :]).sum(-1, keepdim=True)  # g . s per configuration
    centred = score - (w * score).sum(1, keepdim=True)
    grad_h = (w * centred * spins).sum(1)
    grad_J = torch.einsum("qc,qcj,qck->qjk", (w * centred).squeeze(-1), spins, spins).triu(1)
    return grad_h, grad_J


def two_spin_magnetisation(h1: float, h2: float, J: float) -> float:
    """<s_1> of two spins, closed form: [e^J sinh(h1+h2) + e^-J sinh(h1-h2)] / [e^J cosh(h1+h2) + e^-J cosh(h1-h2)]."""
    num = math.exp(J) * math.sinh(h1 + h2) + math.exp(-J) * math.sinh(h1 - h2)
    return num / (math.exp(J) * math.cosh(h1 + h2) + math.exp(-J) * math.cosh(h1 - h2))
