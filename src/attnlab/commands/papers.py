"""The papers' own commands, and the one place that loads the papers for the commands that read them. Their own
commands (`Paper.commands`) inspect what their mechanisms learned; the others read what the papers register."""

from __future__ import annotations


def papers() -> dict:
    """The registered papers by name. Importing them registers what each brings with the code that reads it (the
    presets, the bench's cases and variants, the doctor's speed goals, the demo's arms): the command line calls
    this before it builds its parser. The papers are declarations: cheap to import, --help included. attnlab's
    own load from its package, an installed one's from its entry point (plugins.import_papers)."""
    from .. import plugins
    from ..papers import PAPERS

    plugins.import_papers()
    return PAPERS


def add_parser(sub) -> None:
    for paper in papers().values():
        for add in paper.commands:
            add(sub)
