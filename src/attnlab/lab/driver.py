"""Running a suite: its plan's jobs handed to an executor, every record saved as it comes back.

`plan.plan` says what the suite needs as its results stand; `run_suite` hands each job that can start to an
executor (`executors`: this process, local worker processes, or a Ray cluster), saves each record to
<out>/results.json as it comes back (written atomically, under a lock: the driver is its only writer), and plans
again. A stopped suite resumes where it stopped: finished records stand, and a run cut short continues from its
last checkpoint. What a job itself does is `job.execute`.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from fnmatch import fnmatch
from pathlib import Path

import torch

from ..errors import UserError
from .configs import Settings, notes_once
from .executors import InProcess
from .job import Work, holds_model
from .metrics import get_metric
from .plan import Job, Plan, plan
from .spec import Experiment, Suite
from .store import Results, RunKey, describe_setting


def run_suite(suite: Suite, out_dir: str | Path, seeds: int | None = None, quick: bool = False, scale: float = 1.0,
              extra: list[str] = (), log=print, only: list[str] = (), arms: list[str] = (), executor=None,
              runs_dir: str | Path | None = None, again: tuple[str, ...] = ()) -> Results:
    """Train and measure every run of the suite (seeds: the suite's own count unless given; only: the
    experiments whose names match one of these shell patterns; arms: their arms whose labels match one), keeping
    the runs that an earlier attempt finished with the same config. executor: where jobs run (default: in this
    process, one after another); runs_dir: where models and checkpoints go (default <out>/runs); again: runs to
    measure again whatever their records hold (shell patterns over experiment/arm/seed), from their models where
    their folders hold them, else trained again."""
    seeds = seeds or suite.seeds
    experiments = _selected(suite, only, arms)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = _open_results(out, suite, _setting(suite, quick, scale), extra, seeds=suite.seeds if only else seeds,
                            partial=bool(only))
    attempt = _Attempt(suite, experiments, out, results, _settings(suite, out, seeds, quick, scale, extra, runs_dir),
                       executor or InProcess(log), log, again)
    with notes_once():
        try:
            while True:  # the folders beside read again each time: a suite there may have trained a model since
                beside = _results_beside(out, attempt.warn)
                jobs = attempt.planned(beside)
                attempt.start(jobs, beside)
                if not attempt.running:
                    break
                attempt.save_next()
        finally:
            attempt.executor.close()  # a job still running is stopped: it continues from its checkpoint next time
    _say_blocked(suite, jobs, log)
    return results


@dataclass
class _Attempt:
    """One attempt at a suite: what it runs and where, its results, and the jobs it has running and finished."""

    suite: Suite
    experiments: list[Experiment]
    out: Path
    results: Results
    settings: Settings
    executor: object  # InProcess, executors.LocalWorkers or executors.RayWorkers
    log: Callable[[str], None]
    again: tuple[str, ...]
    finished: set[RunKey] = field(default_factory=set)  # each measured once, whatever its record lacks
    running: dict[RunKey, Job] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)

    def __post_init__(self):
        self.results.meta.pop("workers", None)  # where this attempt's jobs run, where not in this process
        if self.executor.describe():
            self.results.meta["workers"] = self.executor.describe()

    def warn(self, line: str) -> None:
        """A line said once: a sibling's unreadable results are read again at every plan."""
        if line not in self.warned:
            self.warned.add(line)
            self.log(line)

    def planned(self, beside: list[tuple[Path, Results]]) -> Plan:
        """The jobs as the results here and beside stand, a shared learning rate decided on the way saved."""
        suite, results, out = self.suite, self.results, self.out
        jobs = plan(suite, self.experiments, results, self.settings, _models(out, results, beside),
                    frozenset(self.finished), _records(beside), self.again)
        if jobs.decided:  # recorded at once: its seeds' spread, which it read, changes as they train again
            results.save_shared_rates(out / "results.json", jobs.decided)
        return jobs

    def start(self, jobs: Plan, beside: list[tuple[Path, Results]]) -> None:
        """Each job that can start handed to the executor, while it has room."""
        for job in jobs.runnable():
            if job.key in self.running or any(j.fingerprint == job.fingerprint for j in self.running.values()):
                continue  # running, or its model is being trained: it waits for that
            work = Work.of(job, self.out, [(self.out, self.results), *beside], self.settings.smoke)
            if not self.executor.free(work):
                break
            self.log(f"[{self.suite.name}] {job.key}")
            self.executor.submit(work)
            self.running[job.key] = job

    def save_next(self) -> None:
        """The next job to finish, its record saved to results.json."""
        key, record = self.executor.next_done()
        del self.running[key]
        self.finished.add(key)
        self.results.meta["finished"] = datetime.now().isoformat(timespec="minutes")
        self.results.save_record(self.out / "results.json", key, record)


def dry_run(suite: Suite, out_dir: str | Path, seeds: int | None = None, quick: bool = False, scale: float = 1.0,
            extra: list[str] = (), only: list[str] = (), arms: list[str] = (), runs_dir=None,
            again: tuple[str, ...] = ()) -> Plan:
    """The plan as the folder's results stand, without training or writing anything."""
    seeds = seeds or suite.seeds
    out = Path(out_dir)
    path = out / "results.json"
    results = Results.load(path) if path.exists() else Results.empty()
    _same_setting(out, results, _setting(suite, quick, scale))
    settings = _settings(suite, out, seeds, quick, scale, extra, runs_dir)
    beside = _results_beside(out, log=lambda *_: None)
    with notes_once():
        return plan(suite, _selected(suite, only, arms), results, settings, _models(out, results, beside), frozenset(),
                    _records(beside), again)


def _models(out: Path, results: Results, beside: list[tuple[Path, Results]]) -> frozenset:
    """The fingerprints of the trained models on disk: in this suite's folder and in the folders beside it."""
    return frozenset(r.fingerprint for folder, other in [(out, results), *beside] for _, r in other.items()
                     if r.fingerprint is not None and holds_model(folder / r.folder, r.fingerprint))


def _records(beside: list[tuple[Path, Results]]) -> tuple:
    """The records of the folders beside this suite's (a job may copy one of its model, measured its way)."""
    return tuple(r for _, other in beside for _, r in other.items())


def _setting(suite: Suite, quick: bool, scale: float) -> dict:
    """What a folder's results are of: a smoke run's or a rescaled one's never mix with the suite's own."""
    return {"suite": suite.name, "tier": suite.tier, "quick": quick, "scale": scale}


def _settings(suite, out, seeds, quick, scale, extra, runs_dir) -> Settings:
    return Settings.of(suite, runs_dir or out / "runs", quick, scale, extra, seeds)


def _say_blocked(suite: Suite, jobs: Plan, log) -> None:
    """One line for each experiment whose baseline missed the paper's number: its other arms were not trained."""
    said = set()
    for job in jobs.jobs:
        if job.status == "blocked" and job.experiment.name not in said:
            said.add(job.experiment.name)
            log(f"[{suite.name}] {job.experiment.name}: {job.why}, so its other arms are not trained")


def _selected(suite: Suite, only: list[str], arms: list[str]) -> list[Experiment]:
    """The suite's experiments that match `only`, with their arms that match `arms` (shell patterns; empty:
    all); refused in one line where nothing matches or an experiment's metric is unknown."""
    experiments = [e for e in suite.experiments if not only or any(fnmatch(e.name, p) for p in only)]
    if not experiments:
        names = ", ".join(e.name for e in suite.experiments)
        raise UserError(f"--only {' '.join(only)} matches no experiment of {suite.name}; its experiments: {names}")
    experiments = [dataclasses.replace(e, arms=[a for a in e.arms if any(fnmatch(a.label, p) for p in arms)])
                   for e in experiments] if arms else experiments
    for experiment in experiments:  # an unknown metric is refused before anything trains
        get_metric(experiment.metric)
    if not any(e.arms for e in experiments):
        labels = ", ".join(dict.fromkeys(a.label for e in suite.experiments for a in e.arms))
        raise UserError(f"--arms {' '.join(arms)} matches no arm of {suite.name}'s experiments; its arms: {labels}")
    return experiments


def _open_results(out: Path, suite: Suite, setting: dict, extra: list[str], seeds: int, partial: bool) -> Results:
    """The folder's results.json (empty for a new folder) updated with this attempt's setting and machine; a
    folder of another setting (a smoke run, a rescaled one) is refused. A partial run (--only) leaves the seed
    count as it was, or starts a folder at the suite's own."""
    path = out / "results.json"
    results = Results.load(path) if path.exists() else Results.empty()
    _same_setting(out, results, setting)
    results.data |= setting
    results.data["extra"] = list(extra)  # the caller's overrides: what `superseded` needs to know the configs
    results.data["meta"] = {**results.meta, "cpu": _cpu_name(),  # the newest attempt's
                            "threads": torch.get_num_threads(), "torch": torch.__version__, "commit": _commit()}
    if partial:
        results.meta.setdefault("seeds", seeds)
    else:
        results.meta["seeds"] = seeds
    return results


def _same_setting(out: Path, results: Results, setting: dict) -> None:
    """A folder of another setting is refused: a smoke run must never mix with, or replace, results."""
    if len(results) and results.setting != setting:
        raise UserError(f"{out} holds results of {describe_setting(results.setting)}, not of "
                        f"{describe_setting(setting)}; give another --out, or move {out} away to start afresh")


def _commit() -> str | None:
    """The commit of the attnlab checkout that runs the suite (None outside a git checkout): what a report names as
    the code its runs came from."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return f"{os.cpu_count()} cores of {names[0] if names else platform.processor() or platform.machine()}"


def _results_beside(out: Path, log) -> list[tuple[Path, Results]]:
    """The results of the suites in folders beside this one: a model they trained with a config of this suite's
    is measured, not trained again. A results.json that cannot be read is skipped with a warning."""
    beside = []
    for path in sorted(out.parent.glob("*/results.json")):
        if path.parent != out:
            try:
                beside.append((path.parent, Results.load(path)))
            except UserError as err:
                log(f"    skipping {path}: {err}")
    return beside
