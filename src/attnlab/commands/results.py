"""attnlab results: the main tables of every reproduced suite, printed or written into the README."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("results", help="the main tables of every reproduced suite, for the README")
    p.add_argument("--root", default="results", help="the folder attnlab reproduce wrote to")
    p.add_argument("--readme", help="write them between the results markers of this file instead of printing")
    p.set_defaults(func=main, check=check)


def check(args) -> None:
    if args.readme is not None and not Path(args.readme).is_file():
        raise UserError(f"--readme {args.readme} is not a file; give the README whose results section to update")


def main(args) -> None:
    from ..experiments.report import results_summary, update_readme

    summary = results_summary(args.root)
    if not summary:
        raise UserError(f"{args.root} holds no suite results (<suite>/results.json); run attnlab reproduce first")
    if not args.readme:
        print(summary)
        return
    update_readme(args.readme, summary)
    print(f"updated the results section of {args.readme}")
    doctor_run = Path(args.root) / "doctor" / "doctor.json"
    if doctor_run.exists():  # the GPU section, from the committed doctor run
        from ..doctor import readme_section

        update_readme(args.readme, readme_section(json.loads(doctor_run.read_text())), section="doctor")
        print(f"updated the doctor section of {args.readme} from {doctor_run}")
