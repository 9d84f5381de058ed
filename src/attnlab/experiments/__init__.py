"""Paper suites: each paper's claims as named, seeded runs that train, measure and write a report.

One module per paper (and the demo), each with its NAME, its TIERS, suite(tier) -> Suite and, for a paper, the
PROVENANCE of its mechanisms' equations, which every tier's report states."""

from __future__ import annotations

import dataclasses

from ..errors import UserError, unknown_name
from . import boltzmann, ccq, coupled_qk, demo, interdomain

PAPERS = {module.NAME: module for module in (coupled_qk, ccq, boltzmann, interdomain)}
SUITES = {**PAPERS, demo.NAME: demo}


def get_suite(name: str, tier: str = "default"):
    """The suite of a paper (or the demo) at one of its tiers."""
    if name not in SUITES:
        raise UserError(unknown_name("suite", name, list(SUITES)))
    module = SUITES[name]
    if tier not in module.TIERS:
        raise UserError(unknown_name(f"tier of {name}", tier, list(module.TIERS)))
    return dataclasses.replace(module.suite(tier), provenance=getattr(module, "PROVENANCE", {}))
