"""The ridge read (I + lambda Sigma)^-1 q: its chunked form against the loop, a carried state, packed sequences, the
first-order read CCQ uses as its truncation, and the shrinking it shares with it."""

import pytest
import torch

from attnlab.ops.ccq import ccq_reference
from attnlab.ops.ccq_ridge import ccq_ridge, ccq_ridge_reference, covariance


def inputs(T=21, D=6, decay=False, seed=0):
    torch.manual_seed(seed)
    q, k = (torch.nn.functional.normalize(torch.randn(2, 3, T, D, dtype=torch.float64), dim=-1) for _ in range(2))
    lam = torch.rand(2, 3, T, dtype=torch.float64)
    log_decay = -torch.rand(2, 3, T, dtype=torch.float64) * 0.5 if decay else None
    return q, k, lam, log_decay


@pytest.mark.parametrize("decay", [False, True])
@pytest.mark.parametrize("chunk_size", [4, 64])  # chunks that do not divide T, and one chunk
def test_the_chunked_form_matches_the_loop_with_its_gradients(decay, chunk_size):
    q, k, lam, log_decay = inputs(decay=decay)
    q, k, lam = (x.requires_grad_() for x in (q, k, lam))
    q_clean, stats = ccq_ridge(q, k, lam, log_decay=log_decay, chunk_size=chunk_size)
    q_ref, stats_ref = ccq_ridge_reference(q, k, lam, log_decay=log_decay)
    torch.testing.assert_close(q_clean, q_ref)
    for mine, ref in zip((stats.second, stats.total, stats.count), (stats_ref.second, stats_ref.total, stats_ref.count),
                         strict=True):
        torch.testing.assert_close(mine, ref)
    weight = torch.randn_like(q_clean)
    grads = torch.autograd.grad((q_clean * weight).sum(), (q, k, lam))
    grads_ref = torch.autograd.grad((q_ref * weight).sum(), (q, k, lam))
    for grad, grad_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(grad, grad_ref)


@pytest.mark.parametrize("form", [ccq_ridge, ccq_ridge_reference])
def test_a_sequence_continued_from_its_carried_statistics_reads_as_a_whole(form):
    q, k, lam, log_decay = inputs(decay=True)
    whole, _ = form(q, k, lam, log_decay=log_decay)
    first, stats = form(q[:, :, :9], k[:, :, :9], lam[:, :, :9], log_decay=log_decay[:, :, :9])
    rest, _ = form(q[:, :, 9:], k[:, :, 9:], lam[:, :, 9:], stats, log_decay=log_decay[:, :, 9:])
    torch.testing.assert_close(torch.cat([first, rest], dim=2), whole)


def test_packed_sequences_read_each_from_empty_statistics():
    q, k, lam, log_decay = (x[:1] for x in inputs(decay=True))
    cu_seqlens = torch.tensor([0, 1, 8, 21])
    packed, _ = ccq_ridge(q, k, lam, log_decay=log_decay, chunk_size=4, cu_seqlens=cu_seqlens)
    alone = [ccq_ridge(*(x[:, :, a:b] for x in (q, k, lam)), log_decay=log_decay[:, :, a:b], chunk_size=4)[0]
             for a, b in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True)]
    torch.testing.assert_close(packed, torch.cat(alone, dim=2))


def test_ccq_s_read_is_its_first_order_term():
    """(I + lam Sigma)^-1 q = q - lam Sigma q + lam^2 Sigma^2 q - ...: the ridge read less CCQ's is lam^2 Sigma^2 q
    up to lam^3."""
    q, k, lam, _ = inputs()
    lam = lam * 1e-3
    ridge, _ = ccq_ridge_reference(q, k, lam)
    first_order, _ = ccq_reference(q, k, lam)
    count = torch.arange(1, q.shape[2] + 1, dtype=q.dtype).expand(2, 3, -1)
    second = torch.cumsum(k[..., :, None] * k[..., None, :], dim=2)
    sigma = covariance(second, k.cumsum(dim=2), count)
    squared = (sigma @ sigma @ q[..., None]).squeeze(-1) * lam[..., None] ** 2
    torch.testing.assert_close(ridge - first_order, squared, rtol=1e-2, atol=1e-12)
    assert (ridge - first_order).abs().max() > 1e-9  # the truncation costs something at this lambda


def test_the_ridge_read_shrinks_the_query_as_ccq_s_does():
    q, k, lam, _ = inputs(T=40)
    ridge, _ = ccq_ridge(q, k, lam)
    assert (ridge.norm(dim=-1) <= q.norm(dim=-1) + 1e-12).all()
    assert (ridge.norm(dim=-1) < q.norm(dim=-1) - 1e-3).any()
