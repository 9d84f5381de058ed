"""The command line's arguments, checked before any work starts: argparse types for values that stand alone
(counts, lengths, temperatures) and a ``check_<subcommand>`` for arguments that depend on each other or on
the file system. Every mistake is one line naming the argument and the fix (a UserError: exit code 2).
Checks against a loaded run (its vocabulary, its data) live with the subcommands that load it.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from .errors import UserError
from .paths import user_path
from .plugins import unknown_mixer

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


# ---------------------------------------------------------------------------------------------------
# checks of arguments that depend on each other or on the file system, run before any work


RUN = "a run folder (its best or newest checkpoint) or a step-XXXXXXXX checkpoint folder"  # a command's argument


def check_folder(path: str | None, option: str) -> None:
    """An output folder given as an option is not a file."""
    if path is not None and user_path(path).exists() and not user_path(path).is_dir():
        raise UserError(f"{option} {path} is a file; give a folder")


def check_train(args) -> None:
    if args.resume not in (None, "auto") and not user_path(args.resume).exists():
        raise UserError(f"--resume {args.resume} does not exist; give auto or a run or checkpoint folder")


# the eval options each measurement reads (None: loss and perplexity); one given to another would be ignored
EVAL_OPTIONS = {"split": (None,), "batches": (None,), "seq_len": (None,), "kind": ("niah",), "samples": ("niah",),
                "lengths": ("niah", "extrapolation"), "out": ("extrapolation",), "include_path": ("lm-eval",),
                "limit": ("lm-eval",)}


def _measurement(task: str | None) -> str:
    return {None: "the loss (no --task)", "lm-eval": "--lm-eval"}.get(task, f"--task {task}")


def check_eval(args) -> None:
    if args.lm_eval and args.task:
        raise UserError(f"--task {args.task} and --lm-eval are two measurements; give one of them")
    measurement = "lm-eval" if args.lm_eval else args.task
    for name, tasks in EVAL_OPTIONS.items():
        if getattr(args, name) is not None and measurement not in tasks:
            flag = "--" + name.replace("_", "-")
            raise UserError(f"{flag} applies to {' and '.join(map(_measurement, tasks))}, not to "
                            f"{_measurement(measurement)}; drop it")
    check_folder(args.out, "--out")
    if args.include_path is not None and not user_path(args.include_path).is_dir():
        raise UserError(f"--include-path {args.include_path} is not a folder; give the folder of your task YAML files")


def check_list(args) -> None:
    from .config import list_presets
    from .mixers import list_mixers

    if args.params:
        return
    if args.overrides:
        raise UserError(f"overrides ({' '.join(args.overrides)}) apply to --params, e.g. "
                        "attnlab list --params demo model.d_model=64")
    if args.name is None or args.name in list_mixers():
        return
    if args.name in list_presets() or user_path(args.name).is_file():
        raise UserError(f"{args.name} is a config, not a mixer; attnlab list --params {args.name} compares the "
                        "mixers on it")
    raise UserError(unknown_mixer(args.name, list_mixers()) + "; or give --params and a preset")


def check_demo(args) -> None:
    out = user_path(args.out)
    # the demo deletes its folder before it starts: only an empty folder or an earlier demo's may be replaced
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "demo").is_dir())):
        raise UserError(f"--out {args.out} exists and is not an earlier demo's folder (no demo/ inside), and the "
                        "demo replaces its folder; give a new folder")


def check_reproduce(args) -> None:
    check_folder(args.out, "--out")


def check_results(args) -> None:
    if args.readme is not None and not Path(args.readme).is_file():
        raise UserError(f"--readme {args.readme} is not a file; give the README whose results section to update")


# the parts of the bench that each option sets up (the whole bench takes none of them)
BENCH_OPTIONS = {"lengths": ("mixers", "ops", "packed"), "batch": ("mixers",),
                 "repeats": ("mixers", "ops", "model", "packed"),
                 "mixers": ("model",)}
BENCH_PARTS = {"mixers": "the mixers alone (--lengths)", "ops": "--ops", "model": "--model", "packed": "--packed",
               "whole": "the whole bench"}
BENCH_EXAMPLES = {"mixers": "--lengths 1024 4096", "model": "--model demo"}


def bench_flag(case: str) -> str:
    """The attribute of the parsed arguments that `attnlab bench --<case>` sets (a registered bench case)."""
    return f"case_{case.replace('-', '_')}"


def _bench_part(args) -> str:
    """The part of the bench that the flags pick, in the order cmd_bench tries them: a paper's case, the op forms,
    packed documents, a model's training step, the mixers alone, else the whole bench."""
    from .experiments import BENCH_CASES

    for part in [*BENCH_CASES, "ops", "packed", "model"]:
        if getattr(args, bench_flag(part) if part in BENCH_CASES else part, False):
            return part
    return "mixers" if args.lengths else "whole"


def _check_bench_options(args) -> None:
    """An option that the picked part of the bench would ignore is refused: it says which part takes it."""
    if args.quick and args.lengths:
        raise UserError("--quick is the whole bench at toy sizes, --lengths times the mixers alone; give one of them")
    part = _bench_part(args)
    for name, parts in BENCH_OPTIONS.items():
        if getattr(args, name) is None or part in parts:
            continue
        takers = ", ".join(BENCH_PARTS[p] for p in parts)
        fix = f"add e.g. {BENCH_EXAMPLES[parts[0]]} or drop it" if part == "whole" else "drop it"
        raise UserError(f"--{name} applies only to {takers}, not to {BENCH_PARTS.get(part, f'--{part}')}; {fix}")


def check_bench(args) -> None:
    from .config import load_config
    from .mixers import list_mixers

    _check_bench_options(args)
    for name in args.mixers or ():
        if name != "all" and name not in list_mixers():
            raise UserError(f"argument --mixers: {unknown_mixer(name, [*list_mixers(), 'all'])} (see attnlab bench "
                            "--help)")
    if args.model:
        try:
            load_config(args.model)
        except UserError as err:
            raise UserError(f"--model: {err}") from None
    check_folder(args.out, "--out")


def check_doctor(args) -> None:
    check_folder(args.out, "--out")
