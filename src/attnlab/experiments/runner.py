"""Running a suite: its plan's jobs handed to an executor, every record saved as it comes back.

`plan.plan` says what the suite needs as its results stand; `run_suite` (the driver) hands each job that can
start to an executor (`executors`: this process, local worker processes, or a Ray cluster), saves each record
to <out>/results.json as it comes back (written atomically, under a lock: the driver is its only writer), and
plans again. A stopped suite resumes where it stopped: finished records stand, and a run cut short continues
from its last checkpoint. `execute` is a job's own work, wherever it runs: train (or reuse) a model and measure it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from fnmatch import fnmatch
from pathlib import Path

import torch
import yaml

from .. import checkpoint
from ..config import RunConfig
from ..errors import ConfigError, UserError
from ..inference import load_run
from ..starting_point import as_fitted
from ..train import train
from ..typed import from_dict
from .configs import Settings, fingerprint, notes_once
from .metrics import get_metric
from .plan import Job, Plan, measurement_of, plan, stands
from .spec import Experiment, Suite
from .store import Record, Results, RunKey, describe_setting


def measure(experiment: Experiment, run_dir: Path) -> dict:
    """A trained run's values by its experiment's metric (`metrics.METRICS`)."""
    return get_metric(experiment.metric).measure(experiment, run_dir)


def run_suite(suite: Suite, out_dir: str | Path, seeds: int | None = None, quick: bool = False, scale: float = 1.0,
              extra: list[str] = (), log=print, only: list[str] = (), arms: list[str] = (), executor=None,
              runs_dir: str | Path | None = None, again: tuple[str, ...] = ()) -> Results:
    """Train and measure every run of the suite (seeds: the suite's own count unless given; only: the
    experiments whose names match one of these shell patterns; arms: their arms whose labels match one), keeping
    the runs that an earlier attempt finished with the same config. executor: where jobs run (default: in this
    process, one after another); runs_dir: where models and checkpoints go (default <out>/runs); again: runs to
    measure again whatever their records hold (shell patterns over experiment/arm/seed), from their models where
    their folders hold them, else trained again."""
    from .executors import InProcess

    seeds = seeds or suite.seeds
    experiments = _selected(suite, only, arms)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = _open_results(out, suite, {"suite": suite.name, "tier": suite.tier, "quick": quick, "scale": scale},
                            extra, seeds=suite.seeds if only else seeds, partial=bool(only))
    settings = _settings(suite, out, seeds, quick, scale, extra, runs_dir)
    executor = executor or InProcess(log)
    results.meta.pop("workers", None)  # where this attempt's jobs run, where not in this process
    if executor.describe():
        results.meta["workers"] = executor.describe()
    warned: set[str] = set()

    def warn(line: str) -> None:  # a sibling's unreadable results, said once
        if line not in warned:
            warned.add(line)
            log(line)

    finished: set[RunKey] = set()  # this attempt's: each measured once, whatever its record lacks
    running: dict[RunKey, Job] = {}
    with notes_once():
        try:
            while True:  # the folders beside read again each time: a suite there may have trained a model since
                beside = _results_beside(out, warn)
                jobs = plan(suite, experiments, results, settings, _models(out, results, beside), frozenset(finished),
                            _records(beside), again)
                if jobs.decided:  # recorded at once: its seeds' spread, which it read, changes as they train again
                    results.save_shared_rates(out / "results.json", jobs.decided)
                for job in jobs.runnable():
                    if job.key in running or any(j.fingerprint == job.fingerprint for j in running.values()):
                        continue  # running, or its model is being trained: it waits for that
                    work = Work.of(job, out, [(out, results), *beside], settings.smoke)
                    if not executor.free(work):
                        break
                    log(f"[{suite.name}] {job.key}")
                    executor.submit(work)
                    running[job.key] = job
                if not running:
                    break
                key, record = executor.next_done()
                del running[key]
                finished.add(key)
                results.meta["finished"] = datetime.now().isoformat(timespec="minutes")
                results.save_record(out / "results.json", key, record)
        finally:
            executor.close()  # a job still running is stopped: it continues from its checkpoint next time
    _say_blocked(suite, jobs, log)
    return results


def dry_run(suite: Suite, out_dir: str | Path, seeds: int | None = None, quick: bool = False, scale: float = 1.0,
            extra: list[str] = (), only: list[str] = (), arms: list[str] = (), runs_dir=None,
            again: tuple[str, ...] = ()) -> Plan:
    """The plan as the folder's results stand, without training or writing anything."""
    seeds = seeds or suite.seeds
    out = Path(out_dir)
    path = out / "results.json"
    results = Results.load(path) if path.exists() else Results.empty()
    _same_setting(out, results, {"suite": suite.name, "tier": suite.tier, "quick": quick, "scale": scale})
    settings = _settings(suite, out, seeds, quick, scale, extra, runs_dir)
    beside = _results_beside(out, log=lambda *_: None)
    with notes_once():
        return plan(suite, _selected(suite, only, arms), results, settings, _models(out, results, beside), frozenset(),
                    _records(beside), again)


def _models(out: Path, results: Results, beside: list[tuple[Path, Results]]) -> frozenset:
    """The fingerprints of the trained models on disk: in this suite's folder and in the folders beside it."""
    return frozenset(r.fingerprint for folder, other in [(out, results), *beside] for _, r in other.items()
                     if r.fingerprint is not None and _holds(folder / r.folder, r.fingerprint))


def _records(beside: list[tuple[Path, Results]]) -> tuple:
    """The records of the folders beside this suite's (a job may copy one of its model, measured its way)."""
    return tuple(r for _, other in beside for _, r in other.items())


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
                            "threads": torch.get_num_threads(), "torch": torch.__version__}
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


@dataclass
class Work:
    """What a job's process needs: the job's config and experiment, where its suite's folder is, and the records
    of models of its config trained already (here or in a folder beside), with their folders."""

    key: RunKey
    cfg: RunConfig
    experiment: Experiment
    fingerprint: str
    out: Path
    earlier: list[tuple[Path, Record]]
    ranks: int = 1  # processes that train it together (Arm.ranks)
    again: bool = False  # measured again on request: no earlier record is copied

    @classmethod
    def of(cls, job: Job, out: Path, folders: list[tuple[Path, Results]], smoke: bool = False) -> Work:
        """The job's work (a smoke run's CPU-sized models train in one process, whatever their arm's ranks)."""
        earlier = [(folder / r.folder, r) for folder, results in folders for _, r in results.items()
                   if r.fingerprint == job.fingerprint]
        return cls(job.key, job.cfg, job.experiment, job.fingerprint, out, earlier, 1 if smoke else job.arm.ranks,
                   job.again)


def execute(work: Work, log=print) -> Record:
    """A job's record: the record of the same model measured the same way where one exists; else the model
    measured, from its folder where one holds it, else trained first (continued from its last checkpoint where
    an earlier attempt stopped part-way)."""
    start = time.perf_counter()
    cfg, experiment, out = work.cfg, work.experiment, work.out
    for run_dir, record in [] if work.again else work.earlier:
        if stands(record, work.key, experiment, cfg, work.fingerprint):  # the same model, measured alike
            log(f"    the same model and measurement as {record.run}")
            return record.replace(run=os.path.relpath(run_dir, out), seconds=0.0, trained=False)
    run_dir = next((d for d, _ in work.earlier if _holds(d, work.fingerprint)), None)
    trained, resumed, earlier_seconds = run_dir is None, None, 0.0
    if trained:
        run_dir = Path(cfg.out_dir) / cfg.name
        resumed = unfinished_step(run_dir, cfg, log)  # an earlier attempt stopped part-way: continue it
        if resumed is None:
            shutil.rmtree(run_dir, ignore_errors=True)  # anything else there is not this run's
        else:
            log(f"    continuing from the checkpoint at step {resumed}")
        if work.ranks > 1:
            params, earlier_seconds = train_on_ranks(cfg, work.ranks, run_dir, resumed)
        else:
            summary = train(cfg, resume=None if resumed is None else "auto", progress=False, log=lambda *_: None)
            params, earlier_seconds = summary["params"], summary["earlier_seconds"]
        (run_dir / FINGERPRINT).write_text(work.fingerprint)
    else:  # an arm of another experiment trained this very model: measure it again
        log(f"    the same model as {run_dir.name}")
        params = load_run(run_dir).model.num_params()
    record = {"params": params, **training_extent(run_dir), **measure(experiment, run_dir)}
    record |= {"seconds": time.perf_counter() - start + earlier_seconds, "trained": trained,
               "run": os.path.relpath(run_dir, out), "config": work.fingerprint,
               "measured": measurement_of(experiment)}
    if resumed is not None:  # seconds then include the training of earlier attempts up to that checkpoint
        record["resumed_from"] = resumed
    log("    " + ", ".join(f"{k} {v:.4g}" for k, v in record.items() if isinstance(v, float | int)))
    return Record.from_json(record)


def train_on_ranks(cfg: RunConfig, ranks: int, run_dir: Path, resumed: int | None) -> tuple[int, float]:
    """cfg trained by `ranks` processes under torchrun, as `attnlab train` runs there (NCCL across this machine's
    GPUs, gloo on its CPU), continued from its checkpoint where resumed; (its parameters, the training seconds of
    earlier attempts up to that checkpoint)."""
    earlier = 0.0
    if resumed is not None:
        state = checkpoint.load_state(checkpoint.latest_checkpoint(run_dir) / "train_state.pt")
        earlier = state.get("train_seconds", 0.0)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    config = run_dir.parent / f"{cfg.name}.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "-m",
               "attnlab.cli", "train", str(config), "--quiet", *(["--resume", "auto"] if resumed is not None else [])]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"{cfg.name}: training on {ranks} ranks failed (exit code {done.returncode}): {last}")
    return load_run(run_dir).model.num_params(), earlier


FINGERPRINT = "fingerprint"  # written into a run folder once its model is trained: the config it was trained with


def _holds(run_dir: Path, fingerprint: str) -> bool:
    """Whether the folder holds a finished model of this config (a folder may since have been trained again)."""
    path = run_dir / FINGERPRINT
    return path.is_file() and path.read_text() == fingerprint


def unfinished_step(run_dir: Path, cfg: RunConfig, log) -> int | None:
    """The step of the newest intact checkpoint in run_dir if it is of an unfinished run of cfg (stopped by an
    interrupt or a crash), else None."""
    ckpt = None if (run_dir / FINGERPRINT).exists() else checkpoint.latest_checkpoint(run_dir, warn=log)
    if ckpt is None:
        return None
    try:
        saved = from_dict(RunConfig, checkpoint.load_config(ckpt))
    except ConfigError:  # written by a version with other config fields: not this config
        return None
    if fingerprint(as_fitted(cfg, saved)) != fingerprint(saved):
        return None
    return json.loads((ckpt / checkpoint.MANIFEST).read_text())["step"]


def training_extent(run_dir: Path) -> dict:
    """Where training ended (steps), whether early stopping ended it, and the step and validation loss of the
    checkpoint that is measured: the best one that early stopping kept, else the last evaluated (None if the
    run never evaluated)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluations = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    best = run_dir / checkpoint.BEST
    kept = json.loads(best.read_text()) if best.is_file() else None
    last = evaluations[-1] if evaluations else (None, None)
    best_step, best_loss = (kept["step"], kept["val_loss"]) if kept else last
    return {"steps": max(r["step"] for r in records), "stopped_early": any("stopped" in r for r in records),
            "best_step": best_step, "best_val_loss": best_loss}


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
