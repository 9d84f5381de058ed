"""attnlab report: a suite's report and figures rebuilt from its results.json alone."""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="rebuild a suite's report and figures from its results.json alone")
    p.add_argument("folder", help="the folder attnlab reproduce wrote, e.g. results/<suite>")
    p.set_defaults(func=main)


def main(args) -> None:
    from ..lab.plan import plan_of
    from ..lab.report import write_report
    from ..lab.store import Results
    from ..papers import get_suite

    path = Path(args.folder) / "results.json"
    if not path.is_file():
        raise UserError(f"{path} does not exist; give a folder that attnlab reproduce wrote (results/<suite>)")
    results = Results.load(path)
    suite = get_suite(results.suite, results.tier)
    print(f"report: {write_report(suite, results, plan_of(suite, results), args.folder)}")
