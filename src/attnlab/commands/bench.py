"""attnlab bench: every mixer and op form timed side by side, or one part of the bench alone."""

from __future__ import annotations

from ..arguments import check_folder, non_empty, positive_int
from ..errors import UserError
from ..plugins import unknown_mixer


def add_parser(sub) -> None:
    from ..bench.registry import BENCH_CASES  # the papers' cases, registered before the parser is built (cli)

    p = sub.add_parser("bench", help="every mixer and op form timed side by side, against peers and goals")
    view = p.add_mutually_exclusive_group()  # each picks what the run measures: one at a time
    view.add_argument("--quick", action="store_true",
                      help="the smoke preset (seconds) instead of the default (~10 min)")
    p.add_argument("--out", default="runs/bench", help="folder for bench.json and the PNG plots")
    p.add_argument("--lengths", type=positive_int, nargs="+", help="only the mixers alone, at these sequence lengths")
    p.add_argument("--batch", type=positive_int, help="--lengths: sequences per batch (default: 1)")
    p.add_argument("--repeats", type=positive_int, help="timed repeats per contender (default 3; --model 10)")
    view.add_argument("--model", type=non_empty,
                      help="only training steps of this preset with each of --mixers (and softmax)")
    p.add_argument("--mixers", nargs="+", help="mixers for --model, or 'all' (default: the preset's)")
    for name, case in BENCH_CASES.items():  # the papers' own cases
        view.add_argument(f"--{name}", dest=case_flag(name), action="store_true", help=case.help)
    view.add_argument("--packed", action="store_true",
                      help="only training steps on packed documents against plain rows of the same tokens, every mixer")
    view.add_argument("--cp", action="store_true",
                      help="only context parallelism's traffic: the bytes a rank sends per training step against "
                           "the sequence length (--lengths, default 256 1024 4096), on two gloo ranks")
    view.add_argument("--ops", action="store_true",
                      help="only the op forms vs their references and peers (T=4096, or the last of --lengths)")
    p.set_defaults(func=main, check=check)


def case_flag(case: str) -> str:
    """The attribute of the parsed arguments that `attnlab bench --<case>` sets (a registered bench case)."""
    return f"case_{case.replace('-', '_')}"


# the parts of the bench that each option sets up (the whole bench takes none of them)
OPTIONS = {"lengths": ("mixers", "ops", "packed", "cp"), "batch": ("mixers",),
           "repeats": ("mixers", "ops", "model", "packed"), "mixers": ("model",)}
PARTS = {"mixers": "the mixers alone (--lengths)", "ops": "--ops", "model": "--model", "packed": "--packed",
         "cp": "--cp", "whole": "the whole bench"}
EXAMPLES = {"mixers": "--lengths 1024 4096", "model": "--model demo"}
CP_SHORTEST = 32  # --cp: two shards of at least a sliding window's halo (15 tokens) and a short convolution's


def _part(args) -> str:
    """The part of the bench that the flags pick, in the order `main` tries them: a paper's case, the op forms,
    packed documents, context parallelism's traffic, a model's training step, the mixers alone, else the whole
    bench."""
    from ..bench.registry import BENCH_CASES

    for part in [*BENCH_CASES, "ops", "packed", "cp", "model"]:
        if getattr(args, case_flag(part) if part in BENCH_CASES else part, False):
            return part
    return "mixers" if args.lengths else "whole"


def _check_options(args) -> None:
    """An option that the picked part of the bench would ignore is refused: it says which part takes it."""
    if args.quick and args.lengths:
        raise UserError("--quick is the whole bench at toy sizes, --lengths times the mixers alone; give one of them")
    part = _part(args)
    for name, parts in OPTIONS.items():
        if getattr(args, name) is None or part in parts:
            continue
        takers = ", ".join(PARTS[p] for p in parts)
        fix = f"add e.g. {EXAMPLES[parts[0]]} or drop it" if part == "whole" else "drop it"
        raise UserError(f"--{name} applies only to {takers}, not to {PARTS.get(part, f'--{part}')}; {fix}")


def check(args) -> None:
    from ..config import load_config
    from ..mixers import list_mixers

    _check_options(args)
    if args.cp and any(n < CP_SHORTEST or n % 2 for n in args.lengths or ()):
        raise UserError(f"--cp --lengths {' '.join(map(str, args.lengths))}: each length must be even and at least "
                        f"{CP_SHORTEST} (two ranks take half each, and a rank reads up to 15 tokens of the one "
                        "before it)")
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


def main(args) -> None:
    from ..bench import context, forms, mixers, models, packed, whole
    from ..bench.registry import BENCH_CASES

    part = _part(args)
    if part in BENCH_CASES:
        BENCH_CASES[part].run()
    elif part == "packed":
        packed.bench_packed(seq_len=(args.lengths or [512])[-1], repeats=args.repeats or 3)
    elif part == "cp":
        context.bench_context(lengths=args.lengths or [256, 1024, 4096])
    elif part == "ops":
        forms.bench_ops(seq_len=(args.lengths or [4096])[-1], repeats=args.repeats or 3)
    elif part == "model":
        models.bench_training_step(args.model, args.mixers, repeats=args.repeats or 10)
    elif part == "mixers":
        mixers.bench_mixers(lengths=args.lengths, batch=args.batch or 1, repeats=args.repeats or 3)
    else:
        whole.run_bench("quick" if args.quick else "default", args.out)
