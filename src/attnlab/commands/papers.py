"""The papers' own commands (``experiments.register_command``): inspections of what their mechanisms learned."""

from __future__ import annotations


def add_parser(sub) -> None:
    from ..experiments import COMMANDS  # declarations only: cheap to import

    for add in COMMANDS:
        add(sub)
