"""Presets: named RunConfigs, each built by a function (`attnlab train <name>`, `load_config(name, overrides)`).

A preset holds what it sets and leaves the rest to the config's defaults; `load_config` applies the overrides to
it, validates the result and caps its warmup. This module is only the table they register into, and imports
nothing of attnlab: the config reads it and the presets build configs, without either importing the other. The
presets live with the papers (`papers/presets.py` the shared ones, `papers/<paper>/presets.py`
each paper's) and register when the papers load (`plugins.import_papers`). Each imports the config when it is
called: registering presets imports no torch, which `attnlab --help` must not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import RunConfig

PRESETS: dict[str, Callable[[], RunConfig]] = {}


def register_preset(name: str):
    """A decorator: the function builds the preset called `name`."""

    def register(build: Callable[[], RunConfig]) -> Callable[[], RunConfig]:
        PRESETS[name] = build
        return build

    return register
