"""Where each mixer's sequences run under backend=auto, and why: the one routing policy, keyed by mixer.

The facts it reads are the machine's (`ops.fla.machine`: a CUDA GPU, a Hopper one, the fla and Triton
versions installed, whether fla's TileLang backend can run); the forms it chooses between sit beside it
(`ops.fla` for flash-linear-attention's kernels, `ops.ising_triton` for banded inference, FlexAttention).
"""

from __future__ import annotations

import functools
import logging
import re

import torch

from ..ops import fla as fla_ops

log = logging.getLogger(__name__)

BACKENDS = ("torch", "fla", "auto")  # the `backend` option of the mixers that have fla forms
FIXED_TRITON = (3, 7, 1)  # the first Triton that compiles fla's scalar-gated backward correctly on Hopper GPUs
NO_BLOCK_POINTERS = (3, 8, 0)  # the first Triton without block pointers (tl.make_block_ptr), which older fla uses
FLA_WITHOUT_BLOCK_POINTERS = (0, 5, 2)  # the first fla whose kernels no longer use them
INSTALL_HINT = fla_ops.INSTALL_HINT


def auto_route(scalar_gates: bool, *, cuda: bool, hopper: bool, fla: str | None, triton: str | None,
               tilelang: bool) -> tuple[bool, str]:
    """(whether backend=auto runs fla's kernels, why) on a machine with these facts: a CUDA GPU, a Hopper one,
    the installed fla and Triton versions (None: not installed) and whether fla's TileLang backend can run.
    Triton 3.4.0 to 3.7.0 miscompiles the backward of fla's scalar-gated kernels (the gated delta rule,
    decayed CCQ's statistics) on Hopper, and fla 0.6.0 refuses it there; Triton 3.7.1 fixes it, and fla's
    TileLang backend computes that backward without Triton."""
    if not cuda:
        return False, "no CUDA GPU: the torch forms"
    if fla is None or triton is None:
        return False, f"flash-linear-attention is not installed ({INSTALL_HINT}): the torch forms"
    if _version(triton) >= NO_BLOCK_POINTERS and _version(fla) < FLA_WITHOUT_BLOCK_POINTERS:
        return False, (f"the torch forms: Triton {triton} removed the block pointers fla {fla}'s kernels use; "
                       f"fla 0.5.2 or newer ({INSTALL_HINT}) runs on it")
    kernels = f"fla {fla}'s Triton kernels (Triton {triton})"
    if not scalar_gates or not hopper or _version(triton) < (3, 4, 0):
        return True, kernels
    if _version(triton) >= FIXED_TRITON:
        return True, f"{kernels}: Triton >= 3.7.1 compiles their scalar-gated backward correctly on Hopper"
    if tilelang:
        return True, f"{kernels}, the scalar-gated backward on fla's TileLang backend"
    return False, (f"the torch forms: Triton {triton} miscompiles fla's scalar-gated backward on Hopper GPUs; "
                   "a torch whose Triton is 3.7.1 or newer, or tilelang (pip install tilelang, with nvcc), "
                   "lets fla's kernels run")



def _version(text: str) -> tuple[int, ...]:
    """(3, 7, 1) from '3.7.1', '3.7.1+git...' or '3.7.1rc1'; (0, 0, 0) where it is not a version."""
    numbers = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(n or 0) for n in numbers.groups()) if numbers else (0, 0, 0)


@functools.cache
def route(scalar_gates: bool) -> tuple[bool, str]:
    """auto_route on this machine, said once (a note on stderr): which route backend=auto takes and why."""
    taken = auto_route(scalar_gates, **fla_ops.machine())
    gates = "scalar-gated " if scalar_gates else ""
    log.warning(f"note: backend=auto runs the {gates}mixers that have fla forms on {taken[1]}")
    return taken


def on_gpu(x: torch.Tensor) -> bool:
    """Whether x is on a CUDA GPU, where fla's kernels run."""
    return x.is_cuda


def runs_fla(backend: str, x: torch.Tensor, scalar_gates: bool = False) -> bool:
    """Whether x's sequences run on fla's kernels: backend=fla, or backend=auto on a CUDA GPU where fla's
    kernels (scalar-gated ones, if so) train correctly (`route`)."""
    if backend == "auto":
        return on_gpu(x) and route(scalar_gates)[0]
    return backend == "fla"


# ---------------------------------------------------------------------------------------------------------------
# backend=auto per mixer: (the backend it takes, why) on a machine with these facts


def _fla_or_torch(scalar_gates: bool, machine: dict) -> tuple[str, str]:
    uses_fla, why = auto_route(scalar_gates, **machine)
    return ("fla" if uses_fla else "torch"), why


def _linear(mixer, machine: dict) -> tuple[str, str]:
    return _fla_or_torch(mixer.scalar_gates, machine)


def _interdomain(mixer, machine: dict) -> tuple[str, str]:
    cfg = mixer.cfg
    if cfg.query == "linear" or cfg.form == "fft":
        return "torch", f"query={cfg.query}, form={cfg.form}: the torch form"
    return _fla_or_torch(False, machine)


def _boltzmann(mixer, machine: dict) -> tuple[str, str]:
    if not machine["cuda"]:
        return "torch", "no CUDA GPU: the torch forms"
    if mixer.fields_only():
        return "flex", "FlexAttention: fields only, softmax of log sigma(2h) over a sliding causal block mask"
    if mixer.cfg.inference != "banded":
        return "torch", f"inference={mixer.cfg.inference}: the torch form (Triton runs banded inference)"
    if not machine["triton"]:
        return "torch", "Triton is not installed: the torch form"
    return "triton", "banded inference: each chain's messages in one Triton kernel per pass"


# by the name a mixer class is registered under; a subclass registered under another name takes its base's
AUTO = {"linear": _linear, "gla": _linear, "gdn": _linear, "ccq-gla": _linear, "ccq-gdn": _linear,
        "interdomain": _interdomain, "boltzmann": _boltzmann}


def auto_backend(mixer, **machine) -> tuple[str, str]:
    """(the backend backend=auto takes for this mixer, why) on a machine with these facts (`ops.fla.machine`'s)."""
    for cls in type(mixer).__mro__:
        if (rule := AUTO.get(cls.__dict__.get("name"))) is not None:
            return rule(mixer, machine)
    return "torch", "its only form"
