"""A paper's manifest: its suite at each tier and everything else it brings, declared once in its package."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .spec import Suite


@dataclass(frozen=True)
class Paper:
    """A paper (or the demo), as `registry.register_paper` hands it to the code that reads each part: the suites
    to `attnlab reproduce` and `attnlab report`, the metrics to the jobs, the bench cases, variants and speed
    goals to the bench and the doctor, the demo arms to `attnlab demo`, the presets to `load_config`, the
    commands to the command line."""

    name: str
    tiers: tuple[str, ...]
    suite: Callable[[str], Suite]  # tier -> its suite
    # where each mechanism's equations come from, which every tier's report states
    provenance: dict[str, str] = field(default_factory=dict)
    ablation: str = ""  # what Mixer.ablated removes from the mechanism at evaluation, named in the report
    presets: dict = field(default_factory=dict)  # name -> function building its RunConfig: `attnlab train <name>`
    metrics: tuple = ()  # metrics.Metric: measurements attnlab lacks
    bench_cases: tuple = ()  # bench.registry.BenchCase: its own timings, with goals
    variants: tuple = ()  # bench.registry.Variant: mixers with options, timed beside every mixer's defaults
    speed_goals: tuple = ()  # bench.registry.SpeedGoal: bars for the doctor's GPU run
    demo_arms: tuple = ()  # demo.DemoArm: its mixers in `attnlab demo`, sized for a CPU
    # add_parser(subparsers): its own commands (inspections of what its mechanism learned), with
    # set_defaults(func=..., check=...) as the built-in commands have; a command imports what it runs when it runs
    commands: tuple = ()
