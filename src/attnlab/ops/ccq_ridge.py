"""The ridge read that CCQ truncates: q_clean_t = (I + lambda_t Sigma_t)^-1 q_t.

CCQ's read (I - lambda Sigma) q is the first-order term of the Neumann series of (I + lambda Sigma)^-1 q, the
regularised least-squares read that MesaNet and Gated KalmaNet compute in full. Both share CCQ's statistics (the
keys' second moment, sum and count up to and including position t, `ccq.CCQStats`), so the ridge read measures what
the truncation costs: the two differ by lambda^2 Sigma^2 q + O(lambda^3) and agree as lambda -> 0. For unit keys
0 <= Sigma <= I, so the system is positive definite for lambda >= 0 and the read shrinks q, as CCQ's does.
Shapes and forms as in `ccq`: `ccq_ridge_reference` (a loop over time) and `ccq_ridge` (every position's Sigma_t a
chunk at a time, one batched solve per chunk: memory chunk x D x D per head).
"""

from __future__ import annotations

import torch

from .ccq import CCQStats, prepare_inputs, split_read
from .packing import autocast_off


def covariance(second, total, count):
    """Sigma = P / n - m m^T / n^2 for P [..., D, D], m [..., D], n [...]."""
    n = count[..., None, None]
    return second / n - total[..., :, None] * total[..., None, :] / n**2


def ridge_read(q, lam, sigma):
    """(I + lam Sigma)^-1 q for q [..., D], lam [...], Sigma [..., D, D]."""
    eye = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device)
    return torch.linalg.solve(eye + lam[..., None, None] * sigma, q[..., None]).squeeze(-1)


@autocast_off
def ccq_ridge_reference(q, k, lam, stats: CCQStats | None = None, log_decay=None):
    """Loop over time: update the statistics with k_t, then read q_t through the ridge. Returns (q_clean, stats)."""
    out_dtype = q.dtype
    q, k, lam, stats, g = prepare_inputs(q, k, lam, stats, log_decay)
    cleaned = []
    for t in range(q.shape[2]):
        stats = stats.added(k[:, :, t], g[:, :, t].exp())
        cleaned.append(ridge_read(q[:, :, t], lam[:, :, t], covariance(stats.second, stats.total, stats.count)))
    q_clean = torch.stack(cleaned, dim=2) if cleaned else q
    return q_clean.to(out_dtype), stats


@autocast_off
def ccq_ridge(q, k, lam, stats: CCQStats | None = None, log_decay=None, chunk_size: int = 64, cu_seqlens=None,
              context=None):
    """Every position's statistics a chunk at a time: within a chunk with cumulative log-decays b and
    Gamma_ij = exp(b_i - b_j) for j <= i (never above 1),
        P_i = exp(b_i) P_prev + sum_{j<=i} Gamma_ij k_j k_j^T,   m_i and n_i alike,
    then one batched solve per chunk; the chunk's last statistics carry to the next. cu_seqlens: packed
    sequences in one row, each from empty statistics, read one after another (none are returned, as `ccq_chunk`);
    context: a rank's shard of a split sequence, as `ccq_chunk`."""
    if context is not None:
        return split_read(ccq_ridge, q, k, lam, log_decay, context, cu_seqlens, chunk_size=chunk_size)
    if cu_seqlens is not None:
        bounds = cu_seqlens.tolist()
        pieces = [ccq_ridge(*(x[:, :, a:b] for x in (q, k, lam)), None,
                            None if log_decay is None else log_decay[:, :, a:b], chunk_size)[0]
                  for a, b in zip(bounds, bounds[1:], strict=False)]
        return torch.cat(pieces, dim=2), None
    out_dtype = q.dtype
    q, k, lam, stats, g = prepare_inputs(q, k, lam, stats, log_decay)
    second, total, count = stats.second, stats.total, stats.count
    cleaned = []
    for start in range(0, q.shape[2], chunk_size):
        part = slice(start, start + chunk_size)
        b = g[:, :, part].cumsum(dim=-1)
        later = torch.ones(b.shape[-1], b.shape[-1], dtype=torch.bool, device=b.device).triu(1)
        gamma = (b[..., :, None] - b[..., None, :]).masked_fill(later, -torch.inf).exp()
        carried, k_c = b.exp(), k[:, :, part]
        second = carried[..., None, None] * second[:, :, None] + torch.einsum(
            "bhij,bhjd,bhje->bhide", gamma, k_c, k_c)
        total = carried[..., None] * total[:, :, None] + gamma @ k_c
        count = carried * count[:, :, None] + gamma.sum(-1)
        cleaned.append(ridge_read(q[:, :, part], lam[:, :, part], covariance(second, total, count)))
        second, total, count = second[:, :, -1], total[:, :, -1], count[:, :, -1]
    q_clean = torch.cat(cleaned, dim=2) if cleaned else q
    return q_clean.to(out_dtype), CCQStats(second, total, count)


