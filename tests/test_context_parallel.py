"""A sequence split across two and across three gloo ranks gives the outputs, the final state and the gradients (of
every token's inputs, and of the parameters summed over the ranks as data parallelism sums them) of the whole
sequence on one process, for every recurrent op, at shard lengths that are not multiples of the chunk. Three ranks
tell the rank before from the first one."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

from attnlab.mixers.softmax import causal_sdpa
from attnlab.ops.ccq import ccq_chunk, ccq_reference, ccq_shard
from attnlab.ops.cp import (
    Context,
    exclusive_scan,
    gather_prefix,
    matrix_shard,
    run_shard,
    transition,
)
from attnlab.ops.delta_rule import delta_rule_chunk, delta_rule_reference
from attnlab.ops.gla import gla_chunk, gla_reference
from attnlab.ops.interdomain import interdomain_chunk, interdomain_reference
from attnlab.ops.s4d import s4d_fft, s4d_reference
from attnlab.ops.sigmoid_attention import sigmoid_attention, sigmoid_attention_reference
from helpers import on_gloo_ranks

B, H, T, D_K, D_V, MODES = 2, 2, 30, 8, 6, 4  # shards of 15 or of 10 tokens: not a multiple of the chunk of 4
WORLDS = (2, 3)


@dataclass
class Case:
    tokens: list[torch.Tensor]  # inputs with time on dim 2, split across the ranks
    params: list[torch.Tensor]  # inputs every rank holds whole
    state: torch.Tensor  # a state to start the whole sequence from
    shard: callable  # (tokens, params) -> a Shard
    diagonal: bool = False


def linear_case(op, gates: int) -> Case:
    q, k = torch.randn(B, H, T, D_K), torch.nn.functional.normalize(torch.randn(B, H, T, D_K), dim=-1)
    v = torch.randn(B, H, T, D_V)
    if gates == 2:  # the delta rule: a scalar log-decay and a write strength per token
        gates_ = [-torch.rand(B, H, T) * 0.3, torch.rand(B, H, T) * 0.9 + 0.05]
    else:  # a log-decay <= 0 per key channel
        gates_ = [-torch.rand(B, H, T, D_K) * 0.3]
    return Case([q, k, v, *gates_], [], torch.randn(B, H, D_K, D_V),
                lambda tokens, params: matrix_shard(op, *tokens))


def s4d_parameters() -> list[torch.Tensor]:
    """lambda = exp(dt A) and B_bar = (lambda - 1) / A for S4D-Lin's A, and random c: [H, MODES] complex."""
    A = torch.complex(-0.5 * torch.ones(H, MODES), math.pi * torch.arange(MODES).float().expand(H, MODES))
    lam = torch.exp(0.1 * A)
    return [torch.randn(H, MODES, dtype=torch.cfloat), lam, (lam - 1) / A]


def s4d_case(op) -> Case:
    def shard(tokens, params):
        [u], (c, lam, B_bar) = tokens, params
        return lambda start, silent=False: op(u, c, lam, B_bar, initial_state=start)

    return Case([torch.randn(B, H, T, D_V)], s4d_parameters(),
                torch.randn(B, H, MODES, D_V, dtype=torch.cfloat), shard, diagonal=True)


def interdomain_case(op) -> Case:
    def shard(tokens, params):
        (xi_q, z), (C, lam, B_bar) = tokens, params
        return lambda start, silent=False: op(xi_q, z, lam, B_bar, C, initial_state=start)

    width = D_K + D_V
    _, lam, B_bar = s4d_parameters()
    C = torch.randn(H, MODES, MODES, dtype=torch.cfloat) / MODES
    return Case([torch.rand(B, H, T, D_K), torch.randn(B, H, T, width)], [C, lam, B_bar],
                torch.randn(B, H, MODES, width, dtype=torch.cfloat), shard, diagonal=True)


def ccq_case(op, decay: bool) -> Case:
    q, k = (torch.nn.functional.normalize(torch.randn(B, H, T, D_K), dim=-1) for _ in range(2))
    tokens = [q, k, torch.rand(B, H, T) * 0.5, *([-torch.rand(B, H, T) * 0.3] if decay else [])]
    root = torch.randn(B, H, D_K, D_K)  # statistics of some earlier keys: a positive second moment and count
    state = torch.cat([(root @ root.transpose(-1, -2)).flatten(-2), torch.randn(B, H, D_K), 5 + torch.rand(B, H, 1)],
                      dim=-1)
    return Case(tokens, [], state, lambda tokens, params: ccq_shard(op, *tokens[:3], *tokens[3:]), diagonal=True)


def linear(q, k, v, g, **kw):
    return gla_reference(q, k, v, g * 0, **kw)  # no forgetting (g * 0 keeps g in the graph: a zero gradient)


CASES = {
    "linear": lambda: linear_case(linear, 1),
    "gla": lambda: linear_case(gla_reference, 1),
    "gla-chunk": lambda: linear_case(functools.partial(gla_chunk, chunk_size=4), 1),
    "gdn": lambda: linear_case(delta_rule_reference, 2),
    "gdn-chunk": lambda: linear_case(functools.partial(delta_rule_chunk, chunk_size=4), 2),
    "ccq": lambda: ccq_case(ccq_reference, decay=False),
    "ccq-chunk": lambda: ccq_case(functools.partial(ccq_chunk, chunk_size=4), decay=False),
    "ccq-decay": lambda: ccq_case(ccq_reference, decay=True),
    "ccq-decay-chunk": lambda: ccq_case(functools.partial(ccq_chunk, chunk_size=4), decay=True),
    "s4d": lambda: s4d_case(s4d_reference),
    "s4d-fft": lambda: s4d_case(s4d_fft),
    "interdomain": lambda: interdomain_case(interdomain_reference),
    "interdomain-chunk": lambda: interdomain_case(functools.partial(interdomain_chunk, chunk_size=4)),
}


def make(name: str) -> Case:
    torch.manual_seed(0)
    return CASES[name]()


def leaves(tensors):
    return [t.clone().requires_grad_() for t in tensors]


def loss(outputs, weight):
    return (outputs.real * weight).sum()


def rank_worker(rank: int, out: dict, world: int) -> None:
    """One rank: every recurrent op on its shard, with what the whole sequence gives on one process to compare."""
    for name in CASES:
        case = make(name)
        part = slice(rank * T // world, (rank + 1) * T // world)
        tokens, params = leaves(t[:, :, part] for t in case.tokens), leaves(case.params)
        outputs, final = run_shard(case.shard(tokens, params), case.diagonal, initial_state=case.state)
        weight = torch.randn(outputs.shape, generator=torch.Generator().manual_seed(rank))
        loss(outputs, weight).backward()

        whole_tokens, whole_params = leaves(case.tokens), leaves(case.params)
        whole_outputs, whole_final = case.shard(whole_tokens, whole_params)(case.state)
        whole_weight = torch.cat([torch.randn(outputs.shape, generator=torch.Generator().manual_seed(r))
                                  for r in range(world)], dim=2)  # each rank's weight on its shard
        loss(whole_outputs, whole_weight).backward()
        out[name, rank] = {
            "outputs": (outputs.detach(), whole_outputs.detach()[:, :, part]),
            "final": (final.detach(), whole_final.detach()),
            "tokens": [(t.grad, w.grad[:, :, part]) for t, w in zip(tokens, whole_tokens, strict=True)],
            "params": [(p.grad, w.grad) for p, w in zip(params, whole_params, strict=True)],
        }


ATTENTION = {
    "softmax": lambda q, k, v: causal_sdpa(q, k, v),
    "sigmoid": lambda q, k, v: sigmoid_attention(q, k, v, bias=-2.0, block_size=4),
    "sigmoid-reference": lambda q, k, v: sigmoid_attention_reference(q, k, v, bias=-2.0),
}


def attention_worker(rank: int, out: dict, world: int) -> None:
    """One rank: every attention on its shard of queries against the keys and values gathered up to it."""
    for name, attend in ATTENTION.items():
        torch.manual_seed(0)
        whole = [torch.randn(B, H, T, D_K) for _ in range(3)]
        part = slice(rank * T // world, (rank + 1) * T // world)
        q, k, v = leaves(x[:, :, part] for x in whole)
        o = attend(q, gather_prefix(k), gather_prefix(v))
        weight = torch.randn(o.shape, generator=torch.Generator().manual_seed(rank))
        loss(o, weight).backward()
        whole_qkv = leaves(whole)
        whole_o = attend(*whole_qkv)
        loss(whole_o, torch.cat([torch.randn(o.shape, generator=torch.Generator().manual_seed(r))
                                 for r in range(world)], dim=2)).backward()
        out[name, rank] = {"outputs": (o.detach(), whole_o.detach()[:, :, part]),
                           "tokens": [(x.grad, w.grad[:, :, part]) for x, w in zip((q, k, v), whole_qkv, strict=True)]}


def both_workers(rank: int, store: str, out: dict, world: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        rank_worker(rank, out, world)
        attention_worker(rank, out, world)
        out["halo", rank] = halo(rank)
    finally:
        dist.destroy_process_group()


def halo(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What a short convolution reads across the boundary: the previous rank's last 2 positions, and the last
    rank's (the sequence's), of a shard whose every value is its rank."""
    x = torch.full((1, 5, 1), float(rank))
    return tuple(t.detach() for t in Context().boundary(x, 2))


@pytest.fixture(scope="module", params=WORLDS, ids=[f"{world} ranks" for world in WORLDS])
def ranks_ran(request, tmp_path_factory) -> tuple[int, dict]:
    """The ranks started once for every op (starting them is most of the cost): (how many, what they found)."""
    world = request.param
    return world, on_gloo_ranks(functools.partial(both_workers, world=world), tmp_path_factory.mktemp("gloo"), world)


def test_each_rank_reads_across_its_boundary_from_the_rank_before_it(ranks_ran):
    world, ranks_ran = ranks_ran
    for rank in range(world):
        before, last = ranks_ran["halo", rank]
        assert before.tolist() == [[[max(rank - 1, 0)]] * 2] and last.tolist() == [[[world - 1]] * 2]


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_a_sequence_split_across_ranks_matches_one_process(name, ranks_ran):
    world, ranks_ran = ranks_ran
    for rank in range(world):
        found = ranks_ran[name, rank]
        close(*found["outputs"])
        close(*found["final"])
        for grad, whole in found["tokens"]:
            close(grad, whole)
    # a parameter's gradient is the sum of the ranks' (an all-reduce, as data parallelism does)
    for i, (_, whole) in enumerate(ranks_ran[name, 0]["params"]):
        close(sum(ranks_ran[name, rank]["params"][i][0] for rank in range(world)), whole)


@pytest.mark.parametrize("name", list(ATTENTION))
def test_attention_over_keys_gathered_across_ranks_matches_one_process(name, ranks_ran):
    world, ranks_ran = ranks_ran
    for rank in range(world):
        close(*ranks_ran[name, rank]["outputs"])
        for grad, whole in ranks_ran[name, rank]["tokens"]:
            close(grad, whole)


@pytest.mark.parametrize("name", list(CASES))
def test_a_shard_s_transition_carries_any_start_to_its_end(name):
    """h_end(h_start) = M h_start + U, for a random start: the affine map the ranks exchange; and composing the two
    halves' maps gives the state at the end of the whole."""
    case = make(name)
    start = case.state
    _, end = case.shard(case.tokens, case.params)(start)
    M, U = transition(case.shard(case.tokens, case.params), case.diagonal)
    close((M * start if case.diagonal else M @ start) + U, end)
    halves = [transition(case.shard([t[:, :, part] for t in case.tokens], case.params), case.diagonal)
              for part in (slice(0, T // 2), slice(T // 2, T))]
    close(exclusive_scan(halves, 2, start, case.diagonal), end)
