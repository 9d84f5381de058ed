"""The gated delta rule: WY chunkwise and recurrent forms against the loop-over-time reference."""

import pytest
import torch

from attnlab.ops.delta_rule import delta_rule_chunk, delta_rule_reference, delta_rule_step
from helpers import assert_same, grads_of, random_linear_inputs, step_through


def gdn_inputs(**kw):
    return random_linear_inputs(per_channel_decay=False, **kw)


def reference(q, k, v, g, beta, h0):
    return delta_rule_reference(q, k, v, g, beta, initial_state=h0)


@pytest.mark.parametrize("T, chunk", [(37, 16), (64, 16), (5, 64), (1, 8), (40, 1)])
def test_chunk_matches_reference(T, chunk):
    inputs = gdn_inputs(T=T)
    chunked = grads_of(lambda q, k, v, g, b, h0: delta_rule_chunk(q, k, v, g, b, initial_state=h0, chunk_size=chunk),
                       inputs)
    assert_same(chunked, grads_of(reference, inputs))


def test_chunk_is_exact_for_very_strong_decays():
    inputs = gdn_inputs(T=33, decay_scale=200.0)
    chunked = grads_of(lambda q, k, v, g, b, h0: delta_rule_chunk(q, k, v, g, b, initial_state=h0, chunk_size=16),
                       inputs)
    assert_same(chunked, grads_of(reference, inputs))


@pytest.mark.parametrize("T, chunk", [(37, 16), (40, 1)])
def test_chunk_matches_reference_with_negative_eigenvalues(T, chunk):
    """beta in (0, 2): the transition I - beta k k^T has the eigenvalue 1 - beta < 0 along k for beta > 1."""
    inputs = gdn_inputs(T=T, max_beta=2.0)
    assert (inputs[4] > 1).any()
    chunked = grads_of(lambda q, k, v, g, b, h0: delta_rule_chunk(q, k, v, g, b, initial_state=h0, chunk_size=chunk),
                       inputs)
    assert_same(chunked, grads_of(reference, inputs))
    stepped = grads_of(lambda q, k, v, g, b, h0: step_through(delta_rule_step, q, k, v, g, b, state=h0), inputs)
    assert_same(stepped, grads_of(reference, inputs))


def test_a_write_of_strength_two_flips_the_value_stored_under_a_key():
    """With beta = 2, no decay and a unit key, the read along that key becomes 2 v - (what was stored): a stored
    0 becomes 2 v, and writing v once more flips it back to 0, the sign flip parity needs."""
    k = torch.nn.functional.normalize(torch.randn(1, 1, 1, 4, dtype=torch.float64), dim=-1)
    v = torch.randn(1, 1, 1, 3, dtype=torch.float64)
    zeros, twos = torch.zeros(1, 1, 1, dtype=torch.float64), torch.full((1, 1, 1), 2.0, dtype=torch.float64)
    o, h = delta_rule_reference(k, k, v, zeros, twos, scale=1.0)
    torch.testing.assert_close(o, 2 * v)
    o, _ = delta_rule_reference(k, k, v, zeros, twos, scale=1.0, initial_state=h)
    torch.testing.assert_close(o, torch.zeros_like(v))


def test_recurrent_step_matches_reference():
    inputs = gdn_inputs(T=13)
    stepped = grads_of(lambda q, k, v, g, b, h0: step_through(delta_rule_step, q, k, v, g, b, state=h0), inputs)
    assert_same(stepped, grads_of(reference, inputs))


def test_a_full_write_replaces_the_value_stored_under_a_key():
    """With beta = 1, no decay and a unit key, reading with that key returns exactly the new value."""
    k = torch.nn.functional.normalize(torch.randn(1, 1, 1, 4, dtype=torch.float64), dim=-1)
    v_old, v_new = torch.randn(1, 1, 1, 3, dtype=torch.float64), torch.randn(1, 1, 1, 3, dtype=torch.float64)
    zeros, ones = torch.zeros(1, 1, 1, dtype=torch.float64), torch.ones(1, 1, 1, dtype=torch.float64)
    _, h = delta_rule_reference(k, k, v_old, zeros, ones)
    o, _ = delta_rule_reference(k, k, v_new, zeros, ones, scale=1.0, initial_state=h)
    torch.testing.assert_close(o, v_new)


def test_two_segments_with_carried_state_equal_one_pass():
    q, k, v, g, beta, h0 = (x.detach() for x in gdn_inputs(T=50))
    full_o, full_h = delta_rule_chunk(q, k, v, g, beta, initial_state=h0, chunk_size=16)
    first = [x[:, :, :29] for x in (q, k, v, g, beta)]
    second = [x[:, :, 29:] for x in (q, k, v, g, beta)]
    o1, h1 = delta_rule_chunk(*first, initial_state=h0, chunk_size=16)
    o2, h2 = delta_rule_chunk(*second, initial_state=h1, chunk_size=16)
    torch.testing.assert_close(torch.cat((o1, o2), 2), full_o, rtol=0, atol=1e-12)
    torch.testing.assert_close(h2, full_h, rtol=0, atol=1e-12)
