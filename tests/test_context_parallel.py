"""A sequence split across two gloo ranks gives the outputs, final state and gradients of the whole sequence on one
process, for every recurrent op of the linear-attention family, at shard lengths that are not multiples of the
chunk."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from attnlab.context_parallel import exclusive_scan, run_shard, shard_transition
from attnlab.ops.delta_rule import delta_rule_chunk, delta_rule_reference
from attnlab.ops.gla import gla_chunk, gla_reference

B, H, T, D_K, D_V = 2, 2, 22, 8, 6  # two shards of 11 tokens: not a multiple of the chunk of 4
WORLD = 2


def linear(q, k, v, g, **kw):
    return gla_reference(q, k, v, g * 0, **kw)  # no forgetting (g * 0 keeps g in the graph: a zero gradient)


def delta_rule(q, k, v, g, beta, **kw):
    return delta_rule_reference(q, k, v, g, beta, **kw)


OPS = {
    "linear": (linear, 1),
    "gla": (gla_reference, 1),
    "gla-chunk": (functools.partial(gla_chunk, chunk_size=4), 1),
    "gdn": (delta_rule, 2),
    "gdn-chunk": (functools.partial(delta_rule_chunk, chunk_size=4), 2),
}


def inputs(gates: int, seed: int = 0) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    q, k = torch.randn(B, H, T, D_K), torch.nn.functional.normalize(torch.randn(B, H, T, D_K), dim=-1)
    v = torch.randn(B, H, T, D_V)
    if gates == 2:  # the delta rule: a scalar log-decay and a write strength per token
        return [q, k, v, -torch.rand(B, H, T) * 0.3, torch.rand(B, H, T) * 0.9 + 0.05]
    return [q, k, v, -torch.rand(B, H, T, D_K) * 0.3]  # a log-decay <= 0 per key channel


def whole(op, tensors, initial_state, weight):
    """Outputs, final state and input gradients of the whole sequence on one process."""
    leaves = [t.clone().requires_grad_() for t in tensors]
    o, final = op(*leaves, initial_state=initial_state)
    (o * weight).sum().backward()
    return o.detach(), final.detach(), [t.grad for t in leaves]


def rank_worker(rank: int, store: str, out: dict) -> None:
    """One rank: every op on its shard, with what the whole sequence gives on one process to compare."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        for name, (op, gates) in OPS.items():
            tensors = inputs(gates)
            torch.manual_seed(1)
            initial_state, weight = torch.randn(B, H, D_K, D_V), torch.randn(B, H, T, D_V)
            shard = slice(rank * T // WORLD, (rank + 1) * T // WORLD)
            mine = [t[:, :, shard].clone().requires_grad_() for t in tensors]
            o, final = run_shard(op, *mine, initial_state=initial_state)
            (o * weight[:, :, shard]).sum().backward()
            out[name, rank] = (o.detach(), final.detach(), [t.grad for t in mine],
                               whole(op, tensors, initial_state, weight))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks_ran(tmp_path_factory) -> dict:
    """Two gloo ranks started once for every op (starting them is most of the cost)."""
    out = mp.Manager().dict()
    mp.spawn(rank_worker, args=(str(tmp_path_factory.mktemp("gloo") / "store"), out), nprocs=WORLD)
    return dict(out)


@pytest.mark.parametrize("name", list(OPS))
def test_a_sequence_split_across_two_ranks_matches_one_process(name, ranks_ran):
    for rank in range(WORLD):
        o, final, grads, (whole_o, whole_final, whole_grads) = ranks_ran[name, rank]
        shard = slice(rank * T // WORLD, (rank + 1) * T // WORLD)
        torch.testing.assert_close(o, whole_o[:, :, shard], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(final, whole_final, rtol=1e-5, atol=1e-5)
        for grad, whole_grad in zip(grads, whole_grads, strict=True):
            torch.testing.assert_close(grad, whole_grad[:, :, shard], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(OPS))
def test_a_shard_s_transition_carries_any_start_to_its_end(name):
    """h_end(h_start) = M h_start + U, for a random start: the affine map the ranks exchange."""
    op, gates = OPS[name]
    q, k, v, *gates_ = (t.double() for t in inputs(gates))
    M, U = shard_transition(op, q, k, v, *gates_)
    start = torch.randn(B, H, D_K, D_V, dtype=torch.double)
    _, end = op(q, k, v, *gates_, initial_state=start)
    torch.testing.assert_close(M @ start + U, end)
    # and composing two halves' maps gives the state at the end of the whole
    half = T // 2
    pairs = [shard_transition(op, *(t[:, :, part] for t in (q, k, v, *gates_)))
             for part in (slice(0, half), slice(half, T))]
    torch.testing.assert_close(exclusive_scan(pairs, 2, start), end)
