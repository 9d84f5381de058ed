"""GLA: the chunkwise and recurrent forms against the loop-over-time reference."""

import pytest
import torch

from attnlab.ops.delta_rule import delta_rule_chunk
from attnlab.ops.gla import gla_chunk, gla_reference, gla_step
from attnlab.ops.packing import ChunkAlignment
from helpers import assert_same, grads_of, random_linear_inputs, step_through


def gla_inputs(**kw):
    q, k, v, g, _, h0 = random_linear_inputs(**kw)
    return [q, k, v, g, h0]


def reference(q, k, v, g, h0):
    return gla_reference(q, k, v, g, initial_state=h0)


@pytest.mark.parametrize("T, chunk", [(37, 16), (64, 16), (5, 64), (1, 8), (40, 1)])
def test_chunk_matches_reference(T, chunk):
    inputs = gla_inputs(T=T)
    expected = grads_of(reference, inputs)
    assert_same(grads_of(lambda q, k, v, g, h0: gla_chunk(q, k, v, g, initial_state=h0, chunk_size=chunk), inputs),
                expected)


def test_chunk_is_exact_in_fp32_for_decays_too_strong_to_factor_around_one_point():
    inputs = gla_inputs(T=40, decay_scale=50.0)  # log-decays ~ -35 per step
    # across a 40-token chunk exp(b) spans far beyond fp32's range (exp overflows past 88)
    assert -inputs[3].detach().cumsum(2)[:, :, :20].min() > 2 * 88
    expected = grads_of(reference, inputs)
    fp32 = [x.detach().float().requires_grad_() for x in inputs]
    o, state, grads = grads_of(lambda q, k, v, g, h0: [x.double() for x in gla_chunk(q, k, v, g, initial_state=h0)],
                               fp32)
    assert_same((o, state, [x.double() for x in grads]), expected, atol=2e-4)


def test_recurrent_step_matches_reference():
    inputs = gla_inputs(T=13)
    assert_same(grads_of(lambda q, k, v, g, h0: step_through(gla_step, q, k, v, g, state=h0), inputs),
                grads_of(reference, inputs))


def test_reference_is_the_definition():
    """h_t = diag(exp g_t) h_{t-1} + k_t v_t^T and o_t = h_t^T q_t / sqrt(D_k), written out for t = 1, 2."""
    q, k, v, g, h0 = (x.detach() for x in gla_inputs(T=2, B=1, H=1))
    o, h = gla_reference(q, k, v, g, initial_state=h0)
    h1 = g[0, 0, 0].exp()[:, None] * h0[0, 0] + torch.outer(k[0, 0, 0], v[0, 0, 0])
    h2 = g[0, 0, 1].exp()[:, None] * h1 + torch.outer(k[0, 0, 1], v[0, 0, 1])
    scale = q.shape[-1] ** -0.5
    torch.testing.assert_close(o[0, 0, 1], h2.T @ q[0, 0, 1] * scale)
    torch.testing.assert_close(o[0, 0, 0], h1.T @ q[0, 0, 0] * scale)
    torch.testing.assert_close(h[0, 0], h2)


def test_two_segments_with_carried_state_equal_one_pass():
    q, k, v, g, h0 = (x.detach() for x in gla_inputs(T=50))
    full_o, full_h = gla_chunk(q, k, v, g, initial_state=h0, chunk_size=16)
    o1, h1 = gla_chunk(q[:, :, :23], k[:, :, :23], v[:, :, :23], g[:, :, :23], initial_state=h0, chunk_size=16)
    o2, h2 = gla_chunk(q[:, :, 23:], k[:, :, 23:], v[:, :, 23:], g[:, :, 23:], initial_state=h1, chunk_size=16)
    torch.testing.assert_close(torch.cat((o1, o2), 2), full_o, rtol=0, atol=1e-12)
    torch.testing.assert_close(h2, full_h, rtol=0, atol=1e-12)


def test_float32_inputs_keep_their_dtype_and_fp32_state():
    q, k, v, g, _ = (x.detach().float() for x in gla_inputs(T=20))
    o, h = gla_chunk(q, k, v, g, chunk_size=8)
    o_ref, h_ref = gla_reference(q.double(), k.double(), v.double(), g.double())
    assert o.dtype == torch.float32 and h.dtype == torch.float32
    torch.testing.assert_close(o, o_ref.float(), rtol=0, atol=1e-5)


def test_chunk_scores_compile_without_graph_breaks():
    """No branch on tensor values: nothing forces a host sync or splits a compiled graph."""
    from attnlab.ops.gla import decayed_scores

    q, k = torch.randn(2, 3, 16, 8), torch.randn(2, 3, 16, 8)
    b = torch.nn.functional.logsigmoid(torch.randn(2, 3, 16, 8)).cumsum(-2)
    assert torch._dynamo.explain(decayed_scores)(q, k, b).graph_break_count == 0


def test_the_layout_halves_its_chunk_while_rounding_wastes_more_than_a_tenth_and_picks_the_tightest_rows():
    lengths = [40, 40, 40, 100]  # rounded to chunks of 64: 320 tokens; of 32: 288 (> 1.1 x 220); of 16: 240
    align = ChunkAlignment(torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()]), 64)
    assert align.chunk_size == 16
    # rows of 112 (the longest) take three rows, 336 positions; of 144: 112 | 48 48 48, two rows, 288; of 176 to
    # 224 (twice the longest): two rows, 352 or more
    assert (align.rows, align.width) == (2, 144)


@pytest.mark.parametrize("op", ["gla", "delta_rule"])
def test_packed_sequences_laid_out_in_chunks_scan_from_zeros_and_end_in_their_own_states(op):
    """The chunk forms given cu_seqlens lay the sequences out in ChunkAlignment's rows (sequences of 1 to 3
    chunks of 8, one not filling its last chunk, two sharing a row): each sequence's outputs and last state are
    those it has alone."""
    cu_seqlens = torch.tensor([0, 8, 30, 45, 47])
    q, k, v, g, beta, _ = random_linear_inputs(B=1, H=2, T=47, K=4, V=3)
    form, extra, gates = (gla_chunk, (), g) if op == "gla" else (delta_rule_chunk, (beta,), g[..., 0])
    align = ChunkAlignment(cu_seqlens, 8)
    assert align.rows < 4  # the short sequences share rows
    assert align.chunk_size == 8  # the smallest chunk the layout takes is 16 (or the one given, if smaller)
    o, states = form(q, k, v, gates, *extra, chunk_size=8, cu_seqlens=cu_seqlens)
    for i, (a, b) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True)):
        o_alone, state_alone = form(*(x[:, :, a:b] for x in (q, k, v, gates, *extra)), chunk_size=8)
        torch.testing.assert_close(o[:, :, a:b], o_alone, rtol=0, atol=1e-10)
        torch.testing.assert_close(states[i : i + 1], state_alone, rtol=0, atol=1e-10)
