"""Sigmoid attention: the blockwise form against the dense reference, and the reference against its definition."""

import math

import pytest
import torch

from attnlab.ops.sigmoid_attention import sigmoid_attention, sigmoid_attention_reference


def random_inputs(T, S, B=2, H=3, D=8, D_v=6, dtype=torch.float64, seed=0):
    """q [B, H, T, D], k [B, H, S, D], v [B, H, S, D_v], each requiring grad."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, d, generator=g, dtype=torch.float64) for n, d in ((T, D), (S, D), (S, D_v)))
    return [x.to(dtype).requires_grad_() for x in (q, k, v)]


def output_and_grads(fn, inputs, seed=1):
    """fn(*inputs) and the gradients of a random projection of it."""
    y = fn(*inputs)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(y.dtype)
    return y.detach(), torch.autograd.grad(y, inputs, dy)


@pytest.mark.parametrize(("T", "S", "block_size"), [
    (37, 37, 16),  # blocks that do not divide T
    (64, 64, 16),  # blocks that do
    (5, 5, 64),  # one block longer than the sequence
    (1, 20, 8),  # a decoding step against a cache
    (13, 40, 4),  # a prefill continuing a cache
    (13, 40, 13),
    (10, 10, 1),
])
@pytest.mark.parametrize("bias", [0.0, -math.log(256), 2.0])
def test_blockwise_matches_reference(T, S, block_size, bias):
    inputs = random_inputs(T, S)
    y, grads = output_and_grads(lambda q, k, v: sigmoid_attention(q, k, v, bias, block_size), inputs)
    y_ref, grads_ref = output_and_grads(lambda q, k, v: sigmoid_attention_reference(q, k, v, bias), inputs)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-12)
    for got, expected in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_blockwise_gradcheck():
    inputs = random_inputs(T=5, S=7, B=1, H=2, D=4, D_v=3)
    assert torch.autograd.gradcheck(lambda q, k, v: sigmoid_attention(q, k, v, -0.7, block_size=2), inputs)


def test_reference_is_the_definition():
    """y_i = sum_{j <= S - T + i} sigmoid(q_i . k_j / sqrt(D) + b) v_j, the queries being the last T positions."""
    T, S, bias = 4, 7, -1.5
    q, k, v = (x.detach() for x in random_inputs(T, S))
    expected = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for i in range(T):
        for j in range(S - T + i + 1):
            w = torch.sigmoid((q[:, :, i] * k[:, :, j]).sum(-1) / math.sqrt(q.shape[-1]) + bias)
            expected[:, :, i] += w[..., None] * v[:, :, j]
    torch.testing.assert_close(sigmoid_attention_reference(q, k, v, bias), expected, rtol=0, atol=1e-12)


def test_backward_saves_only_q_k_v():
    """Memory linear in the length: nothing of size [T, S] is kept for the backward pass."""
    inputs = random_inputs(T=48, S=48)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        sigmoid_attention(*inputs, -1.0, block_size=16)
    assert saved == [x.shape for x in inputs]


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.bfloat16, 0.1)])
@pytest.mark.parametrize("autocast", [False, True])
def test_inputs_keep_their_dtype(dtype, atol, autocast):
    """Outputs and gradients in the inputs' dtype, also under bf16 autocast (the op turns autocast off)."""
    inputs = random_inputs(T=30, S=30, dtype=dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y, grads = output_and_grads(lambda q, k, v: sigmoid_attention(q, k, v, -1.0, block_size=8), inputs)
    y_ref, grads_ref = output_and_grads(lambda q, k, v: sigmoid_attention_reference(q, k, v, -1.0),
                                        [x.detach().double().requires_grad_() for x in inputs])
    assert y.dtype == dtype and all(g.dtype == dtype for g in grads)
    torch.testing.assert_close(y.double(), y_ref, rtol=0, atol=atol)
    for got, expected in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(got.double(), expected, rtol=0, atol=atol)
