"""How the chunkwise forms lay out time, and packed sequences with it.

Time in chunks: inputs cast for the recurrences, padded to whole chunks and split into them. Packed sequences
(cu_seqlens, flash-linear-attention's convention: the start of every sequence laid end to end in one row, and the
end of the last): their lengths grouped for batches padded at their ends, their layout in chunks for the chunkwise
forms (each sequence moved to begin at a chunk), and the states of rows taken apart and put together again (one
state per sequence, one batch of them)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import fields

import torch
import torch.nn.functional as F

from ..nn import at_least_fp32, causal_mask, no_autocast


def autocast_off(op):
    """Run op with autocast disabled on its inputs' device, so that the op alone chooses the precision of its
    products: the recurrent ops cast their inputs to `at_least_fp32` (autocast would otherwise run their
    products in bf16 and round the states, decay sums and statistics they produce); others compute in their
    inputs' dtype."""

    @functools.wraps(op)
    def run(*args, **kwargs):
        with no_autocast(args[0].device):
            return op(*args, **kwargs)

    return run


def prepare_memory_inputs(q, k, v, *gates, scale=None, state=None):
    """The inputs of a linear-attention recurrence in q's compute dtype (`at_least_fp32`): (q * scale, k, v,
    *gates, state). q, k [..., D_k], v [..., D_v] with leading [B, H]; scale defaults to D_k^-1/2; a missing
    state is zeros [B, H, D_k, D_v]."""
    q = at_least_fp32(q)
    dtype = q.dtype
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if state is None:
        state = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
    return q * scale, k.to(dtype), v.to(dtype), *(x.to(dtype) for x in gates), state.to(dtype)


def pad_time(x: torch.Tensor, length: int, dim: int = 2) -> torch.Tensor:
    """Zero-pad dimension `dim` (time) of x up to `length`."""
    missing = length - x.shape[dim]
    if missing == 0:
        return x
    pad = [0, 0] * (x.ndim - 1 - dim) + [0, missing]
    return F.pad(x, pad)


def chunk_layout(length: int, chunk_size: int) -> tuple[int, int]:
    """(C, padded) for a time axis of `length`: the chunk length (chunk_size, or the whole sequence when it is
    shorter; at least 1) and the length rounded up to whole chunks."""
    C = min(chunk_size, max(length, 1))
    return C, -(-length // C) * C


def to_chunks(x: torch.Tensor, chunk: int, padded: int) -> torch.Tensor:
    """[B, H, T, ...] zero-padded in time to `padded` (a multiple of chunk) -> [B, H, padded/chunk, chunk, ...]."""
    x = pad_time(x, padded)
    return x.reshape(*x.shape[:2], padded // chunk, chunk, *x.shape[3:])


def decay_matrix(b: torch.Tensor) -> torch.Tensor:
    """Gamma_ij = exp(b_i - b_j) for j <= i, else 0, from cumulative log-decays b [..., C].

    The exponent is masked before exp, so no overflow however strong the decay.
    """
    C = b.shape[-1]
    mask = causal_mask(C, C, b.device)
    return (b[..., :, None] - b[..., None, :]).masked_fill(~mask, float("-inf")).exp()


# ---------------------------------------------------------------------------------------------------------------
# packed sequences


def sequences(cu_seqlens: torch.Tensor) -> list[tuple[int, int]]:
    """[(start, end)] of every packed sequence."""
    bounds = cu_seqlens.tolist()
    return list(zip(bounds[:-1], bounds[1:], strict=True))


# ---------------------------------------------------------------------------------------------------------------
# batches of similar lengths, padded at their ends


def length_groups(cu_seqlens: torch.Tensor, slack: float = 1.25) -> list[list[int]]:
    """The packed sequences' indices grouped for batching by length: longest first, each group's shortest at
    least 1 / slack of its longest, so that padding a group to its longest at most multiplies its tokens by
    slack. (1.25 came out best of 1, 1.1, 1.25, 2 and a single group in training steps of gla, gdn, ccq-gla and
    interdomain on rows of 512 tokens packed with documents of 64 to 1,024, when they took this form: more
    groups cost calls, fewer cost padding.)"""
    lengths = cu_seqlens.diff().tolist()
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if groups and lengths[i] * slack >= lengths[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def span_groups(cu_seqlens: torch.Tensor) -> list[list[tuple[int, int]]]:
    """length_groups as the (start, end) spans of their sequences."""
    spans = sequences(cu_seqlens)
    return [[spans[i] for i in group] for group in length_groups(cu_seqlens)]


def padded_groups(run, x: torch.Tensor, cu_seqlens: torch.Tensor):
    """The packed sequences of x [1, N, d] run as batches of similar lengths (length_groups) by run(rows) -> (y,
    state), each batch rows padded at their ends, which a causal map cannot read before them. Yields (the
    sequence's index, its outputs [length, d], its group's batched state, its row in it), for every sequence. A
    row's state has read its padding too: only a state that can be cut to the row's own tokens (a KV cache) is
    that sequence's."""
    spans = sequences(cu_seqlens)
    for group in length_groups(cu_seqlens):
        pieces = [x[0, spans[i][0] : spans[i][1]] for i in group]
        y, state = run(torch.nn.utils.rnn.pad_sequence(pieces, batch_first=True))
        for row, (i, piece) in enumerate(zip(group, pieces, strict=True)):
            yield i, y[row, : len(piece)], state, row


# ---------------------------------------------------------------------------------------------------------------
# the chunkwise forms' layout: every sequence begins at a chunk, where the state scan starts afresh


class SequenceStarts:
    """The state scan over chunks of rows of packed sequences that each begin at a chunk: the state entering a
    chunk that begins a sequence is zeros. starts: bool [B, N_chunks], True at the chunks that begin a sequence
    (from ChunkAlignment); None: one sequence per row, as usual. With starts, `final` gives the state after
    every chunk, [B, N_chunks, ...], from which ChunkAlignment.final_states takes each sequence's last."""

    def __init__(self, starts: torch.Tensor | None, h: torch.Tensor):
        self.keep = None if starts is None else (~starts).to(h.device, h.dtype)
        self.after: list[torch.Tensor] = []  # the state after each chunk, before any reset

    def entering(self, n: int, h: torch.Tensor) -> torch.Tensor:
        """The state that enters chunk n, given the state the chunk before it left."""
        if self.keep is None:
            return h
        if n:
            self.after.append(h)
        return h * self.keep[:, n].view(-1, *[1] * (h.ndim - 1))

    def final(self, h: torch.Tensor) -> torch.Tensor:
        return h if self.keep is None else torch.stack((*self.after, h), dim=1)


def aligned(chunk_op, cu_seqlens: torch.Tensor, chunk_size: int, sequence_inputs: tuple, *args, **kwargs):
    """chunk_op over the sequences packed in its sequence inputs [1, H, N, ...] (None stays None), each moved to
    begin at a chunk (ChunkAlignment), with chunk_op(*those, *args, chunk_size=, starts=, **kwargs) -> (o, the
    state after every chunk, or None). Returns (o [1, H, N, ...], each sequence's final state [N_seq, ...], or
    None where chunk_op keeps none)."""
    align = ChunkAlignment(cu_seqlens, chunk_size)
    spread = [None if x is None else align.spread(x) for x in sequence_inputs]
    o, after = chunk_op(*spread, *args, chunk_size=align.chunk_size, starts=align.starts, **kwargs)
    return align.gather(o), None if after is None else align.final_states(after)


class ChunkAlignment:
    """Packed sequences (cu_seqlens, in one row) laid out for a chunk form whose scan starts afresh at every
    sequence: each sequence moved to begin at a chunk, and the sequences packed first-fit, longest first, into
    rows (so that the scan runs over a few rows of a few chunks rather than one long row). Zeros fill the rest of
    a sequence's last chunk and of a row: read after a sequence, they change none of its outputs, and where they
    add nothing to a state (k = v = 0, no decay) none of its state either.
    Padding is what a layout costs, so the chunk is chunk_size, halved (down to 16) while rounding every sequence up to
    whole chunks would add more than a tenth to its tokens, and the rows are as wide as the longest sequence or
    wider, up to twice, whichever lays the sequences out in the fewest positions. (Training steps of gla, gdn,
    ccq-gdn and interdomain on a CPU ran as fast with chunks of 32 as of 64, and rows of 512 tokens packed with
    documents of 64 to 1,024 tokens laid out 25% longer with chunks of 64 and rows as wide as the longest, 12.5%
    with these choices.)"""

    def __init__(self, cu_seqlens: torch.Tensor, chunk_size: int):
        lengths = tuple(cu_seqlens.diff().tolist())
        self.chunk_size, self.width, self.rows, place = _layout(lengths, chunk_size)
        K = self.chunk_size
        self.index = torch.cat([row * self.width + offset + torch.arange(n)
                                for (row, offset), n in zip(place, lengths, strict=True)])
        self.starts = torch.zeros(self.rows, self.width // K, dtype=torch.bool)
        for row, offset in place:
            self.starts[row, offset // K] = True
        self.last_chunk = [(row, (offset + n - 1) // K) for (row, offset), n in zip(place, lengths, strict=True)]

    def spread(self, x: torch.Tensor) -> torch.Tensor:
        """[1, H, N, ...] -> [rows, H, width, ...]."""
        shape = list(x.shape)
        shape[2] = self.rows * self.width
        laid = x.new_zeros(shape).index_copy(2, self.index.to(x.device), x)
        return laid.unflatten(2, (self.rows, self.width))[0].movedim(1, 0)

    def gather(self, y: torch.Tensor) -> torch.Tensor:
        """[rows, H, width, ...] -> [1, H, N, ...], the sequences' positions in their order."""
        return y.movedim(0, 1).flatten(1, 2)[None].index_select(2, self.index.to(y.device))

    def final_states(self, after: torch.Tensor) -> torch.Tensor:
        """Each sequence's last state, [N_seq, ...], from the state after every chunk [rows, N_chunks, ...]."""
        rows, chunks = zip(*self.last_chunk, strict=True)
        return after[list(rows), list(chunks)]


@functools.lru_cache(maxsize=16)  # every layer of a model lays out the same batch
def _layout(lengths: tuple[int, ...], chunk_size: int) -> tuple[int, int, int, list[tuple[int, int]]]:
    """(chunk, width, rows, (row, offset) of every sequence) of ChunkAlignment's layout."""
    K = _layout_chunk(lengths, chunk_size)
    room = [-(-n // K) * K for n in lengths]  # whole chunks
    places = {width: _first_fit(room, width) for width in _row_widths(max(room), K)}
    rows = {width: 1 + max(row for row, _ in place) for width, place in places.items()}
    width = min(places, key=lambda width: (rows[width] * width, width))  # the fewest positions
    return K, width, rows[width], places[width]


def _layout_chunk(lengths: tuple[int, ...], chunk_size: int) -> int:
    """chunk_size, halved while rounding the lengths up to whole chunks adds more than a tenth (not below 16)."""
    K = chunk_size
    while K // 2 >= 16 and sum(-(-n // K) * K for n in lengths) > 1.1 * sum(lengths):
        K //= 2
    return K


def _row_widths(longest: int, chunk: int) -> list[int]:
    """Row widths to try: whole chunks from the longest sequence's up to twice it."""
    return sorted({-(-int(longest * f) // chunk) * chunk for f in (1, 1.25, 1.5, 1.75, 2)})


def _first_fit(room: list[int], width: int) -> list[tuple[int, int]]:
    """(row, offset) of every sequence, packing sequences of these sizes first-fit, longest first, into rows of
    this width."""
    used: list[int] = []  # the width each row has used
    place = [(0, 0)] * len(room)
    for i in sorted(range(len(room)), key=lambda i: -room[i]):
        row = next((r for r, taken in enumerate(used) if taken + room[i] <= width), len(used))
        if row == len(used):
            used.append(0)
        place[i] = (row, used[row])
        used[row] += room[i]
    return place


# ---------------------------------------------------------------------------------------------------------------
# the states of rows: one per sequence, or one batch of them


def stack_rows(states: list):
    """One batched state of per-row states of batch 1 (the inverse of state_row): tensors concatenated along dim
    0, in dataclasses, tuples or lists; None where the rows cannot be batched (tensors of different shapes, such
    as KV caches of different lengths, or other fields that differ, such as positions)."""
    stacked = _stacked(states)
    return None if stacked is _UNBATCHABLE else stacked


_UNBATCHABLE = object()


def _stacked(states: list):
    first = states[0]
    if any(type(s) is not type(first) for s in states):
        return _UNBATCHABLE
    if isinstance(first, torch.Tensor):
        return torch.cat(states) if all(s.shape[1:] == first.shape[1:] for s in states) else _UNBATCHABLE
    if dataclasses.is_dataclass(first):
        parts = {f.name: _stacked([getattr(s, f.name) for s in states]) for f in fields(first) if f.init}
        return _UNBATCHABLE if any(part is _UNBATCHABLE for part in parts.values()) else type(first)(**parts)
    if isinstance(first, (tuple, list)):
        if any(len(s) != len(first) for s in states):
            return _UNBATCHABLE
        parts = [_stacked(list(column)) for column in zip(*states, strict=True)]
        return _UNBATCHABLE if any(part is _UNBATCHABLE for part in parts) else type(first)(parts)
    return first if all(s == first for s in states) else _UNBATCHABLE  # None, ints: the same in every row


def state_batch(state) -> int | None:
    """The number of sequences a state holds: dim 0 of its first tensor (None where it holds none)."""
    if isinstance(state, torch.Tensor):
        return state.shape[0] if state.ndim else None
    if dataclasses.is_dataclass(state):
        state = [getattr(state, f.name) for f in fields(state)]
    for part in state if isinstance(state, (tuple, list)) else []:
        if (batch := state_batch(part)) is not None:
            return batch
    return None


def state_row(state, row: int):
    """Row `row` of a batched state (tensors batched along dim 0, in dataclasses, tuples or lists), as batch 1."""
    if state is None or isinstance(state, (str, int, float)):  # the same in every row (the maker's name)
        return state
    if isinstance(state, torch.Tensor):
        return state[row : row + 1]
    if dataclasses.is_dataclass(state):
        return dataclasses.replace(state, **{f.name: state_row(getattr(state, f.name), row)
                                             for f in fields(state) if f.init})
    if isinstance(state, (tuple, list)):
        return type(state)(state_row(part, row) for part in state)
    raise TypeError(f"cannot take a row of a state of type {type(state).__name__}")
