"""Paper suites: each paper's claims as named, seeded runs that train, measure and write a report.

One module per paper (and the demo), each with its NAME, its TIERS, suite(tier) -> Suite and, for a paper, the
PROVENANCE of its mechanisms' equations, which every tier's report states; each registers itself
(`registry.register_suite`). Importing this package imports nothing heavy: the suites are declarations."""

from __future__ import annotations

from .registry import COMMANDS, PAPERS, SUITES, get_suite, register_command, register_suite

# the built-in suites, in the order `attnlab reproduce all` runs them (each registers itself on import)
from . import coupled_qk  # isort: skip
from . import ccq  # isort: skip
from . import boltzmann  # isort: skip
from . import interdomain  # isort: skip
from . import demo  # isort: skip

__all__ = ["COMMANDS", "PAPERS", "SUITES", "get_suite", "register_command", "register_suite", "boltzmann", "ccq",
           "coupled_qk", "demo", "interdomain"]
