"""What the commands share about their arguments: argparse types, the one-line parser, checks of folders and extras.
The types are for values that stand alone (counts, lengths, temperatures), and the extras are the optional packages.
Every mistake is one line naming the argument and the fix (a UserError: exit code 2). A command's checks of
arguments that depend on each other, or on a loaded run, live in its module (attnlab.commands).
"""

from __future__ import annotations

import argparse
import importlib.util
import math

from .errors import UserError, did_you_mean
from .paths import user_path

# ---------------------------------------------------------------------------------------------------
# argument types: each parses one value or says, in one line, what is wrong with it


def _number(text: str, kind: type):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not math.isfinite(value):  # nan would slip through every comparison below
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def int_between(low: int, high: int | None = None):
    """An argparse type: an integer from low to high (no upper bound when high is None)."""

    def parse(text: str) -> int:
        value = _number(text, int)
        if value < low or (high is not None and value > high):
            wanted = f"{low} or more" if high is None else f"from {low} to {high}"
            raise argparse.ArgumentTypeError(f"{value} is out of range; give {wanted}")
        return value

    return parse


positive_int = int_between(1)
non_negative_int = int_between(0)
seed_value = int_between(0, 2**64 - 1)  # what torch.Generator.manual_seed accepts
seed_count = int_between(1, 1000)  # each seed trains every arm of a suite once more


def positive_float(text: str) -> float:
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value:g} must be above 0")
    return value


def probability(text: str) -> float:
    value = _number(text, float)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value:g} is not a probability; give a number above 0 and at most 1")
    return value


MIN_TEMPERATURE = 1e-6  # below it sampling is greedy in effect, and the scaled logits overflow float32 early


def temperature(text: str) -> float:
    value = _number(text, float)
    if value != 0 and not value >= MIN_TEMPERATURE:
        raise argparse.ArgumentTypeError(f"{value:g} is not a temperature; give 0 (the most likely token) or "
                                         f"{MIN_TEMPERATURE:g} or more")
    return value


def context_size(text: str) -> int:
    value = non_negative_int(text)
    if value == 1:  # the view re-reads its newest half when full, so it must hold two tokens
        raise argparse.ArgumentTypeError("1 is too few; give 0 (unbounded) or 2 or more")
    return value


def non_empty(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("is empty; give at least one character")
    return text


class Parser(argparse.ArgumentParser):
    """argparse whose errors are UserErrors: one line and exit code 2, like every other mistake."""

    def error(self, message: str):
        raise UserError(f"{message} (see {self.prog} --help)")

    def _check_value(self, action, value):
        # argparse's own message lists the choices; a mistyped one (a command, --split) also gets the closest
        if action.choices is not None and value not in action.choices:
            hint = did_you_mean(str(value), map(str, action.choices))
            choices = ", ".join(map(repr, action.choices))
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{hint} (choose from {choices})")


# ---------------------------------------------------------------------------------------------------
# what several commands check before any work


RUN = "a run folder (its best or newest checkpoint) or a step-XXXXXXXX checkpoint folder"  # a command's argument


def check_folder(path: str | None, option: str) -> None:
    """An output folder given as an option is not a file."""
    if path is not None and user_path(path).exists() and not user_path(path).is_dir():
        raise UserError(f"{option} {path} is a file; give a folder")


def require_extra(package: str, what: str, extra: str) -> None:
    """One line naming the extra to install, instead of an ImportError from deep inside."""
    if importlib.util.find_spec(package) is None:
        raise UserError(f"{what} needs {package}: pip install 'attnlab[{extra}]'")
