"""The papers: each paper's claims as named, seeded runs that the lab trains, measures and reports.

One package per paper, each declaring its `Paper` manifest (its tiers, `suite(tier) -> Suite`, the provenance of
its mechanisms' equations, which every tier's report states, and what else it brings) and registering it with
the lab (`attnlab.lab.registry`); the demo's suite beside them. A paper kept outside attnlab registers the same
way, through `attnlab.papers` (`Paper`, `register_paper`) and the entry-point group of that name. Importing this
package imports nothing heavy: the suites are declarations."""

from __future__ import annotations

from ..lab import demo
from ..lab.paper import Paper
from ..lab.registry import PAPERS, SUITES, get_suite, register_paper, register_suite
from . import presets  # the ones every suite's arms build on, registered on import

# the built-in papers, in the order `attnlab reproduce all` runs them (each registers itself on import)
from . import coupled_qk  # isort: skip
from . import ccq  # isort: skip
from . import boltzmann  # isort: skip
from . import interdomain  # isort: skip
from . import yardsticks  # isort: skip

register_suite(demo.DEMO)

__all__ = ["PAPERS", "SUITES", "Paper", "boltzmann", "ccq", "coupled_qk", "demo", "get_suite", "interdomain",
           "presets", "register_paper", "register_suite", "yardsticks"]
