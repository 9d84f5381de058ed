"""The Curvature-Conditioned Query (Le et al. 2026): a linear-attention read with its query shrunk by the keys'
spread. The query shrinks along the directions in which the keys seen so far vary most.

For L2-normalised queries q_t and keys k_t of one head, with the running key statistics over positions
1..t (the current key included)
    P_t = sum k_j k_j^T,   m_t = sum k_j,   n_t = t,
    Sigma_t q = P_t q / n_t - m_t (m_t . q) / n_t^2          (the keys' population covariance times q)
    q_clean_t = q_t - lambda_t Sigma_t q_t.
Sigma_t is the Hessian at q = 0 of the softmax log-partition log sum_j exp(k_j . q), the term linear
attention drops. The statistics are kept as unnormalised sums and a count so that a sequence can be
continued exactly from a carried state.

Optional ``log_decay`` [B, H, T] (not in the paper, which lists it as future work): the statistics age
with the backbone's gate, P_t = exp(g_t) P_{t-1} + k_t k_t^T and likewise m_t and the count n_t, so
Sigma_t becomes an exponentially weighted covariance.

Shapes: q, k [B, H, T, D]; lam [B, H, T]. Forms: `ccq_reference` (loop over time), `ccq_chunk`
(training) and `ccq_step` (decoding); all take and return `CCQStats`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..nn import at_least_fp32
from .cp import Context, Shard, split
from .packing import aligned, autocast_off, chunk_layout, decay_matrix, to_chunks


@dataclass
class CCQStats:
    """Running key statistics per head: second moment sum [B, H, D, D], key sum [B, H, D], count [B, H]."""

    second: torch.Tensor
    total: torch.Tensor
    count: torch.Tensor

    @staticmethod
    def empty(batch: int, heads: int, dim: int, device=None, dtype=torch.float32) -> CCQStats:
        return CCQStats(torch.zeros(batch, heads, dim, dim, device=device, dtype=dtype),
                        torch.zeros(batch, heads, dim, device=device, dtype=dtype),
                        torch.zeros(batch, heads, device=device, dtype=dtype))

    def added(self, k_t, decay) -> CCQStats:
        """The statistics aged by decay [B, H] and given one more key k_t [B, H, D]."""
        return CCQStats(decay[..., None, None] * self.second + k_t[..., :, None] * k_t[..., None, :],
                        decay[..., None] * self.total + k_t, decay * self.count + 1)

    def to(self, dtype) -> CCQStats:
        return CCQStats(self.second.to(dtype), self.total.to(dtype), self.count.to(dtype))

    def flat(self) -> torch.Tensor:
        """The statistics as one state [B, H, D * D + D + 1], as a sequence split across ranks carries them (one
        decay ages all three: a diagonal transition, `ops.cp`)."""
        return torch.cat([self.second.flatten(-2), self.total, self.count[..., None]], -1)

    @staticmethod
    def from_flat(flat: torch.Tensor) -> CCQStats:
        """The statistics that `flat` made [B, H, D * D + D + 1]: D = isqrt(D * D + D), since D^2 <= D^2 + D <
        (D + 1)^2."""
        d = math.isqrt(flat.shape[-1] - 1)
        return CCQStats(flat[..., : d * d].unflatten(-1, (d, d)), flat[..., d * d : -1], flat[..., -1])


def ccq_shard(op: Callable, q, k, lam, log_decay=None, **options) -> Shard:
    """A shard of a form of the read, op(q, k, lam, stats, log_decay=...) -> (q_clean, CCQStats), for
    `ops.cp.run_shard`: its statistics travel flat, and one decay ages them all (a diagonal transition)."""

    def shard(start, silent=False):
        stats = None if start is None else CCQStats.from_flat(start)
        q_clean, end = op(q, k, lam, stats, log_decay=log_decay, **options)
        return q_clean, end.flat()

    return shard


def split_read(op: Callable, q, k, lam, log_decay, context: Context, cu_seqlens=None, **options):
    """A form of the read, op(q, k, lam, stats, log_decay, cu_seqlens=, **options) -> (q_clean, CCQStats or None),
    over this rank's shard of a split sequence (`ops.cp.split`), its statistics flat (`CCQStats.flat`) and aged by
    one decay (a diagonal transition): (q_clean, the whole sequence's statistics)."""

    def read(q, k, lam, log_decay, initial_state=None, cu_seqlens=None):
        stats = None if initial_state is None else CCQStats.from_flat(initial_state)
        q_clean, end = op(q, k, lam, stats, log_decay, cu_seqlens=cu_seqlens, **options)
        return q_clean, None if end is None else end.flat()  # packed sequences keep no statistics

    q_clean, final = split(read, (q, k, lam, log_decay), context, cu_seqlens, diagonal=True)
    return q_clean, CCQStats.from_flat(final)


def covariance_times(q, second, total, count):
    """Sigma q = P q / n - m (m . q) / n^2 for q [..., D], P [..., D, D], m [..., D], n [...]."""
    n = count[..., None]
    return (second @ q[..., None]).squeeze(-1) / n - total * (total * q).sum(-1, keepdim=True) / n**2


def prepare_inputs(q, k, lam, stats, log_decay):
    """The inputs in one dtype of at least fp32, empty statistics where none are carried, and log-decays of zero
    where the statistics do not age: what every form of the read (this one's and the ridge's) starts from."""
    B, H, T, D = q.shape
    q = at_least_fp32(q)
    dtype = q.dtype
    stats = (stats or CCQStats.empty(B, H, D, q.device, dtype)).to(dtype)
    g = log_decay.to(dtype) if log_decay is not None else q.new_zeros(B, H, T)
    return q, k.to(dtype), lam.to(dtype), stats, g


@autocast_off
def ccq_reference(q, k, lam, stats: CCQStats | None = None, log_decay=None):
    """Loop over time: update the statistics with k_t, then clean q_t. Returns (q_clean, stats)."""
    out_dtype = q.dtype
    q, k, lam, stats, g = prepare_inputs(q, k, lam, stats, log_decay)
    cleaned = []
    for t in range(q.shape[2]):
        stats = stats.added(k[:, :, t], g[:, :, t].exp())
        q_t = q[:, :, t]
        cleaned.append(q_t - lam[:, :, t, None] * covariance_times(q_t, stats.second, stats.total, stats.count))
    q_clean = torch.stack(cleaned, dim=2) if cleaned else q
    return q_clean.to(out_dtype), stats


def ccq_step(q, k, lam, stats: CCQStats, log_decay=None):
    """One token: q, k [B, H, D], lam [B, H], log_decay [B, H] or None -> (q_clean [B, H, D], stats)."""
    q_clean, stats = ccq_reference(q[:, :, None], k[:, :, None], lam[:, :, None], stats,
                                   None if log_decay is None else log_decay[:, :, None])
    return q_clean[:, :, 0], stats


@autocast_off
def ccq_chunk(q, k, lam, stats: CCQStats | None = None, log_decay=None, chunk_size: int = 64, cu_seqlens=None,
              starts=None, context=None):
    """Chunkwise form: within a chunk with cumulative log-decays b and Gamma_ij = exp(b_i - b_j), j <= i,
        P_i q_i = exp(b_i) P_prev q_i + sum_{j<=i} Gamma_ij (q_i . k_j) k_j      (no D x D matrix per token)
        m_i = exp(b_i) m_prev + sum_{j<=i} Gamma_ij k_j,    n_i = exp(b_i) n_prev + sum_{j<=i} Gamma_ij.
    Without decay (the paper's form) Gamma is all ones on and below the diagonal: P_prev is a prefix sum over
    chunks, m_i and n_i are prefix sums over the sequence. The rest runs for all chunks at once.
    cu_seqlens (and starts; see `gla_chunk`): packed sequences, each from empty statistics, and none are returned
    (None): the zeros that move the next sequence to its chunk would count. context: a rank's shard of a split
    sequence, as in `gla_chunk`, returning the whole sequence's statistics.
    """
    if context is not None:
        return split_read(ccq_chunk, q, k, lam, log_decay, context, cu_seqlens, chunk_size=chunk_size)
    if cu_seqlens is not None:
        return aligned(ccq_chunk, cu_seqlens, chunk_size, (q, k, lam, None, log_decay))
    out_dtype = q.dtype
    q, k, lam, stats, g = prepare_inputs(q, k, lam, stats, log_decay)
    B, H, T, D = q.shape
    C, padded = chunk_layout(T, chunk_size)
    qc, kc = (to_chunks(x, C, padded) for x in (q, k))
    keep = None if starts is None else (~starts).to(q.device, q.dtype)
    if log_decay is None and starts is None:
        second_prev, second = _prefix_sums(stats.second, kc.transpose(-1, -2) @ kc)
        second_q = qc @ second_prev.transpose(-1, -2) + (qc @ kc.transpose(-1, -2)).tril() @ kc
        total_i = stats.total[:, :, None] + k.cumsum(dim=2)
        count_i = (stats.count[..., None] + torch.arange(1, T + 1, device=q.device, dtype=q.dtype))[..., None]
        total, count = (total_i[:, :, -1], count_i[:, :, -1, 0]) if T else (stats.total, stats.count)
    else:
        b = to_chunks(g, C, padded).cumsum(dim=-1)  # [B, H, N, C]
        gamma = decay_matrix(b)
        start = b.exp()[..., None]  # decay from the chunk start to each position
        to_end = (b[..., -1:] - b).exp()[..., None]  # weight of each key at the end of its chunk
        chunk_decay = b[..., -1].exp().unbind(2)
        second_prev, second = _scan(stats.second, ((kc * to_end).transpose(-1, -2) @ kc).unbind(2), chunk_decay, keep)
        second_q = start * (qc @ second_prev.transpose(-1, -2)) + ((qc @ kc.transpose(-1, -2)) * gamma) @ kc
        real = to_chunks(torch.ones_like(q[..., 0]), C, padded)  # padded keys must not count
        total_prev, total = _scan(stats.total, (kc * to_end).sum(-2).unbind(2), chunk_decay, keep)
        count_prev, count = _scan(stats.count, (to_end.squeeze(-1) * real).sum(-1).unbind(2), chunk_decay, keep)
        total_i = (start * total_prev[..., None, :] + gamma @ kc).reshape(B, H, padded, D)[:, :, :T]
        count_i = (start * count_prev[..., None, None] + gamma @ real[..., None]).reshape(B, H, padded, 1)[:, :, :T]
    second_q = second_q.reshape(B, H, padded, D)[:, :, :T]
    inv_count = 1 / count_i
    sigma_q = (second_q - total_i * ((total_i * q).sum(-1, keepdim=True) * inv_count)) * inv_count
    q_clean = q - lam[..., None] * sigma_q
    return q_clean.to(out_dtype), None if starts is not None else CCQStats(second, total, count)


def _prefix_sums(initial: torch.Tensor, updates: torch.Tensor):
    """x_{n+1} = x_n + update_n over the chunks of updates [B, H, N, ...]: (the value entering each chunk,
    stacked on dim 2; the last)."""
    after = initial[:, :, None] + updates.cumsum(dim=2)
    return torch.cat((initial[:, :, None], after[:, :, :-1]), dim=2), after[:, :, -1]


def _scan(initial: torch.Tensor, updates, decays, keep=None):
    """x_{n+1} = decay_n x_n + update_n over chunks: (the value entering each chunk, stacked on dim 2; last).
    keep [B, N]: 0 where a chunk begins a packed sequence, whose x enters as zeros."""
    entering = []
    x = initial
    for n, (update, decay) in enumerate(zip(updates, decays, strict=True)):
        if keep is not None:
            x = x * keep[:, n].view(-1, *[1] * (x.ndim - 1))
        entering.append(x)
        x = decay.view(*decay.shape, *[1] * (x.ndim - decay.ndim)) * x + update
    return torch.stack(entering, dim=2), x
