"""The suites that `attnlab reproduce` runs, by name, as mixers have their registry.

A suite's module registers itself at its end, `register_suite(sys.modules[__name__])`: the module gives its NAME,
its TIERS, `suite(tier) -> Suite` and, for a paper, PROVENANCE (where its mechanisms' equations come from, which
every tier's report states). Adding a paper is its module and one import line in `experiments/__init__.py`, or
`attnlab --import` for a module kept elsewhere; its metrics (`metrics.register_metric`) and its own commands
(`register_command`) register beside it.
"""

from __future__ import annotations

import dataclasses

from ..errors import UserError, unknown_name

SUITES: dict = {}  # name -> the registered module, the demo's included
PAPERS: dict = {}  # the papers' suites: what `attnlab reproduce all` runs
COMMANDS: list = []  # functions that add a paper's own subcommand to `attnlab` (argparse's subparsers)


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


def get_suite(name: str, tier: str = "default"):
    """The suite of a paper (or the demo) at one of its tiers."""
    if name not in SUITES:
        raise UserError(unknown_name("suite", name, list(SUITES)))
    module = SUITES[name]
    if tier not in module.TIERS:
        raise UserError(unknown_name(f"tier of {name}", tier, list(module.TIERS)))
    return dataclasses.replace(module.suite(tier), provenance=getattr(module, "PROVENANCE", {}))
