"""attnlab results: the main tables of every reproduced suite, written into the results folder's README (or printed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import UserError

MARKERS = "<!-- results: start -->\n<!-- results: end -->\n"


def add_parser(sub) -> None:
    p = sub.add_parser("results", help="the main tables of every reproduced suite, written into <root>/README.md")
    p.add_argument("--root", default="results", help="the folder attnlab reproduce wrote to")
    p.add_argument("--readme", help="write them between the results markers of this file (default: <root>/README.md, "
                                    "made with the markers if missing)")
    p.add_argument("--print", action="store_true", dest="print_only", help="print them instead of writing a file")
    p.set_defaults(func=main, check=check)


def check(args) -> None:
    if args.readme is not None and args.print_only:
        raise UserError("--readme and --print exclude each other: --print writes no file; drop one")
    if args.readme is not None and not Path(args.readme).is_file():
        raise UserError(f"--readme {args.readme} is not a file; give the README whose results section to update")


def relink(text: str, folder: str | Path, readme: Path) -> str:
    """text with its links into folder ('](folder/...'), written relative to the working directory, made relative
    to the README's own folder, so that they work where the README is read."""
    prefix = Path(folder).as_posix()
    rel = Path(os.path.relpath(Path(folder), readme.parent)).as_posix()
    return text.replace(f"]({prefix}/", "](" if rel == "." else f"]({rel}/")


def results_summary(root: str | Path) -> str:
    """Markdown: every suite under root (a folder per suite with results.json), its verdicts and a link to its
    full report."""
    from ..lab.plan import plan_of
    from ..lab.report import summary_section
    from ..lab.store import Results
    from .report import suite_of

    lines = []
    for path in sorted(Path(root).glob("*/results.json")):
        results = Results.load(path)
        suite = suite_of(results, path)
        lines += summary_section(path.parent, suite, results, plan_of(suite, results))
    return "\n".join(lines)


def main(args) -> None:
    from ..lab.report import update_readme

    summary = results_summary(args.root)
    if not summary:
        raise UserError(f"{args.root} holds no suite results (<suite>/results.json); run attnlab reproduce first")
    if args.print_only:
        print(summary)
        return
    readme = Path(args.readme) if args.readme is not None else Path(args.root) / "README.md"
    doctor_run = Path(args.root) / "doctor" / "doctor.json"
    if args.readme is None and not readme.exists():
        doctor = "\n<!-- doctor: start -->\n<!-- doctor: end -->\n" if doctor_run.exists() else ""
        readme.write_text(f"# Results\n\n{MARKERS}{doctor}")
    update_readme(readme, relink(summary, args.root, readme))
    print(f"updated the results section of {readme}")
    if doctor_run.exists():  # the GPU section, from the committed doctor run
        from ..lab.doctor_readme import readme_section

        # the section names the doctor's folder as results/doctor/, the default root's
        section = readme_section(json.loads(doctor_run.read_text()))
        section = section.replace("](results/doctor/", f"]({Path(args.root).as_posix()}/doctor/")
        update_readme(readme, relink(section, Path(args.root) / "doctor", readme), section="doctor")
        print(f"updated the doctor section of {readme} from {doctor_run}")
