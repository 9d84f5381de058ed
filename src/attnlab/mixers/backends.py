"""Whether flash-linear-attention's kernels run a mixer's sequences under backend=auto, and why.

The facts it reads are the machine's (`ops.fla.machine`: a CUDA GPU, a Hopper one, the fla and Triton versions
installed, whether fla's TileLang backend can run). Each mixer's `route` asks it, where it has fla forms.
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
    Triton 3.4.0 to 3.7.0 miscompiles the backward of fla's scalar-gated kernels (one gate per head) on
    Hopper, and fla 0.6.0 refuses it there; Triton 3.7.1 fixes it, and fla's
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


def fla_or_torch(backend: str, x: torch.Tensor, scalar_gates: bool = False, machine: dict | None = None
                 ) -> tuple[str, str]:
    """("fla" or "torch", why) for x's sequences under the `backend` option: as set, or under auto fla's kernels
    (scalar-gated ones, if so) where they train correctly (`auto_route`), on this machine for x on its GPU
    (`route`, said once) or on one with these facts (`ops.fla.machine`'s)."""
    if backend != "auto":
        return backend, f"backend={backend}"
    if machine is not None:
        uses_fla, why = auto_route(scalar_gates, **machine)
    elif on_gpu(x):
        uses_fla, why = route(scalar_gates)
    else:
        uses_fla, why = False, f"on {x.device.type}, not a CUDA GPU: the torch forms"
    return ("fla" if uses_fla else "torch"), why
