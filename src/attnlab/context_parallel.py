"""Context parallelism for the recurrent ops: one sequence split across ranks, each rank holding one shard of it.

Every recurrent op here carries its state across time by an affine map. After a shard of tokens,

    h_end = M h_start + U,

where M (the shard's transition: the decays, gates and delta-rule reflections, acting on the key side of h) does not
depend on the state, and U is the state the shard leaves from a zero start. So each rank

1. computes its own (M, U) with h_start = 0 (`shard_transition`),
2. exchanges the pairs with the other ranks (one all-gather: the traffic is the state's size per rank, whatever the
   shard's length),
3. composes the pairs of the ranks before it into its true h_start (`exclusive_scan`), and
4. runs its shard again from there (`run_shard`).

Every step is differentiable, and the exchange sends each rank's gradient back to the rank whose pair it is, so the
backward pass is exact: the gradients are those of the whole sequence on one rank.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist


def shard_transition(op: Callable, q, k, v, *gates, **options) -> tuple[torch.Tensor, torch.Tensor]:
    """(M [B, H, D_k, D_k], U [B, H, D_k, D_v]) of one shard for an op of the linear-attention family, called as
    op(q, k, v, *gates, initial_state=..., **options) -> (o, final_state [B, H, D_k, D_v]).

    U is the final state from a zero start. M is read off the op itself: with every value zero the shard adds
    nothing, so starting from the identity (a state whose value side is D_k wide) it ends at M I = M. This holds for
    any op whose update is h_t = A_t h_{t-1} + (a term linear in v_t): linear attention, GLA, the gated delta rule."""
    batch, heads, _, d_k = k.shape
    _, U = op(q, k, v, *gates, initial_state=None, **options)
    eye = torch.eye(d_k, dtype=U.dtype, device=U.device).expand(batch, heads, d_k, d_k)
    _, M = op(q, k, v.new_zeros(*v.shape[:-1], d_k), *gates, initial_state=eye, **options)
    return M, U


def exclusive_scan(pairs: list[tuple[torch.Tensor, torch.Tensor]], rank: int, initial_state=None) -> torch.Tensor:
    """The state at the start of shard `rank`, given every shard's (M, U) in order: h_0 = initial_state (zero
    where None), h_{r+1} = M_r h_r + U_r."""
    _, U = pairs[0]
    h = torch.zeros_like(U) if initial_state is None else initial_state.to(U.dtype)
    for M, U in pairs[:rank]:
        h = M @ h + U
    return h


class _ShardStart(torch.autograd.Function):
    """(this rank's h_start, the whole sequence's h_end) from this rank's (M, U): all-gather the pairs, scan them.

    Its backward is a collective too, which every rank reaches because every rank's outputs are computed from its
    h_start (rank 0's too, though its value needs no other rank): each rank finds the gradient of its own scan for
    every rank's pair, the ranks sum those (one all-reduce of the pairs' size), and each keeps the one of its own."""

    @staticmethod
    def forward(ctx, M, U, initial_state, group):
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        flat = torch.cat([M.detach().flatten(), U.detach().flatten()])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat, group=group)
        ctx.group, ctx.shapes = group, (M.shape, U.shape)
        ctx.save_for_backward(torch.stack(gathered), initial_state)
        pairs = _unflatten(torch.stack(gathered), M.shape, U.shape)
        return exclusive_scan(pairs, rank, initial_state), exclusive_scan(pairs, world, initial_state)

    @staticmethod
    def backward(ctx, grad_start, grad_final):
        gathered, initial_state = ctx.saved_tensors
        with torch.enable_grad():
            flat = gathered.detach().requires_grad_()
            start_state = None if initial_state is None else initial_state.detach().requires_grad_()
            pairs = _unflatten(flat, *ctx.shapes)
            outputs = (exclusive_scan(pairs, dist.get_rank(ctx.group), start_state),
                       exclusive_scan(pairs, len(pairs), start_state))
            grads = [torch.zeros_like(out) if grad is None else grad
                     for out, grad in zip(outputs, (grad_start, grad_final), strict=True)]
            inputs = [flat] if start_state is None else [flat, start_state]
            found = torch.autograd.grad(outputs, inputs, grads, allow_unused=True)
        per_rank = torch.zeros_like(flat) if found[0] is None else found[0].contiguous()
        dist.all_reduce(per_rank, group=ctx.group)  # the sum over the ranks' scans of each rank's pair's gradient
        dM, dU = _unflatten(per_rank, *ctx.shapes)[dist.get_rank(ctx.group)]
        grad_initial = found[1] if start_state is not None else None
        return dM, dU, grad_initial, None


def _unflatten(rows: torch.Tensor, m_shape, u_shape) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each row of rows [world, M.numel() + U.numel()] as its (M, U)."""
    size = m_shape.numel()
    return [(row[:size].view(m_shape), row[size:].view(u_shape)) for row in rows]


def run_shard(op: Callable, q, k, v, *gates, group=None, initial_state=None, **options):
    """op(q, k, v, *gates, initial_state=..., **options) on this rank's shard of a sequence whose shards lie on the
    ranks of `group` in rank order -> (o of this shard, the final state of the whole sequence, which every rank
    gets). initial_state, where given, is the state before the first shard (the same on every rank)."""
    M, U = shard_transition(op, q, k, v, *gates, **options)
    start, final = _ShardStart.apply(M, U, initial_state, group)
    o, _ = op(q, k, v, *gates, initial_state=start, **options)
    return o, final
