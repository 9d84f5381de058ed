"""Paper suites: each paper's claims as named, seeded runs that train, measure and write a report.

One package per paper (and a module for the demo), each with its NAME, its TIERS, suite(tier) -> Suite and, for a
paper, the PROVENANCE of its mechanisms' equations, which every tier's report states; each registers itself and
what else it brings (`registry`). Importing this package imports nothing heavy: the suites are declarations."""

from __future__ import annotations

from .registry import (
    BENCH_CASES,
    COMMANDS,
    DEMO_ARMS,
    PAPERS,
    SPEED_GOALS,
    SUITES,
    VARIANTS,
    BenchCase,
    get_suite,
    register_bench_case,
    register_command,
    register_demo_arm,
    register_speed_goal,
    register_suite,
    register_variant,
)

# the built-in suites, in the order `attnlab reproduce all` runs them (each registers itself on import)
from . import coupled_qk  # isort: skip
from . import ccq  # isort: skip
from . import boltzmann  # isort: skip
from . import interdomain  # isort: skip
from . import demo_suite  # isort: skip

__all__ = ["BENCH_CASES", "COMMANDS", "DEMO_ARMS", "PAPERS", "SPEED_GOALS", "SUITES", "VARIANTS", "BenchCase",
           "get_suite", "register_bench_case", "register_command", "register_demo_arm", "register_speed_goal",
           "register_suite", "register_variant", "boltzmann", "ccq", "coupled_qk", "demo_suite", "interdomain"]
