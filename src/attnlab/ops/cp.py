"""Context parallelism for the recurrent ops: one sequence split across ranks, each rank holding one shard.

Every recurrent op here carries its state across time by an affine map. After a shard of tokens,

    h_end = M h_start + U,

where M (the shard's transition: its decays, gates and rank-one reflections) does not depend on the state, and U
is the state the shard leaves from a zero start. M acts on the key side of a matrix state h [D_k, D_v] (a D_k x D_k
matrix), or elementwise on a diagonal one (the powers of a diagonal recurrence, or statistics that one decay ages:
the product of the decays). So each rank

1. computes its own (M, U) with h_start = 0 (`transition`),
2. exchanges the pairs with the other ranks (one all-gather: the traffic is the state's size per rank, whatever the
   shard's length),
3. composes the pairs of the ranks before it into its true h_start (`exclusive_scan`), and
4. runs its shard again from there (`run_shard`).

Every step is differentiable, and the exchange sends each rank's gradient back to the rank whose pair it is, so the
backward pass is exact: the gradients are those of the whole sequence on one rank.

Attention that reads every earlier key has no such state: a rank's queries read the keys and values of every shard
up to its own (`gather_prefix`, an all-gather along time), and the attention ops take queries that are the last
positions of their keys as they are. Its traffic grows with the sequence, as ring attention's does.

The ops take the context beside cu_seqlens (as fla's take cp_context): a recurrent op with `context=` runs its shard
through `split`, an attention op's caller through `attend_prefix` (or `attend_halo`, where a query reads a window
of earlier keys). A whole decoder runs one rank's shard with `Decoder(tokens, context=Context(group))`: every
mixer that splits (`Mixer.splits`) passes the context on to its ops, packed documents too (`Context.documents`: a
shard's first document continues the previous rank's last, the others start afresh), and `train.context_parallel`
trains so under torchrun.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist

from ..errors import UserError
from ..nn import positions_in_sequences


@dataclass(frozen=True)
class Context:
    """This rank's place in a context-parallel group: the ranks of `group` (the default group where None) hold
    the equal shards of every sequence in rank order, and this one holds shard `rank`. A mixer that takes a
    `context` runs its shard of the sequence from the start of the sequence as the ranks before it leave it."""

    group: object = None
    # the documents of the last row asked for, held with its boundaries: every layer asks for the same row's, and
    # computing them reads cu_seqlens on the host
    _last: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    @property
    def world(self) -> int:
        return dist.get_world_size(self.group)

    def offset(self, shard_len: int) -> int:
        """The position in its sequence of this rank's first token."""
        return self.rank * shard_len

    def documents(self, cu_seqlens: torch.Tensor | None, shard_len: int) -> Documents:
        """This shard's part of the packed documents whose boundaries in the whole row are cu_seqlens (None: one
        sequence, unpacked), computed once for a row's boundaries."""
        if self._last.get("rows", ()) is not cu_seqlens or self._last["length"] != shard_len:
            self._last.update(rows=cu_seqlens, length=shard_len, documents=self._documents(cu_seqlens, shard_len))
        return self._last["documents"]

    def _documents(self, cu_seqlens: torch.Tensor | None, shard_len: int) -> Documents:
        first = self.offset(shard_len)
        if cu_seqlens is None:
            return Documents(None, first == 0, torch.arange(first, first + shard_len))
        cu = cu_seqlens.cpu()
        inside = cu[(cu > first) & (cu < first + shard_len)] - first
        local = torch.cat((torch.zeros(1, dtype=cu.dtype), inside, torch.full((1,), shard_len, dtype=cu.dtype)))
        return Documents(local, bool((cu == first).any()), positions_in_sequences(cu)[first : first + shard_len])

    def scan(self, shard: Shard, diagonal: bool = False):
        """run_shard over this group: (the shard's outputs, the whole sequence's final state)."""
        return run_shard(shard, diagonal, self.group)

    def previous(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """The last n positions of the previous rank's x [..., T_shard, D] (zeros on the first rank): a short
        convolution's window across the shard boundary."""
        return self.boundary(x, n)[0]

    def boundary(self, x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(the last n positions of the previous rank's x [..., T_shard, D], zeros on the first rank; the last n
        positions of the last rank's: those of the whole sequence, a short convolution's final state), from one
        exchange. Every rank's result depends on the exchange (the first rank's as zeros times it), so that
        every rank reaches its backward."""
        if x.shape[-2] < n:
            raise UserError(f"a shard of {x.shape[-2]} tokens is shorter than the {n} positions the next one reads "
                            "across the boundary: give each rank more tokens (train.seq_len / train.context_parallel)")
        tails = _GatherTime.apply(x[..., x.shape[-2] - n :, :].contiguous(), self.group)
        before = tails[..., max(self.rank - 1, 0) * n : max(self.rank, 1) * n, :]
        return before * 0 if self.rank == 0 else before, tails[..., tails.shape[-2] - n :, :]


@dataclass(frozen=True)
class Documents:
    """The documents of one rank's shard of a packed row: local, their boundaries within the shard ([0, ..., T];
    None for one unpacked sequence); fresh, whether the shard begins a document (else its first one continues the
    previous rank's last); positions [T], each token's position in its document (its sequence's, unpacked)."""

    local: torch.Tensor | None
    fresh: bool
    positions: torch.Tensor

    def run(self, run: Callable, length: int) -> Shard:
        """A shard of run(time: slice, start, cu_seqlens, silent) -> (outputs, final state), outputs with time on
        dim 2 (silent: see Shard): the first document from `start` (zeros where the shard begins one), those after
        it from zeros (packed), and the last one's final state the shard's, so that a shard that holds a boundary
        carries nothing of its start (its transition M is zero)."""

        def shard(start, silent=False):
            if start is not None and self.fresh:  # zeros still in the graph: every rank's backward reaches the
                start = start * 0  # exchange
            if self.local is None or len(self.local) == 2:
                return run(slice(0, length), start, None, silent)
            first, last = int(self.local[1]), int(self.local[-2])
            parts = [run(slice(0, first), start, None, silent)[0]]
            if last > first:  # whole documents between: from zeros, their outputs only
                parts.append(run(slice(first, last), None, self.local[1:-1] - first, silent)[0])
            tail, final = run(slice(last, length), None, None, silent)
            return torch.cat((*parts, tail), dim=2), final

        return shard


class Shard(Protocol):
    def __call__(self, start: torch.Tensor | None, silent: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's shard run from the state `start` (zero where None) -> (outputs, final state). silent (asked
        only of a matrix transition): with every input that adds to the state set to zero, at a value width that
        follows start's last dimension, so that the shard only carries its start: h_end = M h_start."""


def transition(shard: Shard, diagonal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, U) of a shard, read off the op itself. U is the final state from a zero start. A diagonal M is the
    state from ones less U (h_end = M * 1 + U; this holds where the shard adds to its state on its own, as a
    count does); a matrix M is the state from the identity (a D_k-wide state) of the silent shard."""
    _, U = shard(None)
    if diagonal:
        _, from_ones = shard(torch.ones_like(U))
        return from_ones - U, U
    d_k = U.shape[-2]
    _, M = shard(torch.eye(d_k, dtype=U.dtype, device=U.device).expand(*U.shape[:-1], d_k), silent=True)
    return M, U


def exclusive_scan(pairs: list[tuple[torch.Tensor, torch.Tensor]], rank: int, initial_state=None,
                   diagonal: bool = False) -> torch.Tensor:
    """The state at the start of shard `rank`, given every shard's (M, U) in order: h_0 = initial_state (zero
    where None), h_{r+1} = M_r h_r + U_r (M_r * h_r for a diagonal transition)."""
    _, U = pairs[0]
    h = torch.zeros_like(U) if initial_state is None else initial_state.to(U.dtype)
    for M, U in pairs[:rank]:
        h = (M * h if diagonal else M @ h) + U
    return h


def _start_and_end(pairs, rank: int, initial_state, diagonal: bool):
    """(the state at the start of shard `rank`, the state after the last shard), from one pass over the pairs."""
    h = exclusive_scan(pairs, rank, initial_state, diagonal)
    return h, exclusive_scan(pairs[rank:], len(pairs) - rank, h, diagonal)


class _ShardStart(torch.autograd.Function):
    """(this rank's h_start, the whole sequence's h_end) from this rank's (M, U): all-gather the pairs, scan them.

    Its backward is a collective too, which every rank reaches because every rank's outputs are computed from its
    h_start (rank 0's too, though its value needs no other rank): each rank finds the gradient of its own scan for
    every rank's pair, the ranks sum those (one all-reduce of the pairs' size), and each keeps the one of its own."""

    @staticmethod
    def forward(ctx, M, U, initial_state, group, diagonal):
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        mine = torch.cat([M.detach().flatten(), U.detach().flatten()])
        gathered = [torch.empty_like(_real(mine)) for _ in range(world)]
        dist.all_gather(gathered, _real(mine), group=group)
        rows = _complex_like(torch.stack(gathered), mine)
        ctx.group, ctx.shapes, ctx.diagonal = group, (M.shape, U.shape), diagonal
        ctx.save_for_backward(rows, initial_state)
        return _start_and_end(_unflatten(rows, M.shape, U.shape), rank, initial_state, diagonal)

    @staticmethod
    def backward(ctx, grad_start, grad_final):
        rows, initial_state = ctx.saved_tensors
        with torch.enable_grad():
            rows = rows.detach().requires_grad_()
            start = None if initial_state is None else initial_state.detach().requires_grad_()
            outputs = _start_and_end(_unflatten(rows, *ctx.shapes), dist.get_rank(ctx.group), start, ctx.diagonal)
            # (the first rank's start is the initial state itself: from zeros it depends on no pair)
            pairs = [(out, torch.zeros_like(out) if grad is None else grad)
                     for out, grad in zip(outputs, (grad_start, grad_final), strict=True) if out.requires_grad]
            found = torch.autograd.grad([out for out, _ in pairs], [rows] if start is None else [rows, start],
                                        [grad for _, grad in pairs], allow_unused=True)
        per_rank = torch.zeros_like(rows) if found[0] is None else found[0].contiguous()
        summed = _real(per_rank)
        dist.all_reduce(summed, group=ctx.group)  # the sum over the ranks' scans of each rank's pair's gradient
        dM, dU = _unflatten(_complex_like(summed, per_rank), *ctx.shapes)[dist.get_rank(ctx.group)]
        return dM, dU, None if start is None else found[1], None, None


def _real(x: torch.Tensor) -> torch.Tensor:
    """A complex tensor as its real view (gloo sends real numbers), a real one as it is."""
    return torch.view_as_real(x) if x.is_complex() else x


def _complex_like(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.view_as_complex(x) if like.is_complex() else x


def _unflatten(rows: torch.Tensor, m_shape, u_shape) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each row of rows [world, M.numel() + U.numel()] as its (M, U)."""
    size = m_shape.numel()
    return [(row[:size].view(m_shape), row[size:].view(u_shape)) for row in rows]


class _GatherTime(torch.autograd.Function):
    """Every rank's x [..., T_shard, D] along time, in rank order; the backward sums the ranks' gradients for each
    shard and hands each rank its own (every rank reaches it: each reads the gathered keys up to its own shard)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        gathered = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, x.contiguous(), group=group)
        return torch.cat(gathered, dim=-2)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.chunk(dist.get_world_size(ctx.group), dim=-2)[dist.get_rank(ctx.group)], None


def gather_prefix(x: torch.Tensor, group=None) -> torch.Tensor:
    """x [..., T_shard, D] of every rank up to and including this one's, along time: the keys (or values) this
    rank's queries see. The shards are of one length."""
    rank = dist.get_rank(group)
    return _GatherTime.apply(x, group)[..., : (rank + 1) * x.shape[-2], :]


def attend_prefix(attend: Callable, q, k, v, context: Context, cu_seqlens: torch.Tensor | None = None):
    """attend(q, k, v) -> y [B, H', T, D'] of this rank's queries q [B, H, T, D] over the keys and values of every
    shard up to its own (gathered), each query's document's alone on packed documents (cu_seqlens: the whole row's
    boundaries): a document's queries are the last positions of its keys."""
    T = q.shape[2]
    documents, first = context.documents(cu_seqlens, T), context.offset(T)
    k, v = gather_prefix(k, context.group), gather_prefix(v, context.group)  # positions 0 .. first + T
    if documents.local is None:
        return attend(q, k, v)
    bounds = documents.local.tolist()
    ys = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        begins = first + a - int(documents.positions[a])  # where the document begins in the whole row
        ys.append(attend(q[:, :, a:b], k[:, :, begins : first + b], v[:, :, begins : first + b]))
    return torch.cat(ys, dim=2)


def attend_halo(attend: Callable, q, k, v, context: Context, n: int, cu_seqlens: torch.Tensor | None = None):
    """attend(q, k, v, starts) -> y of this rank's queries q [B, H, T, D] over its keys after the previous rank's
    last n (its halo; zeros on the first rank, which no query reads), starts [T] the first key each query may read:
    its document's start among the keys (cu_seqlens: the whole row's boundaries)."""
    T = q.shape[2]
    positions = context.documents(cu_seqlens, T).positions.to(q.device)  # each token's, in its document
    k, v = (torch.cat((context.previous(t, n), t), dim=-2) for t in (k, v))
    return attend(q, k, v, (n + torch.arange(T, device=q.device) - positions).clamp(min=0))  # keys: the halo first


def run_shard(shard: Shard, diagonal: bool = False, group=None, initial_state=None):
    """This rank's shard of a sequence whose shards lie on the ranks of `group` in rank order -> (its outputs, the
    final state of the whole sequence, which every rank gets). initial_state, where given, is the state before the
    first shard (the same on every rank)."""
    M, U = transition(shard, diagonal)
    start, final = _ShardStart.apply(M, U, initial_state, group, diagonal)
    outputs, _ = shard(start)
    return outputs, final


def split(op: Callable, timed: tuple, context: Context, cu_seqlens: torch.Tensor | None = None, *,
          diagonal: bool = False, **options):
    """op(*timed, initial_state=, cu_seqlens=, **options) -> (outputs, final state) over this rank's shard of the
    sequence, packed documents too (cu_seqlens: the whole row's boundaries; `Documents.run`): (its outputs, the
    whole sequence's final state). timed: the inputs with time on dim 2 (None stays None), for a matrix transition
    (not diagonal) q, k, v first, whose silent shard reads values of zeros as wide as the keys (`Shard`)."""
    length = timed[0].shape[2]

    def piece(time, start, cu, silent):
        inputs = [None if x is None else x[:, :, time] for x in timed]
        if silent:  # h_end = M h_start: nothing written, at the width D_k of the identity it starts from
            inputs[2] = inputs[2].new_zeros(*inputs[2].shape[:-1], inputs[1].shape[-1])
        return op(*inputs, initial_state=start, cu_seqlens=cu, **options)

    return context.scan(context.documents(cu_seqlens, length).run(piece, length), diagonal)


def matrix_shard(op: Callable, q, k, v, *gates, **options) -> Shard:
    """A shard of an op whose matrix state follows h_t = A_t h_{t-1} + (a term linear in v_t), op(q, k, v, *gates,
    initial_state=...) -> (o, state [B, H, D_k, D_v]). Its transition is a D_k x D_k matrix."""

    def shard(start, silent=False):
        values = v.new_zeros(*v.shape[:-1], start.shape[-1]) if silent else v
        return op(q, k, values, *gates, initial_state=start, **options)

    return shard
