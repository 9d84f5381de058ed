"""Packed sequences (cu_seqlens, flash-linear-attention's convention): their boundaries checked, the generic
forms that run them (batches of similar lengths padded at their ends), and the states of rows taken apart and
put together again (one state per sequence, one batch of them)."""

from __future__ import annotations

import dataclasses
from dataclasses import fields

import torch
from torch import nn

from ..errors import UserError


def check_boundaries(cu_seqlens, x: torch.Tensor, state) -> None:
    """A UserError unless cu_seqlens can pack x [1, N, d]: a 1-D integer tensor 0 = s_0 < s_1 < ... = N, the
    start of every sequence and the end of the last, with no state to continue (each sequence starts afresh)."""
    def refuse(problem: str):
        raise UserError(f"cu_seqlens {problem}; give the starts of the packed sequences and the end of the last, "
                        f"e.g. [0, 5, {max(x.shape[1], 6)}] for a row of {x.shape[1]} tokens")

    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.ndim != 1 or cu_seqlens.is_floating_point():
        refuse("must be a 1-D tensor of integers")
    if x.shape[0] != 1:
        refuse(f"packs sequences into one row, so the input must be [1, N, d_model]; got batch {x.shape[0]}")
    if state is not None:
        refuse("starts every sequence afresh: a packed call takes no state")
    bounds = cu_seqlens.tolist()
    if len(bounds) < 2 or bounds[0] != 0:
        refuse(f"must start at 0 and hold at least one sequence; got {bounds[:4]}")
    if any(b <= a for a, b in zip(bounds, bounds[1:], strict=False)):
        refuse(f"must be strictly increasing; got {bounds if len(bounds) <= 8 else bounds[:8] + ['...']}")
    if bounds[-1] != x.shape[1]:
        refuse(f"must end at the row's length {x.shape[1]}; got {bounds[-1]}")


def sequences(cu_seqlens: torch.Tensor) -> list[tuple[int, int]]:
    """[(start, end)] of every packed sequence."""
    bounds = cu_seqlens.tolist()
    return list(zip(bounds[:-1], bounds[1:], strict=True))


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


def padded_groups(mixer: nn.Module, x: torch.Tensor, cu_seqlens: torch.Tensor):
    """The packed sequences run as batches of similar lengths (length_groups), each a batch of rows padded at their
    ends, which a causal mixer cannot read before them. Yields (the sequence's index, its outputs [length,
    d_model], its group's batched state, its row in it), for every sequence. A row's state has read its padding
    too: a mixer that keeps states trims them (a KV cache to the row's length)."""
    spans = sequences(cu_seqlens)
    for group in length_groups(cu_seqlens):
        pieces = [x[0, spans[i][0] : spans[i][1]] for i in group]
        y, state = nn.Module.__call__(mixer, nn.utils.rnn.pad_sequence(pieces, batch_first=True))
        for row, (i, piece) in enumerate(zip(group, pieces, strict=True)):
            yield i, y[row, : len(piece)], state, row


def packed_by_right_padding(mixer: nn.Module, x: torch.Tensor, cu_seqlens: torch.Tensor, row_state=None):
    """padded_groups' outputs back in order, [1, N, d_model], and, given row_state(state, row, length) (a
    sequence's own state from its group's batched one), the state of every sequence in order (else None).
    Mixer.packed_outputs for any causal mixer."""
    outputs, states = {}, {}
    for i, y, state, row in padded_groups(mixer, x, cu_seqlens):
        outputs[i] = y
        if row_state is not None:
            states[i] = row_state(state, row, len(y))
    order = range(len(outputs))
    return torch.cat([outputs[i] for i in order])[None], [states[i] for i in order] if row_state else None


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
