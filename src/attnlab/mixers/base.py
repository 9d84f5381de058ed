"""The mixer protocol, and `mix`, which every call of a mixer goes through.

A mixer maps x [B, T, d_model] to y [B, T, d_model] and may continue from a state (a KV cache, a recurrent state,
...) so that one forward over a sequence equals a prefill followed by token-by-token steps. A packed call,
mixer(x, cu_seqlens=...), runs several sequences laid end to end in one row (flash-linear-attention's
convention): no token reads anything before its own sequence's start, and each sequence ends in its own state.
The decoder only ever talks to mixers through this protocol.

What is the same for every mixer lives in `mix`, not in the mixers: the input and state checks, lists of
per-row states, and packed sequences for a mixer whose forward does not run them itself (`Mixer.packs`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from ..errors import ConfigError, UserError
from ..ops.packing import padded_groups, sequences, stack_rows, state_batch
from ..typed import check_choices


@dataclass
class MixerConfig:
    """Fields every mixer has; each mixer extends this with its own typed fields."""

    d_model: int = 128
    n_heads: int = 4
    layer_idx: int = 0  # 0-based depth of the layer, for depth-dependent initialisation

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def read_limit(self) -> tuple[int, str] | None:
        """(the most tokens one read can hold, the option that sets it), for a mixer that cannot read any number
        (Decoder.read_limit, which generate checks); None where it can."""
        return None

    @property
    def halo(self) -> tuple[int, str] | None:
        """(the tokens of the previous shard that a shard reads across its boundary when a sequence is split across
        ranks, the option that sets them), checked against the shard's length before training; None: none."""
        return None

    @property
    def cost_advice(self) -> str | None:
        """What one query costs in this configuration and a cheaper one to try, printed with the estimate before
        an expensive training run; None where there is nothing to add."""
        return None

    def validate(self) -> None:
        check_choices(self, "")  # a config built in Python is refused as one read from a file
        if self.d_model <= 0 or self.n_heads <= 0 or self.d_model % self.n_heads:
            raise ConfigError(
                f"n_heads={self.n_heads} must be positive and divide d_model={self.d_model}"
            )


class Mixer(nn.Module):
    """Base class of all token mixers: forward, init_state, state_size, reset_parameters and ablated, called
    through mix (mixer(x, state) is mix(mixer, x, state))."""

    config_class: type[MixerConfig] = MixerConfig
    name: str = ""
    compile_exclusion: str | None = None  # why train.compile=true leaves this mixer's blocks eager, if it does
    backends: tuple[str, ...] = ("torch",)  # the forms its sequences can run on (the `backend` option, if several)
    # options under which its forward is deterministic (checks against fp64 need one answer, not a sampled estimate)
    deterministic: tuple[tuple[str, object], ...] = ()
    state_type: type | None = None  # the class of the states it makes (None: undeclared, so not checked)
    # how packed sequences (cu_seqlens) run. "states": forward(x, cu_seqlens=...) runs them at once and returns
    # each one's state. "outputs": forward runs them at once but keeps no states, so where states are kept mix
    # runs them one at a time. "padded": mix runs them as batches padded at their ends, and cuts each row's
    # state to its own tokens (state.row(row, length): a KV cache, which causal attention fills with no padding).
    # None: mix runs them, as padded batches where no states are kept, else one at a time.
    packs: str | None = None
    # what forward(x, context=...) runs of one rank's shard (ops.cp.Context), its outputs those of the
    # whole sequences' positions there, its gradients the whole sequences', and its state (where it returns one,
    # unpacked) the whole sequences' final one on every rank; packed documents too (cu_seqlens the whole row's
    # boundaries). False: it does not split
    splits: bool = False

    def __init__(self, cfg: MixerConfig):
        super().__init__()
        self.cfg = cfg

    def __call__(self, x: torch.Tensor, state=None, cu_seqlens: torch.Tensor | None = None, keep_state: bool = True,
                 context=None):
        return mix(self, x, state, cu_seqlens, keep_state, context)

    def forward(self, x: torch.Tensor, state=None, *, cu_seqlens: torch.Tensor | None = None):
        """x [B, T, d_model], state from ``init_state`` or a previous call -> (y [B, T, d_model], state). Where
        `packs` says so, cu_seqlens: x [1, N, d_model] holds sequences that start there, each run from a fresh
        state -> (y, the list of their final states, or None)."""
        raise NotImplementedError

    def route(self, x: torch.Tensor, machine: dict | None = None) -> tuple[str, str]:
        """(the form of `backends` that forward runs x's sequences on, why): on this machine, or on one with these
        facts (`ops.fla.machine`'s), as the doctor's table says for a GPU it may lack. A mixer of several forms
        chooses among them here, and its forward by asking this."""
        return self.backends[0], "its only form"

    def init_state(self, batch: int, device=None, dtype=None):
        """The state before the first token."""
        raise NotImplementedError

    def state_size(self, seq_len: int) -> int:
        """Numbers held per sequence after ``seq_len`` tokens."""
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
        """A context manager under which the mixer runs without the component its paper adds (the couplings, a
        query's correction, ...), to measure at evaluation how much the trained model uses it; None where the
        mixer has no such component."""
        return None


def mix(mixer: Mixer, x: torch.Tensor, state=None, cu_seqlens: torch.Tensor | None = None, keep_state: bool = True,
        context=None):
    """mixer.forward(x, state), with what every mixer shares: the input checked (a wrong shape fails in one line
    that names the expected one rather than deep inside the mixer's arithmetic), the state checked (check_state),
    a list of one state per row continued (rows), packed sequences run (packed; with keep_state false, as
    training and scoring call it, without states, in the mixer's fastest form), one rank's shard of every
    sequence run (context), and the states returned marked as this mixer's."""
    check_input(x, mixer.cfg.d_model)
    if context is not None:
        check_splits(mixer)
        if state is not None:
            raise UserError("a sequence split across ranks runs from its start: give no state with a context")
        y, states = run(mixer, x, cu_seqlens=cu_seqlens, context=context)
    elif cu_seqlens is not None:
        check_boundaries(cu_seqlens, x, state)
        y, states = packed(mixer, x, cu_seqlens, keep_state)
    elif isinstance(state, list):
        y, states = rows(mixer, x, state)
    else:
        check_state(mixer, state, x.shape[0])
        y, states = run(mixer, x, state)
    return y, marked(mixer, states)


def check_splits(mixer: Mixer) -> None:
    """That the mixer splits a sequence across ranks."""
    if not mixer.splits:
        raise ConfigError(f"{mixer.name} cannot split a sequence across ranks (train.context_parallel): its forward "
                          "takes no context; use 1, or a mixer that splits")


def run(mixer: Mixer, *args, **kwargs):
    """mixer.forward through nn.Module's call (its hooks), past Mixer.__call__."""
    return nn.Module.__call__(mixer, *args, **kwargs)


def check_input(x, d_model: int) -> None:
    """A UserError unless x is a tensor [batch, time, d_model] holding at least one token."""
    if isinstance(x, torch.Tensor) and x.ndim == 3 and x.shape[-1] == d_model and 0 not in x.shape[:2]:
        return
    got = list(x.shape) if isinstance(x, torch.Tensor) else f"a {type(x).__name__}, not a tensor"
    raise UserError(f"mixer input must be [batch, time, d_model={d_model}] with batch and time >= 1; got {got}")


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


def check_state(mixer: Mixer, state, batch: int) -> None:
    """A UserError unless state is None or a state of this mixer (its state_type, not marked as another mixer's)
    holding `batch` sequences: another mixer's state would be read as this one's keys or memory, and one of
    another batch would fail deep in the arithmetic."""
    if state is None:
        return
    name, maker, made = mixer.name, getattr(state, "mixer", ""), made_state_type(mixer)
    if maker not in ("", name) or (made is not None and not isinstance(state, made)):
        kind = f"{type(state).__name__} from {maker}, another mixer" if maker not in ("", name) else (
            f"{type(state).__name__}, not the {made.__name__} {name} makes")
        raise UserError(f"the state given to {name} is a {kind}; give it what {name}'s init_state or its own "
                        "previous call returned, or None to start afresh")
    held = state_batch(state)
    if held is not None and held != batch:
        raise UserError(f"the state given to {name} holds {held} sequences, the input {batch}; give it the state "
                        f"of these rows, or init_state({batch}) to start afresh")


def made_state_type(mixer: Mixer) -> type | None:
    """state_type, or where a mixer declares none (a plugin's), the class of its init_state, found once on the
    meta device (no memory); None where that cannot be built there."""
    if mixer.state_type is None and "_made_state_type" not in mixer.__dict__:
        try:
            mixer._made_state_type = type(mixer.init_state(1, device="meta"))
        except Exception:  # noqa: BLE001  (a plugin's init_state may need a real device: then no type check)
            mixer._made_state_type = None
    return mixer.state_type or mixer.__dict__["_made_state_type"]


def marked(mixer: Mixer, state):
    """state (or each of a list of them) marked as made by this mixer, for check_state."""
    for one in state if isinstance(state, list) else [state]:
        if isinstance(getattr(one, "mixer", None), str):
            one.mixer = mixer.name
    return state


def rows(mixer: Mixer, x: torch.Tensor, states: list):
    """x [B, T, d_model] continuing one state per row (as a packed call returns them, one per sequence) -> (y, the
    batched state): in one batch where the rows' states stack (stack_rows); else (KV caches of different lengths,
    different positions) row by row, returning the list of their states."""
    if len(states) != x.shape[0]:
        raise UserError(f"a list of states holds one per row: got {len(states)} for a batch of {x.shape[0]}")
    for state in states:
        check_state(mixer, state, 1)
    batched = stack_rows(states)
    if batched is not None:
        return run(mixer, x, batched)
    outputs, ends = zip(*(run(mixer, x[row : row + 1], state) for row, state in enumerate(states)), strict=True)
    return torch.cat(outputs), list(ends)


def packed(mixer: Mixer, x: torch.Tensor, cu_seqlens: torch.Tensor, keep_state: bool = True):
    """x [1, N, d_model] holding sequences that start at cu_seqlens (checked) -> (y [1, N, d_model], the state of
    each sequence at its end, in order; None without keep_state), as if each sequence were run on its own: by
    the mixer's forward where it runs them itself (`Mixer.packs`), else as batches padded at their ends (exact
    for every causal mixer) or, where states are kept that padding would change, one sequence at a time."""
    if mixer.packs == "states" or (mixer.packs == "outputs" and not keep_state):
        y, states = run(mixer, x, cu_seqlens=cu_seqlens)
        return y, states if keep_state else None
    if not keep_state or mixer.packs == "padded":
        return by_padding(mixer, x, cu_seqlens, keep_state)
    outputs, states = zip(*(run(mixer, x[:, start:end]) for start, end in sequences(cu_seqlens)), strict=True)
    return torch.cat(outputs, dim=1), list(states)


def by_padding(mixer: Mixer, x: torch.Tensor, cu_seqlens: torch.Tensor, keep_state: bool):
    """The packed sequences as batches of similar lengths padded at their ends (`ops.packing.padded_groups`), in
    order, [1, N, d_model], and with keep_state each sequence's state: its row's, cut to its own tokens."""
    outputs, states = {}, {}
    for i, y, state, row in padded_groups(partial(run, mixer), x, cu_seqlens):
        outputs[i] = y
        if keep_state:
            states[i] = state.row(row, len(y))
    order = range(len(outputs))
    return torch.cat([outputs[i] for i in order])[None], [states[i] for i in order] if keep_state else None
