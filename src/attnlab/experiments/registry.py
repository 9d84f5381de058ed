"""The suites that `attnlab reproduce` runs, by name, as mixers have their registry.

A suite's module registers itself at its end, `register_suite(sys.modules[__name__])`: the module gives its NAME,
its TIERS, `suite(tier) -> Suite` and, for a paper, PROVENANCE (where its mechanisms' equations come from, which
every tier's report states). Adding a paper is its package and one import line in `experiments/__init__.py`,
or `attnlab --import` for a module kept elsewhere. Beside its suite a paper registers what else it brings: its
metrics (`metrics.register_metric`), its own commands (`register_command`), its bench cases
(`register_bench_case`), the mixer variants that the bench and the doctor time (`register_variant`), its GPU speed
goals (`register_speed_goal`) and its mixers' arms in the demo (`register_demo_arm`). The bench, the doctor, the
demo and the CLI iterate these tables and never name a mechanism.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..errors import UserError, unknown_name

SUITES: dict = {}  # name -> the registered module, the demo's included
PAPERS: dict = {}  # the papers' suites: what `attnlab reproduce all` runs
COMMANDS: list = []  # functions that add a paper's own subcommand to `attnlab` (argparse's subparsers)
BENCH_CASES: dict = {}  # name -> BenchCase: `attnlab bench --<name>`, and a part of the whole bench
VARIANTS: list = []  # (label, mixer, options, timed): mixers with options beside every registered mixer's defaults
SPEED_GOALS: list = []  # (label, length, relation, bar): the doctor's GPU goals, in times softmax's forward+backward
DEMO_ARMS: dict = {}  # mixer -> (the overrides that size it for the demo's CPU minutes, a note on them)


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


def register_suite(module, paper: bool = True):
    """Register a suite's module (paper=False: a suite that is not a paper's, the demo's)."""
    SUITES[module.NAME] = module
    if paper:
        PAPERS[module.NAME] = module
    return module


def register_command(add_parser):
    """Register a paper's own command (an inspection of what its mechanism learned): add_parser(subparsers) adds
    it, with set_defaults(func=..., check=...) as the built-in commands do. Parsing imports the papers'
    declarations only: a command imports what it runs when it runs."""
    COMMANDS.append(add_parser)
    return add_parser


def register_bench_case(case: BenchCase) -> BenchCase:
    BENCH_CASES[case.name] = case
    return case


def register_variant(label: str, mixer: str, options: dict, timed: bool = True) -> None:
    """A mixer with options that the bench and the doctor measure beside every registered mixer's defaults, e.g. a
    sliding-window form that runs at any length (timed=False: the doctor only compares its fused backends with
    its torch form)."""
    VARIANTS.append((label, mixer, options, timed))


def register_speed_goal(label: str, length: int, relation: str, bar: float) -> None:
    """A bar for the doctor's GPU run (bf16, batch 8, d_model 512): the forward+backward time of a mixer or variant
    (by its label) at this length, in times SDPA softmax's; relation "<=" or "<"."""
    SPEED_GOALS.append((label, length, relation, bar))


def register_demo_arm(mixer: str, *overrides: str, note: str = "") -> None:
    """A mixer in `attnlab demo`, with the overrides that fit it to a few CPU minutes (its options at a small
    size, a form that runs at the demo's 64-token contexts) and a note for the demo's report where they change
    what the mixer computes."""
    DEMO_ARMS[mixer] = (list(overrides), note)


def get_suite(name: str, tier: str = "default"):
    """The suite of a paper (or the demo) at one of its tiers."""
    if name not in SUITES:
        raise UserError(unknown_name("suite", name, list(SUITES)))
    module = SUITES[name]
    if tier not in module.TIERS:
        raise UserError(unknown_name(f"tier of {name}", tier, list(module.TIERS)))
    return dataclasses.replace(module.suite(tier), provenance=getattr(module, "PROVENANCE", {}),
                               ablation=getattr(module, "ABLATION", ""))
