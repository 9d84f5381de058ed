"""Errors that are the user's to fix. The CLI prints them as one line, without a traceback."""

import difflib


class UserError(Exception):
    """A mistake in a config, a flag, a path or an input: the message says what and how to fix it."""


class ConfigError(UserError, ValueError):
    """A config field has a bad name or value."""


def did_you_mean(name: str, known) -> str:
    """"; did you mean 'softmax'?" for the known name closest to a mistyped one, or "" when none is close."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def unknown_name(kind: str, name: str, known) -> str:
    """'unknown mixer 'sofmax'; did you mean 'softmax'? Known: ...' — the message for a bad name."""
    known = sorted(known)
    hint = did_you_mean(name, known) or "."
    return f"unknown {kind} '{name}'{hint} Known: {', '.join(known)}"
