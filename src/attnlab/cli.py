"""The ``attnlab`` command: its subcommands, and the commands a paper brings (``Paper.commands``: couplings). The
subcommands: train | eval | generate | export | list | demo | reproduce | report | results | bench | doctor.

Each subcommand is a module of ``attnlab.commands``: its parser, its checks and its work. Arguments are checked
before any work starts, and against the loaded run (its vocabulary, its data) where a value depends on the run.
Every mistake is one line naming the argument and the fix, and exits with code 2.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from . import plugins
from .arguments import Parser
from .commands import COMMANDS
from .commands.papers import papers
from .errors import UserError


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnlab")
    except PackageNotFoundError:  # run from a source tree without installing it
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="attnlab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"attnlab {_version()}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks for user errors too")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE",
                        help="import a module or .py file that registers mixers first (repeatable; also "
                        f"{plugins.ENV_VAR}=mod1,mod2 and the entry points {plugins.ENTRY_POINTS})")
    sub = parser.add_subparsers(dest="command", required=True)
    papers()  # loaded before any command reads what they register: presets, suites, bench cases, commands
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    """The parsed command line. Dotted overrides may also follow options (train demo --quiet train.steps=5),
    which argparse alone leaves unparsed."""
    args, extra = build_parser().parse_known_args(argv)
    stray = [a for a in extra if a.startswith("-") or "=" not in a or not hasattr(args, "overrides")]
    if "--import" in stray:
        raise UserError(f"--import goes before the command: attnlab --import MODULE_OR_FILE {args.command} ...")
    if stray:
        raise UserError(f"unrecognized arguments: {' '.join(stray)} (see attnlab {args.command} --help)")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def _one_line(message: str) -> str:
    return " ".join(part.strip() for part in message.splitlines())


def import_plugins(argv=None) -> None:
    """The installed plugins and those of --import, before the parser is built: a plugin's suites, bench cases and
    commands become choices and subcommands of their own."""
    argv = sys.argv[1:] if argv is None else argv
    command = next((i for i, arg in enumerate(argv) if not arg.startswith("-") and argv[i - 1:i] != ["--import"]),
                   len(argv))  # options after the command are the command's (parse_args refuses --import there)
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--import", dest="imports", action="append", default=[])
    plugins.import_installed()
    for spec in early.parse_known_args(argv[:command])[0].imports:
        plugins.import_plugin(spec, "--import")


def main(argv=None) -> int:
    debug = False
    try:
        import_plugins(argv)
        args = parse_args(argv)
        debug = args.debug
        if hasattr(args, "check"):
            args.check(args)
        args.func(args)
    # an OSError is a file or folder that cannot be read or written: the user's to fix, like a bad argument
    except (UserError, OSError) as err:
        if debug:
            traceback.print_exc()
        print(f"error: {_one_line(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
