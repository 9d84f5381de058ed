"""The curvature-conditioned query: statistics, the cleaned query, and its three forms."""

import pytest
import torch

from attnlab.ops.ccq import CCQStats, ccq_chunk, ccq_reference, ccq_step, covariance_times
from helpers import assert_same, grads_of


def unit(x):
    return torch.nn.functional.normalize(x, dim=-1)


def ccq_inputs(B=2, H=3, T=29, D=5, seed=0, with_state=True, decay=False):
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    q, k = unit(rand(B, H, T, D)), unit(rand(B, H, T, D))
    lam = torch.rand(B, H, T, generator=g, dtype=torch.float64)
    prior = unit(rand(B, H, 7, D))  # a carried state: the statistics of 7 earlier keys
    second = prior.transpose(-1, -2) @ prior if with_state else torch.zeros(B, H, D, D, dtype=torch.float64)
    total = prior.sum(2) if with_state else torch.zeros(B, H, D, dtype=torch.float64)
    count = torch.full((B, H), 7.0 if with_state else 0.0, dtype=torch.float64)
    log_decay = torch.nn.functional.logsigmoid(rand(B, H, T) + 2) if decay else None
    tensors = [q, k, lam, second, total, count] + ([log_decay] if decay else [])
    return [t.requires_grad_() for t in tensors]


def as_pair(form, **options):
    """Adapt a CCQ form to (outputs, one state tensor) for the shared comparison helper."""

    def run(q, k, lam, second, total, count, log_decay=None):
        q_clean, stats = form(q, k, lam, CCQStats(second, total, count), log_decay=log_decay, **options)
        return q_clean, torch.cat((stats.second.flatten(2), stats.total, stats.count[..., None]), dim=-1)

    return run


def stepped(q, k, lam, stats, log_decay=None):
    outputs = []
    for t in range(q.shape[2]):
        decay_t = None if log_decay is None else log_decay[:, :, t]
        q_t, stats = ccq_step(q[:, :, t], k[:, :, t], lam[:, :, t], stats, decay_t)
        outputs.append(q_t)
    return torch.stack(outputs, dim=2), stats


@pytest.mark.parametrize("decay", [False, True])
@pytest.mark.parametrize("T, chunk", [(29, 8), (32, 16), (3, 64), (1, 4), (17, 1)])
def test_chunk_matches_reference(T, chunk, decay):
    inputs = ccq_inputs(T=T, decay=decay)
    assert_same(grads_of(as_pair(ccq_chunk, chunk_size=chunk), inputs), grads_of(as_pair(ccq_reference), inputs))


@pytest.mark.parametrize("decay", [False, True])
def test_recurrent_step_matches_reference(decay):
    inputs = ccq_inputs(T=11, decay=decay)
    assert_same(grads_of(as_pair(stepped), inputs), grads_of(as_pair(ccq_reference), inputs))


def test_statistics_are_the_population_covariance_of_the_keys_so_far():
    q, k, lam, *_ = (x.detach() for x in ccq_inputs(T=12, with_state=False))
    for t in (1, 2, 7, 12):
        _, stats = ccq_reference(q[:, :, :t], k[:, :, :t], lam[:, :, :t])
        sigma_q = covariance_times(q[0, 1, t - 1], stats.second[0, 1], stats.total[0, 1], stats.count[0, 1])
        cov = torch.cov(k[0, 1, :t].T, correction=0)  # divides by t, the current key included
        torch.testing.assert_close(sigma_q, cov @ q[0, 1, t - 1], rtol=0, atol=1e-12)
        eig = torch.linalg.eigvalsh(cov)
        second_moment = k[0, 1, :t].T @ k[0, 1, :t] / t
        assert eig.min() > -1e-12 and eig.max() <= 1 + 1e-12  # 0 <= Sigma, ||Sigma|| <= 1 for unit keys
        assert torch.linalg.eigvalsh(second_moment - cov).min() > -1e-12  # Sigma <= mean k k^T


def test_covariance_is_the_hessian_of_the_log_partition():
    k = unit(torch.randn(9, 4, dtype=torch.float64))
    log_partition = lambda q: torch.logsumexp(k @ q, dim=0)  # noqa: E731
    zero = torch.zeros(4, dtype=torch.float64)
    hessian = torch.autograd.functional.hessian(log_partition, zero)
    torch.testing.assert_close(hessian, torch.cov(k.T, correction=0), rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.func.grad(log_partition)(zero), k.mean(0), rtol=0, atol=1e-12)


def test_quadratic_parallel_form():
    """Sigma q = (G K)/p - cumsum(K) * rowsum(cumsum(K) * Q)/p^2 with G = tril(Q K^T) (no carried state)."""
    q, k, lam, *_ = (x.detach() for x in ccq_inputs(T=15, with_state=False))
    p = torch.arange(1, 16, dtype=torch.float64)[:, None]
    G = (q @ k.transpose(-1, -2)).tril()
    cum = k.cumsum(2)
    sigma_q = G @ k / p - cum * (cum * q).sum(-1, keepdim=True) / p**2
    q_clean, _ = ccq_chunk(q, k, lam, chunk_size=4)
    torch.testing.assert_close(q_clean, q - lam[..., None] * sigma_q, rtol=0, atol=1e-12)


def test_cleaning_contracts_and_starts_as_the_identity():
    q, k, lam, *_ = (x.detach() for x in ccq_inputs(T=40, with_state=False))
    q_clean, _ = ccq_chunk(q, k, lam, chunk_size=16)
    assert (q_clean.norm(dim=-1) <= q.norm(dim=-1) + 1e-12).all()  # eig(I - lam Sigma) in [1 - lam, 1]
    torch.testing.assert_close(q_clean[:, :, 0], q[:, :, 0], rtol=0, atol=1e-15)  # one key: Sigma = 0
    assert torch.equal(ccq_chunk(q, k, torch.zeros_like(lam))[0], q)  # lambda = 0: the query is untouched


def test_scores_follow_equation_twenty():
    """k_j . q_clean = k_j . q - lam [ (1/t) sum_i (k_j . k_i)(k_i . q) - (k_j . mu)(mu . q) ]."""
    q, k, lam, *_ = (x.detach()[0, 0] for x in ccq_inputs(T=10, with_state=False))
    t = 10
    q_clean, _ = ccq_reference(q[None, None], k[None, None], lam[None, None])
    q_t, lam_t, mu = q[-1], lam[-1], k.mean(0)
    expected = k @ q_t - lam_t * ((k @ k.T) @ (k @ q_t) / t - (k @ mu) * (mu @ q_t))
    torch.testing.assert_close(k @ q_clean[0, 0, -1], expected, rtol=0, atol=1e-12)


def test_toy_retrieval_margin():
    """With Sigma = rho u u^T, the target-minus-distractor margin grows by lam rho (beta - alpha)(u . q)."""
    u = unit(torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    rho, lam = 0.8, 0.3
    sigma = rho * torch.outer(u, u)
    target, distractor = unit(torch.tensor([0.3, 1.0, 0.0], dtype=torch.float64)), u.clone()
    q = target + 0.5 * u
    alpha, beta = target @ u, distractor @ u
    margin = lambda query: target @ query - distractor @ query  # noqa: E731
    q_clean = q - lam * sigma @ q
    torch.testing.assert_close(margin(q_clean) - margin(q), lam * rho * (beta - alpha) * (u @ q))
    assert margin(q_clean) > margin(q)


def test_two_segments_with_carried_statistics_equal_one_pass():
    for decay in (False, True):
        q, k, lam, second, total, count, *rest = (x.detach() for x in ccq_inputs(T=45, decay=decay))
        g = rest[0] if decay else None
        start = CCQStats(second, total, count)
        full, full_stats = ccq_chunk(q, k, lam, start, g, chunk_size=16)
        cut = lambda x, lo, hi: None if x is None else x[:, :, lo:hi]  # noqa: E731
        first, mid = ccq_chunk(q[:, :, :20], k[:, :, :20], lam[:, :, :20], start, cut(g, 0, 20), chunk_size=16)
        rest_q, end = ccq_chunk(q[:, :, 20:], k[:, :, 20:], lam[:, :, 20:], mid, cut(g, 20, 45), chunk_size=16)
        torch.testing.assert_close(torch.cat((first, rest_q), 2), full, rtol=0, atol=1e-12)
        for a, b in ((end.second, full_stats.second), (end.total, full_stats.total), (end.count, full_stats.count)):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("decay", [False, True])
def test_packed_sequences_read_each_from_empty_statistics(decay):
    """cu_seqlens (one row of sequences of 1 to 3 chunks of 8): every sequence's cleaned queries are those it has
    alone, from empty statistics."""
    cu_seqlens = torch.tensor([0, 8, 30, 45, 47])
    q, k, lam, *_, log_decay = ccq_inputs(B=1, T=47, with_state=False, decay=True)
    log_decay = log_decay if decay else None
    q_clean, stats = ccq_chunk(q, k, lam, None, log_decay, chunk_size=8, cu_seqlens=cu_seqlens)
    assert stats is None  # the zeros that move each sequence to its chunk would count
    for a, b in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True):
        alone, _ = ccq_chunk(q[:, :, a:b], k[:, :, a:b], lam[:, :, a:b], None,
                             None if log_decay is None else log_decay[:, :, a:b], chunk_size=8)
        torch.testing.assert_close(q_clean[:, :, a:b], alone, rtol=0, atol=1e-10)
