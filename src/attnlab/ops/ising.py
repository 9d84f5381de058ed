"""Marginals of the Ising models behind Boltzmann attention (Kim & Park 2026).

For one query, key positions j = 0..n-1 carry spins s_j in {-1, +1} with
    E(s) = - sum_j h_j s_j - sum_{j<k} J_jk s_j s_k  [- sum_{j<k<l} K_jkl s_j s_k s_l],   P(s) ∝ exp(-E(s)),
and the attention weight of key j is its marginal alpha_j = P(s_j = +1) = (<s_j> + 1) / 2.
Only the strict upper triangle of J (and of K) enters. Everything is computed in the log domain.

- Exact enumeration of all 2^n configurations (`log_marginals`; `causal_log_weights`, whose sums over the
  configurations, forward and backward, run on the configurations of two halves of the spins).
- Exact marginals for banded couplings (J_jk = 0 for k - j > w) by a forward-backward pass over the
  2^w states of the last w spins, O(n 2^w) per query (`banded_log_marginals`; `ising_triton` runs it as
  Triton kernels on a GPU).
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
MERGED_ROWS = 2**18  # causal_log_weights: short prefixes share one table while it holds at most this many log-weights


@functools.lru_cache(maxsize=64)
def _tables(n: int, device: str, dtype: torch.dtype):
    """configurations(n) [2^n, n] and its indicators [s = +1] = (s + 1) / 2, cached."""
    spins = _configurations(n, device).to(dtype)
    return spins, (spins + 1) / 2


class _NormalisedMarginals(torch.autograd.Function):
    """log alpha_j / sum_k alpha_k [B, H, R, n] by enumeration, from log-weights given in split form.

    Configuration c = (c_hi, c_lo) holds spins 0..lo-1 in the bits of c_lo and lo..n-1 in those of c_hi;
    its log-weight (-E) is L = high[c_hi] + low[c_lo] + pair[c_hi, c_lo]: high [B, H, R, 2^hi] and low
    [B, H, R, 2^lo] the terms within each half (-inf for configurations to leave out), pair [.., 2^hi, 2^lo]
    the rest, broadcast over B (None: nothing). present [R, n]: the spins whose weights are wanted (the
    others give -inf); plus_hi, plus_lo: the indicators [s = +1] of each half's configurations.

    With w = exp(L - max L), alpha_j = P_j / Z with P_j = sum_c w_c [s_j = +1], and Z cancels in the
    normalisation: log alpha_tilde = log P - log sum_k P_k. The all-minus configuration enters no P_j and is
    left out, so the largest w is a term of some P_j and sum_k P_k >= 1 whatever the fields. Log-weights
    more than -log(2 tiny) (87 in fp32) below the largest are raised to that floor, which keeps exp off its
    slow subnormal path and changes P by under 2^(n+1) tiny. P of the low spins is (w summed over c_hi) @
    plus_lo, and likewise for the high ones; the backward, dloss/dL_c = w_c sum_j a_j [s_cj = +1] with
    a = dloss/dP, is again an outer sum (times w).
    """

    @staticmethod
    def forward(ctx, high, low, pair, present, plus_hi, plus_lo):
        log2e = 1 / math.log(2)  # w = 2^(L log2 e - max): exp2 is several times faster than exp on CPUs
        L = (high * log2e)[..., :, None] + (low * log2e)[..., None, :]
        if pair is not None:
            L += pair * log2e
        L[..., 0, 0] = float("-inf")  # all spins -1
        L -= L.amax((-2, -1), keepdim=True)  # exact: the result does not depend on a shift of L
        w = L.clamp_(min=math.log2(torch.finfo(L.dtype).tiny) + 1).exp2_()  # 2 tiny: 2^x below tiny is slow
        P = torch.cat((w.sum(-2) @ plus_lo, w.sum(-1) @ plus_hi), dim=-1) * present
        ctx.save_for_backward(w, P, present, plus_hi, plus_lo)
        ctx.pair_shape = None if pair is None else pair.shape
        return P.log() - P.sum(-1, keepdim=True).log()

    @staticmethod
    def backward(ctx, grad):
        w, P, present, plus_hi, plus_lo = ctx.saved_tensors
        a = torch.where(P > 0, grad / P, 0) - grad.sum(-1, keepdim=True) / P.sum(-1, keepdim=True)  # dloss/dP
        a = a * present  # spins past a row's prefix are not in its output
        lo = plus_lo.shape[-1]
        grad_L = ((a[..., lo:] @ plus_hi.T)[..., :, None] + (a[..., :lo] @ plus_lo.T)[..., None, :]).mul_(w)
        grad_pair = None if ctx.pair_shape is None else grad_L.sum_to_size(ctx.pair_shape)
        return grad_L.sum(-1), grad_L.sum(-2), grad_pair, None, None, None


def _prefix_groups(Tq: int, S: int, batch: int) -> list[tuple[int, int]]:
    """Row ranges [r0, r1) of causal_log_weights enumerated together in the table of their longest prefix:
    the short prefixes, while that table (for `batch` sequences and heads) holds at most MERGED_ROWS."""
    groups, start = [], 0
    for stop in range(2, Tq + 1):
        if (stop - start) * 2 ** (S - Tq + stop) * batch > MERGED_ROWS:
            groups.append((start, stop - 1))
            start = stop - 1
    return groups + [(start, Tq)]


def causal_log_weights(h, J=None, K=None, memory_budget: int = DEFAULT_MEMORY_BUDGET):
    """Boltzmann attention weights by exact enumeration with causal prefixes.

    h [B, H, Tq, S]: fields of Tq queries, which are the last Tq of S positions; query r sees keys
    0..p with p = S - Tq + r, and its Ising model holds those p + 1 spins and the leading block of
    J [H, S', S'] and K [H, S', S', S'] (S' >= S). Returns log alpha_tilde [B, H, Tq, S]: the
    log of alpha_j / sum_k alpha_k over the visible keys, -inf for the invisible ones.
    Queries with short prefixes share one enumeration of n spins (`_prefix_groups`), the spins past each
    one's prefix held at -1, uncoupled. The batch is processed in pieces so that at most `memory_budget`
    bytes of log-weights exist at once.
    """
    B, H, Tq, S = h.shape
    bytes_per_row = H * 2**S * h.element_size() * 3  # log-weights, their exp in the backward, slack
    if bytes_per_row > memory_budget:
        raise UserError(
            f"exact Boltzmann inference enumerates 2^{S} configurations per query, {bytes_per_row / 2**30:.1f} GiB "
            f"for one sequence, above the memory budget of {memory_budget / 2**30:.1f} GiB (memory_budget_gib); "
            "use inference=banded (couplings within a band), mean-field or dqa, or a shorter window"
        )
    out = []
    for r0, r1 in _prefix_groups(Tq, S, B * H):
        n = S - Tq + r1  # spins 0..lo-1 are the low half, lo..n-1 the high one
        lo = n // 2
        (s_lo, plus_lo), (s_hi, plus_hi) = (_tables(k, str(h.device), h.dtype) for k in (lo, n - lo))
        lengths = torch.arange(S - Tq + r0 + 1, n + 1, device=h.device)[:, None]  # of the rows' prefixes [R, 1]
        present = torch.arange(n, device=h.device) < lengths  # [R, n]
        pairs = present[:, :, None] & present[:, None, :]
        # -E within each half (fields, J) and across the halves (J, and K anywhere)
        fields = h[:, :, r0:r1, :n] * present
        J_r = None if J is None else J[:, None, :n, :n] * pairs  # [H, R, n, n]; upper triangles read below
        low = fields[..., :lo] @ s_lo.T + coupling_energy(s_lo, None if J is None else J_r[..., :lo, :lo])
        high = fields[..., lo:] @ s_hi.T + coupling_energy(s_hi, None if J is None else J_r[..., lo:, lo:])
        pair = None if J is None else s_hi @ J_r[..., :lo, lo:].transpose(-1, -2) @ s_lo.T  # [H, R, 2^hi, 2^lo]
        if K is not None:
            K_r = K[:, None, :n, :n, :n] * (pairs[..., None] & present[:, None, None, :])
            three = coupling_energy(_tables(n, str(h.device), h.dtype)[0], None, K_r).unflatten(-1, (2 ** (n - lo), -1))
            pair = three if pair is None else pair + three
        # leave out the configurations with a spin past the prefix at +1
        low = low.masked_fill(torch.arange(2**lo, device=h.device) >= 2 ** lengths.clamp(max=lo), float("-inf"))
        high = high.masked_fill(torch.arange(2 ** (n - lo), device=h.device) >= 2 ** (lengths - lo).clamp(min=0),
                                float("-inf"))
        piece = max(1, memory_budget // (H * (r1 - r0) * 2**n * h.element_size() * 3))
        rows = [_NormalisedMarginals.apply(high[b : b + piece], low[b : b + piece], pair, present, plus_hi, plus_lo)
                for b in range(0, B, piece)]
        out.append(torch.nn.functional.pad(torch.cat(rows), (0, S - n), value=float("-inf")))
    return torch.cat(out, dim=2)


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
