"""The mixer protocol and the registry that maps names to mixers.

A mixer maps x [B, T, d_model] to y [B, T, d_model] and may continue from a state (a KV cache, a
recurrent state, ...) so that one forward over a sequence equals a prefill followed by token-by-token
steps. A packed call, mixer(x, cu_seqlens=...), runs several sequences laid end to end in one row
(flash-linear-attention's convention): no token reads anything before its own sequence's start. The
decoder only ever talks to mixers through this protocol.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import nn

from ..errors import ConfigError, UserError, unknown_name
from ..typed import from_dict
from .packing import check_boundaries, packed_by_right_padding, sequences, stack_rows, state_batch


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
    backends: tuple[str, ...] = ("torch",)  # the forms its sequences can run on (the `backend` option, if several)
    # options under which its forward is deterministic (checks against fp64 need one answer, not a sampled estimate)
    deterministic: tuple[tuple[str, object], ...] = ()
    state_type: type | None = None  # the class of the states it makes (None: undeclared, so not checked)

    def __init__(self, cfg: MixerConfig):
        super().__init__()
        self.cfg = cfg

    def __call__(self, x: torch.Tensor, state=None, cu_seqlens: torch.Tensor | None = None, keep_state: bool = True):
        """forward(x, state), or packed(x, cu_seqlens) given the boundaries of packed sequences (packed_outputs
        and no state where keep_state is false: training and scoring keep none), of an input checked here, for
        every mixer: a wrong shape fails in one line that names the expected one rather than deep inside the
        mixer's arithmetic. So is the state (check_state), and the state returned is marked as this mixer's."""
        check_input(x, self.cfg.d_model)
        if cu_seqlens is not None:
            check_boundaries(cu_seqlens, x, state)
            y, states = self.packed(x, cu_seqlens) if keep_state else (self.packed_outputs(x, cu_seqlens), None)
        elif isinstance(state, list):
            y, states = self.rows(x, state)
        else:
            self.check_state(state, x.shape[0])
            y, states = super().__call__(x, state)
        return y, self.marked(states)

    def check_state(self, state, batch: int) -> None:
        """A UserError unless state is None or a state of this mixer (its state_type, not marked as another
        mixer's) holding `batch` sequences: another mixer's state would be read as this one's keys or memory,
        and one of another batch would fail deep in the arithmetic."""
        if state is None:
            return
        maker, made = getattr(state, "mixer", ""), self.made_state_type()
        if maker not in ("", self.name) or (made is not None and not isinstance(state, made)):
            kind = f"{type(state).__name__} from {maker}, another mixer" if maker not in ("", self.name) else (
                f"{type(state).__name__}, not the {made.__name__} {self.name} makes")
            raise UserError(f"the state given to {self.name} is a {kind}; give it what {self.name}'s init_state or "
                            "its own previous call returned, or None to start afresh")
        held = state_batch(state)
        if held is not None and held != batch:
            raise UserError(f"the state given to {self.name} holds {held} sequences, the input {batch}; give it the "
                            f"state of these rows, or init_state({batch}) to start afresh")

    def made_state_type(self) -> type | None:
        """state_type, or where a mixer declares none (a plugin's), the class of its init_state, found once on the
        meta device (no memory); None where that cannot be built there."""
        if self.state_type is None and "_made_state_type" not in self.__dict__:
            try:
                self._made_state_type = type(self.init_state(1, device="meta"))
            except Exception:  # noqa: BLE001  (a plugin's init_state may need a real device: then no type check)
                self._made_state_type = None
        return self.state_type or self.__dict__["_made_state_type"]

    def marked(self, state):
        """state (or each of a list of them) marked as made by this mixer, for check_state."""
        for one in state if isinstance(state, list) else [state]:
            if isinstance(getattr(one, "mixer", None), str):
                one.mixer = self.name
        return state

    def rows(self, x: torch.Tensor, states: list):
        """x [B, T, d_model] continuing one state per row (as a packed call returns them, one per sequence) ->
        (y, the batched state): in one batch where the rows' states stack (stack_rows); else (KV caches of
        different lengths, different positions) row by row, returning the list of their states."""
        if len(states) != x.shape[0]:
            raise UserError(f"a list of states holds one per row: got {len(states)} for a batch of {x.shape[0]}")
        for state in states:
            self.check_state(state, 1)
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
        return packed_by_right_padding(self, x, cu_seqlens)[0]

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

    def auto_backend(self, **machine) -> tuple[str, str]:
        """(the backend backend=auto takes, why) on a machine with these facts (`ops.fla.auto_route`'s)."""
        return "torch", "its only form"

    def read_limit(self) -> tuple[int, str] | None:
        """(the most tokens one read can hold, the option that sets it), for a mixer that cannot read any number;
        None where it can."""
        return None

    def cost_advice(self) -> str | None:
        """What one query costs in this configuration and a cheaper one to try, printed with the estimate before
        an expensive training run; None where the mixer has nothing to add."""
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
