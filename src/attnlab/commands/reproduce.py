"""attnlab reproduce: a paper's suite at one tier over seeds, with its report."""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

from ..arguments import check_folder, positive_float, positive_int, seed_count
from ..errors import UserError, unknown_name
from .papers import papers


def add_parser(sub) -> None:
    p = sub.add_parser("reproduce", help="a paper's claims in miniature over seeds, with a report")
    # checked when the command runs, after --import has registered any other suite
    p.add_argument("suite", help=f"the paper's suite ({', '.join(papers())}, or one that --import registers), or "
                   "all of them")
    p.add_argument("--tier", default="default", help="default (about 45 minutes on 2 CPU cores each), converged "
                   "(early stopping, up to a step cap that a run may reach first) or paper (the paper's protocol or "
                   "scale); reports of other tiers go to <out>/<suite>-<tier>/")
    p.add_argument("--seeds", type=seed_count, help="seeds per run, 1 to 1000 (default: the tier's own)")
    p.add_argument("--only", nargs="+", metavar="EXPERIMENT", help="run only these experiments (shell patterns, "
                   "e.g. 'mqar-*'); the report still lists them all")
    p.add_argument("--arms", nargs="+", metavar="ARM", help="train only these arms of them (shell patterns, e.g. "
                   "'h+*'), so that two processes can share a suite's runs")
    p.add_argument("--remeasure", nargs="+", metavar="RUN", help="measure these runs again whatever their records "
                   "hold (shell patterns over experiment/arm/seed, e.g. 'lm-T12/softmax/[0-2]'): from their models "
                   "where their folders hold them, else trained again")
    p.add_argument("--estimate", action="store_true", help="print the tier's training FLOPs as GPU-hours and stop")
    p.add_argument("--quick", action="store_true", help="the smoke version: a few steps per run")
    p.add_argument("--scale", type=positive_float, default=1.0, help="multiply every run's training steps")
    p.add_argument("--out", default="results", help="reports go to <out>/<suite>/")
    p.add_argument("--dry-run", action="store_true", help="print the plan (what trains, what is reused, what waits, "
                   "each job's estimated time) and stop")
    p.add_argument("--predict-on", metavar="DOCTOR_JSON", help="with --dry-run: predict each job's time on the GPU "
                   "whose `attnlab doctor` report this is (e.g. results/doctor/doctor.json), and with --jobs, from "
                   "start to end")
    p.add_argument("--jobs", type=positive_int, help="run this many jobs at once, each in its own process: on GPUs "
                   "each holds one GPU (or a share: --runs-per-gpu), on a CPU its share of the cores")
    p.add_argument("--runs-per-gpu", type=positive_int, help="pack this many small runs on each GPU")
    p.add_argument("--executor", choices=("local", "ray"), default="local", help="local: this machine (default); "
                   "ray: each job a Ray task on the cluster RAY_ADDRESS names, or a local one (extra [ray])")
    p.add_argument("--runs-dir", help="where models and checkpoints go (default <out>/<suite>/runs; on a cluster, "
                   "storage every node reaches)")
    p.set_defaults(func=main, check=check)


def check(args) -> None:
    """Every option that decides where jobs run, checked before anything trains."""
    check_folder(args.out, "--out")
    if args.predict_on and not args.dry_run:
        raise UserError("--predict-on predicts a plan's times without training: give it with --dry-run")
    if args.runs_dir is not None:
        check_writable(args.runs_dir, "--runs-dir")
    # a dry run is refused what its run would be, but where it predicts the plan on another machine's GPU
    if args.executor == "local" and args.runs_per_gpu and not args.predict_on:
        import torch

        if torch.cuda.device_count() == 0:
            raise UserError("--runs-per-gpu packs runs on GPUs, and this machine has none; leave it out (--jobs N "
                            "shares the CPU's cores)")
    if args.executor == "ray":
        from ..lab.executors import require_ray

        require_ray()


def check_writable(path: str, option: str) -> None:
    """A folder that can be created and written (or one line saying why not)."""
    from ..paths import user_path

    folder = user_path(path)
    check_folder(path, option)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".attnlab-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UserError(f"{option} {path} cannot be written ({err.strerror or err}); give a folder you can write "
                        "to") from None


def main(args) -> None:
    from ..lab.driver import dry_run
    from ..papers import get_suite

    known = papers()
    if args.suite not in (*known, "all"):
        raise UserError(unknown_name("suite", args.suite, [*known, "all"]))
    names = [n for n, paper in known.items() if args.tier in paper.tiers] if args.suite == "all" else [args.suite]
    if not names:
        raise UserError(f"no suite has a tier '{args.tier}'; see attnlab reproduce --help")
    suites = {name: get_suite(name, args.tier) for name in names}  # every name and tier checked before any run
    if args.only and not any(_has_experiment(s, args.only) for s in suites.values()):
        raise UserError(f"--only {' '.join(args.only)} matches no experiment of {', '.join(names)}")
    if args.arms and not any(_has_arm(s, args.arms) for s in suites.values()):
        raise UserError(f"--arms {' '.join(args.arms)} matches no arm of {', '.join(names)}")
    runner = None if args.dry_run or args.estimate else executor(args)  # a cluster out of reach: said before any run
    device = None
    if args.predict_on:
        from ..lab.device_times import DeviceTimes

        device = DeviceTimes.load(args.predict_on)
    for name, suite in suites.items():
        if suite.gpu or args.estimate:
            from ..lab.estimate import describe_estimate

            print(f"{name} ({args.tier}): {describe_estimate(suite, seeds=args.seeds)}")
        if args.estimate:
            continue
        if args.only and not _has_experiment(suite, args.only):
            continue  # (all) this suite has none of the experiments asked for
        if args.arms and not _has_arm(suite, args.arms):
            continue  # (all) nor any of the arms
        # smoke and rescaled runs get folders of their own: they never mix with, or overwrite, real results
        variant = "-quick" if args.quick else (f"-scale{args.scale:g}" if args.scale != 1 else "")
        out = Path(args.out) / f"{name}{'' if args.tier == 'default' else '-' + args.tier}{variant}"
        options = dict(seeds=args.seeds, quick=args.quick, scale=args.scale, only=args.only or (), arms=args.arms or (),
                       runs_dir=args.runs_dir and Path(args.runs_dir) / out.name, again=tuple(args.remeasure or ()))
        if args.dry_run:
            from ..lab.carried import recorded
            from ..lab.costs import describe_plan

            print(describe_plan(suite, dry_run(suite, out, **options), device, args.jobs, recorded(out)))
            continue
        _run_and_report(suite, out, runner, options, known[name])


def _run_and_report(suite, out: Path, runner, options: dict, paper) -> None:
    """The suite run into out, then its report; the folder records where its paper came from, stopped or not."""
    from ..lab.driver import run_suite
    from ..lab.plan import plan_of
    from ..lab.report import write_report
    from ..lab.store import record_source

    try:
        results = run_suite(suite, out, executor=runner, **options)
    finally:  # a stopped suite's folder names its paper too: its report is rebuilt without --import
        record_source(out / "results.json", paper_source(paper))
    print(f"report: {write_report(suite, results, plan_of(suite, results), out)}")


def paper_source(paper) -> str | None:
    """What imports a paper kept outside attnlab again (the module of its suite function); None: attnlab's own."""
    from .. import plugins

    module = getattr(paper.suite, "__module__", None)  # a partial or a callable object has none
    return plugins.module_source(module) if module else None


def executor(args):
    """Where the jobs run: this process (the default), --jobs worker processes, or Ray tasks."""
    from .. import plugins
    from ..lab import executors

    if args.executor == "ray":
        return executors.connect_ray(args.jobs, args.runs_per_gpu, plugins.IMPORTED)
    if args.jobs is None and args.runs_per_gpu is None:
        return None
    import torch

    gpus = torch.cuda.device_count()
    jobs = args.jobs or gpus * args.runs_per_gpu
    return executors.LocalWorkers(jobs, args.runs_per_gpu, gpus, plugins.IMPORTED)


def _has_experiment(suite, patterns: list[str]) -> bool:
    return any(fnmatch(e.name, p) for e in suite.experiments for p in patterns)


def _has_arm(suite, patterns: list[str]) -> bool:
    return any(fnmatch(a.label, p) for e in suite.experiments for a in e.arms for p in patterns)
