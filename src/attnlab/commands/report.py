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

    path = Path(args.folder) / "results.json"
    if not path.is_file():
        raise UserError(f"{path} does not exist; give a folder that attnlab reproduce wrote (results/<suite>)")
    results = Results.load(path)
    suite = suite_of(results, path)
    print(f"report: {write_report(suite, results, plan_of(suite, results), args.folder)}")


def suite_of(results, path: Path):
    """The suite whose results these are, at their tier. A paper kept outside attnlab is imported from where the
    results record it came from; one that nothing registers is one line saying how to import it."""
    from .. import plugins
    from ..papers import SUITES, get_suite

    name, source = results.suite, results.source
    if name not in SUITES and source is not None:
        if Path(source).is_absolute() and not Path(source).is_file():
            raise UserError(f"{path} is of suite '{name}', whose paper it records in {source}, which no longer "
                            f"exists; {plugins.HINT} to the module or file that registers it now")
        plugins.import_plugin(source, f"{path}: importing its paper from")
    if name not in SUITES:
        raise UserError(f"{path} is of suite '{name}', which no imported paper registers; {plugins.HINT} to the "
                        f"module or file that registers it (known suites: {', '.join(sorted(SUITES))})")
    return get_suite(name, results.tier)
