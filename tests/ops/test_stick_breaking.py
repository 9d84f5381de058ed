"""Stick-breaking attention: the log-space form against the definition's products, against flash-linear-attention's
own reference, and the blockwise form against the dense one (outputs, the stick left over, gradients)."""

import warnings

import pytest
import torch

from attnlab.ops.stick_breaking import stick_breaking, stick_breaking_reference


def inputs(T=13, S=13, D=8, D_v=5, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    q, k = torch.randn(2, 3, T, D, dtype=dtype), torch.randn(2, 3, S, D, dtype=dtype)
    return q * 2, k, torch.randn(2, 3, S, D_v, dtype=dtype)  # scores of a few units: weights far from uniform


def by_definition(q, k, v, attend_current):
    """A_ij = beta_ij prod_{j < l < i} (1 - beta_il) (l <= i and j <= i with attend_current), one query at a time."""
    T, S = q.shape[-2], k.shape[-2]
    beta = torch.sigmoid(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5)
    weights = torch.zeros_like(beta)
    for i in range(T):
        position = S - T + i
        last = position if attend_current else position - 1
        for j in range(last + 1):
            weights[..., i, j] = beta[..., i, j] * torch.prod(1 - beta[..., i, j + 1 : last + 1], dim=-1)
    return weights @ v, 1 - weights.sum(-1)


@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("T", [13, 5, 1])  # training, a prefill continuing a cache, a decoding step
def test_the_log_space_form_is_the_definition(attend_current, T):
    q, k, v = inputs(T=T)
    o, left = stick_breaking_reference(q, k, v, attend_current=attend_current)
    o_def, left_def = by_definition(q, k, v, attend_current)
    torch.testing.assert_close(o, o_def)
    torch.testing.assert_close(left, left_def)
    assert (left >= -1e-12).all() and (left <= 1).all()


@pytest.mark.parametrize("attend_current", [False, True])
def test_the_reference_matches_fla_s_own(attend_current):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Triton is not supported on current platform, roll back to CPU"
        naive = pytest.importorskip("fla.ops.stickbreaking_attn.naive")
    q, k, v = inputs(dtype=torch.float32)
    o, left = stick_breaking_reference(q, k, v, attend_current=attend_current)
    o_fla, left_fla = naive.naive_stickbreaking_attn(*(x.transpose(1, 2) for x in (q, k, v)),
                                                     attend_current=attend_current)
    torch.testing.assert_close(o, o_fla.transpose(1, 2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(left, left_fla.transpose(1, 2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T, block_size", [(13, 4), (13, 13), (6, 4), (1, 4)])
def test_the_blockwise_form_matches_the_dense_one_with_its_gradients(T, block_size):
    q, k, v = (x.requires_grad_() for x in inputs(T=T))
    o, left = stick_breaking(q, k, v, block_size=block_size)
    o_ref, left_ref = stick_breaking_reference(q, k, v)
    torch.testing.assert_close(o, o_ref)
    torch.testing.assert_close(left, left_ref)
    weight, weight_left = torch.randn_like(o), torch.randn_like(left)
    grads = torch.autograd.grad((o * weight).sum() + (left * weight_left).sum(), (q, k, v))
    grads_ref = torch.autograd.grad((o_ref * weight).sum() + (left_ref * weight_left).sum(), (q, k, v))
    for grad, grad_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(grad, grad_ref)


def test_a_query_reads_no_later_key_and_a_near_key_suppresses_farther_ones():
    q, k, v = inputs()
    o, _ = stick_breaking_reference(q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[..., 8:, :], v2[..., 8:, :] = torch.randn_like(k2[..., 8:, :]), torch.randn_like(v2[..., 8:, :])
    torch.testing.assert_close(stick_breaking_reference(q, k2, v2)[0][..., :9, :], o[..., :9, :])
    # a key right before the last query that takes the whole stick leaves nothing to any farther key
    k3 = k.clone()
    k3[..., -2, :] = q[..., -1, :] * 100
    o3, left3 = stick_breaking_reference(q, k3, v)
    torch.testing.assert_close(o3[..., -1, :], v[..., -2, :])
    torch.testing.assert_close(left3[..., -1], torch.zeros_like(left3[..., -1]))
