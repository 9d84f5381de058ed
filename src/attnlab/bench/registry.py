"""What the papers bring to the timing code: bench cases, timed variants and GPU speed goals. Each paper's package
registers its own bench cases, the mixer variants that the bench and the doctor time beside every registered mixer,
and the GPU speed goals that the doctor holds them to. The tables are plain data, so that registering a paper
imports nothing heavy (the doctor itself imports torch, which `attnlab --help` must not); the bench and the doctor
read them and never name a mechanism."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class BenchCase:
    """A paper's own timing: `run(log=print, **settings) -> results` (JSON: strings as keys) measures it;
    `goals(results) -> [(what, value, relation, bar)]` are the bars it is held to (relation ">=", "<=" or ">");
    `settings[preset]` sizes it within the whole bench's presets (`default`, `quick`): a preset it lacks leaves it
    out of that bench, and `attnlab bench --<name>` runs it alone at run's own defaults."""

    name: str
    help: str
    run: Callable
    settings: dict = dataclasses.field(default_factory=dict)
    goals: Callable = lambda results: []


@dataclasses.dataclass(frozen=True)
class Variant:
    """A mixer with options, measured beside every registered mixer's defaults, e.g. a sliding-window form that
    runs at any length (timed=False: the doctor only compares its fused backends with its torch form)."""

    label: str
    mixer: str
    options: dict
    timed: bool = True


@dataclasses.dataclass(frozen=True)
class SpeedGoal:
    """A bar for the doctor's GPU run (bf16, batch 8, d_model 512): the forward+backward time of a mixer or variant
    (by its label) at this length, in times SDPA softmax's; relation "<=" or "<"."""

    label: str
    length: int
    relation: str
    bar: float


BENCH_CASES: dict[str, BenchCase] = {}  # name -> case: `attnlab bench --<name>`, and a part of the whole bench
VARIANTS: list[Variant] = []
SPEED_GOALS: list[SpeedGoal] = []


def register_bench_case(case: BenchCase) -> BenchCase:
    BENCH_CASES[case.name] = case
    return case


def register_variant(variant: Variant) -> Variant:
    VARIANTS.append(variant)
    return variant


def register_speed_goal(goal: SpeedGoal) -> SpeedGoal:
    SPEED_GOALS.append(goal)
    return goal
