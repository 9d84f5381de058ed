"""attnlab demo: every mechanism on a language-modelling and a retrieval task, in minutes on a CPU."""

from __future__ import annotations

from ..errors import UserError
from ..paths import user_path


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="every mechanism on a language-modelling and a retrieval task (CPU, minutes)")
    p.add_argument("--out", default="runs/demo", help="folder for the runs and report, replaced if it holds an "
                   "earlier demo (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="a few steps per model: a smoke test")
    p.set_defaults(func=main, check=check)


def check(args) -> None:
    out = user_path(args.out)
    # the demo deletes its folder before it starts: only an empty folder or an earlier demo's may be replaced
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "demo").is_dir())):
        raise UserError(f"--out {args.out} exists and is not an earlier demo's folder (no demo/ inside), and the "
                        "demo replaces its folder; give a new folder")


def main(args) -> None:
    from ..experiments.demo import run_demo  # the papers' arms with it

    run_demo(out_dir=args.out, quick=args.quick)
