"""The mixer protocol and the registry that maps names to mixers.

A mixer maps x [B, T, d_model] to y [B, T, d_model] and may continue from a state (a KV cache, a
recurrent state, ...) so that one forward over a sequence equals a prefill followed by token-by-token
steps. A packed call, mixer(x, cu_seqlens=...), runs several sequences laid end to end in one row
(flash-linear-attention's convention): no token reads anything before its own sequence's start. The
decoder only ever talks to mixers through this protocol.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields

import torch
from torch import nn

from ..errors import ConfigError, UserError, unknown_name
from ..typed import from_dict


@dataclass
class MixerConfig:
    """Fields every mixer has; each mixer extends this with its own typed fields."""

    d_model: int = 128
    n_heads: int = 4
    layer_idx: int = 0  # 0-based depth of the layer, for depth-dependent initialisation

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def validate(self) -> None:
        if self.d_model <= 0 or self.n_heads <= 0 or self.d_model % self.n_heads:
            raise ConfigError(
                f"n_heads={self.n_heads} must be positive and divide d_model={self.d_model}"
            )


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
    slack. (1.25 measured best of 1, 1.1, 1.25, 2 and one group for gla, gdn, ccq-gla and interdomain training
    steps on rows of 512 tokens packed with documents of 64 to 1,024: more groups cost calls, fewer padding.)"""
    lengths = cu_seqlens.diff().tolist()
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if groups and lengths[i] * slack >= lengths[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


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


def packed_by_right_padding(mixer: nn.Module, x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Mixer.packed_outputs for any causal mixer: padded_groups' outputs, back in order."""
    outputs = dict((i, y) for i, y, _, _ in padded_groups(mixer, x, cu_seqlens))
    return torch.cat([outputs[i] for i in range(len(outputs))])[None]


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


def state_row(state, row: int):
    """Row `row` of a batched state (tensors batched along dim 0, in dataclasses, tuples or lists), as batch 1."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return state[row : row + 1]
    if dataclasses.is_dataclass(state):
        return dataclasses.replace(state, **{f.name: state_row(getattr(state, f.name), row)
                                             for f in fields(state) if f.init})
    if isinstance(state, (tuple, list)):
        return type(state)(state_row(part, row) for part in state)
    raise TypeError(f"cannot take a row of a state of type {type(state).__name__}")


def check_input(x, d_model: int) -> None:
    """A UserError unless x is a tensor [batch, time, d_model] holding at least one token."""
    if isinstance(x, torch.Tensor) and x.ndim == 3 and x.shape[-1] == d_model and 0 not in x.shape[:2]:
        return
    got = list(x.shape) if isinstance(x, torch.Tensor) else f"a {type(x).__name__}, not a tensor"
    raise UserError(f"mixer input must be [batch, time, d_model={d_model}] with batch and time >= 1; got {got}")


class Mixer(nn.Module):
    """Base class of all token mixers."""

    config_class: type[MixerConfig] = MixerConfig
    name: str = ""
    compile_exclusion: str | None = None  # why train.compile=true leaves this mixer's blocks eager, if it does

    def __init__(self, cfg: MixerConfig):
        super().__init__()
        self.cfg = cfg

    def __call__(self, x: torch.Tensor, state=None, cu_seqlens: torch.Tensor | None = None, keep_state: bool = True):
        """forward(x, state), or packed(x, cu_seqlens) given the boundaries of packed sequences (packed_outputs
        and no state where keep_state is false: training and scoring keep none), of an input checked here, for
        every mixer: a wrong shape fails in one line that names the expected one rather than deep inside the
        mixer's arithmetic."""
        check_input(x, self.cfg.d_model)
        if cu_seqlens is not None:
            check_boundaries(cu_seqlens, x, state)
            return self.packed(x, cu_seqlens) if keep_state else (self.packed_outputs(x, cu_seqlens), None)
        if isinstance(state, list):
            return self.rows(x, state)
        return super().__call__(x, state)

    def rows(self, x: torch.Tensor, states: list):
        """x [B, T, d_model] continuing one state per row (as a packed call returns them, one per sequence) ->
        (y, the batched state): in one batch where the rows' states stack (stack_rows); else (KV caches of
        different lengths, different positions) row by row, returning the list of their states."""
        if len(states) != x.shape[0]:
            raise UserError(f"a list of states holds one per row: got {len(states)} for a batch of {x.shape[0]}")
        batched = stack_rows(states)
        if batched is not None:
            return super().__call__(x, batched)
        outputs, ends = zip(*(nn.Module.__call__(self, x[row : row + 1], state) for row, state in enumerate(states)),
                            strict=True)
        return torch.cat(outputs), list(ends)

    def packed(self, x: torch.Tensor, cu_seqlens: torch.Tensor):
        """x [1, N, d_model] holding sequences that start at cu_seqlens (checked) -> (y [1, N, d_model], the
        state of each sequence at its end, in order), as if each sequence were run on its own. This reference
        form does exactly that, one sequence at a time; a mixer overrides it with a form that runs them at once
        (a block-diagonal mask, a state reset at each start)."""
        outputs, states = [], []
        for start, end in sequences(cu_seqlens):
            y, state = super().__call__(x[:, start:end])
            outputs.append(y)
            states.append(state)
        return torch.cat(outputs, dim=1), states

    def packed_outputs(self, x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """The outputs of packed(x, cu_seqlens) without the states: here the sequences as batches of rows padded
        at their ends (packed_by_right_padding), exact for every causal mixer; a mixer whose packed form runs
        the sequences at once overrides it with that."""
        return packed_by_right_padding(self, x, cu_seqlens)

    def forward(self, x: torch.Tensor, state=None):
        """x [B, T, d_model], state from ``init_state`` or a previous call -> (y [B, T, d_model], state)."""
        raise NotImplementedError

    def reset_parameters(self, n_layers: int = 1) -> None:
        """Initialise the linear maps for a model n_layers deep: N(0, 0.02) weights and zero biases, except
        the output projection, which writes into the residual stream and gets std 0.02 / sqrt(2 n_layers)
        so that the stream's variance does not grow with depth (GPT-2). The decoder calls this with its
        depth; ``build_mixer`` with 1. Parameters that are not in an nn.Linear (time constants, couplings,
        per-head weights) keep what the mixer's constructor drew."""
        residual_std = 0.02 / math.sqrt(2 * n_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=residual_std if name == "out_proj" else 0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def ablated(self):
        """A context manager under which the mixer runs without the component its paper adds (Boltzmann's
        couplings, the coupling's step, CCQ's correction), to measure at evaluation how much the trained model
        uses it; None where the mixer has no such component."""
        return None

    def init_state(self, batch: int, device=None, dtype=None):
        """The state before the first token."""
        raise NotImplementedError

    def state_size(self, seq_len: int) -> int:
        """Numbers held per sequence after ``seq_len`` tokens."""
        raise NotImplementedError


_REGISTRY: dict[str, type[Mixer]] = {}


def register_mixer(name: str):
    """Class decorator: ``@register_mixer("softmax")`` makes the mixer buildable by name."""

    def add(cls: type[Mixer]) -> type[Mixer]:
        if name in _REGISTRY:
            raise ValueError(f"mixer '{name}' is already registered by {_REGISTRY[name].__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return add


def list_mixers() -> list[str]:
    return sorted(_REGISTRY)


def mixer_class(name: str) -> type[Mixer]:
    if name not in _REGISTRY:
        raise ConfigError(unknown_name("mixer", name, _REGISTRY))
    return _REGISTRY[name]


def mixer_fields(name: str) -> list[str]:
    return [f.name for f in fields(mixer_class(name).config_class)]


def mixer_config(name: str, where: str | None = None, **options) -> MixerConfig:
    """The validated, typed config of a registered mixer; `where` names its place in error messages."""
    cfg = from_dict(mixer_class(name).config_class, options, where=where or name)
    try:
        cfg.validate()
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}" if where else str(err)) from None
    return cfg


def build_mixer(name: str, **config) -> Mixer:
    """Build a registered mixer, initialised as one layer, e.g.
    ``build_mixer("softmax", d_model=256, n_heads=4, rope=False)``."""
    mixer = mixer_class(name)(mixer_config(name, **config))
    mixer.reset_parameters()
    return mixer
