"""The papers that `attnlab reproduce` runs, by name, as mixers have their registry.

A paper's package declares its `Paper` manifest and registers it at its end, `register_paper(PAPER)`: adding a
paper is its package and one import line in `papers/__init__.py`, or `attnlab --import` for a module kept
elsewhere. Registering hands each part of the manifest to the code that reads it, which owns its table and never
names a mechanism: the presets to `presets`, the metrics to `metrics`, the bench cases, variants and speed goals
to `bench.registry` (read by the bench and the doctor), the demo arms to `demo`; the command line reads the suites
and commands from `PAPERS`.
"""

from __future__ import annotations

import dataclasses

from ..bench.registry import register_bench_case, register_speed_goal, register_variant
from ..errors import UserError, unknown_name
from ..presets import register_preset
from .demo import register_demo_arm
from .metrics import register_metric
from .paper import Paper

SUITES: dict[str, Paper] = {}  # name -> paper, the demo's included
PAPERS: dict[str, Paper] = {}  # the papers: what `attnlab reproduce all` runs


def register_suite(paper: Paper) -> Paper:
    """A suite that `attnlab report` rebuilds and the tests run, but that is not a paper's (the demo's)."""
    SUITES[paper.name] = paper
    return paper


def register_paper(paper: Paper) -> Paper:
    register_suite(paper)
    PAPERS[paper.name] = paper
    for name, build in paper.presets.items():
        register_preset(name)(build)
    for metric in paper.metrics:
        register_metric(metric)
    for case in paper.bench_cases:
        register_bench_case(case)
    for variant in paper.variants:
        register_variant(variant)
    for goal in paper.speed_goals:
        register_speed_goal(goal)
    for arm in paper.demo_arms:
        register_demo_arm(arm)
    return paper


def get_suite(name: str, tier: str = "default"):
    """The suite of a paper (or the demo) at one of its tiers."""
    if name not in SUITES:
        raise UserError(unknown_name("suite", name, list(SUITES)))
    paper = SUITES[name]
    if tier not in paper.tiers:
        raise UserError(unknown_name(f"tier of {name}", tier, list(paper.tiers)))
    return dataclasses.replace(paper.suite(tier), provenance=paper.provenance, ablation=paper.ablation)
