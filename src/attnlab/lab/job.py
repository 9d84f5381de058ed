"""What one job of a suite does, wherever it runs: train (or reuse) a model and measure it.

The driver (`driver.run_suite`) hands each job's `Work` to an executor, which calls `execute` in this process, in a
worker process or in a Ray task. A job's record does not depend on where it ran: a model trained already (in this
suite's folder or one beside it) is measured, not trained again, and a run an earlier attempt stopped part-way
continues from its last checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from .. import checkpoint
from ..config import RunConfig
from ..errors import ConfigError, UserError
from ..inference import load_run
from ..starting_point import as_fitted
from ..train import train
from ..typed import from_dict
from .configs import fingerprint
from .metrics import get_metric
from .plan import Job, measurement_of, stands
from .spec import Experiment
from .store import Record, Results, RunKey

FINGERPRINT = "fingerprint"  # written into a run folder once its model is trained: the config it was trained with


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
    copied = None if work.again else _same_measurement(work, log)
    if copied is not None:
        return copied
    run_dir = next((d for d, _ in work.earlier if holds_model(d, work.fingerprint)), None)
    trained, resumed, earlier_seconds = run_dir is None, None, 0.0
    if trained:
        run_dir = Path(work.cfg.out_dir) / work.cfg.name
        params, earlier_seconds, resumed = _train(work, run_dir, log)
    else:  # an arm of another experiment trained this very model: measure it again
        log(f"    the same model as {run_dir.name}")
        params = load_run(run_dir).model.num_params()
    record = {"params": params, **training_extent(run_dir), **measure(work.experiment, run_dir)}
    record |= {"seconds": time.perf_counter() - start + earlier_seconds, "trained": trained,
               "run": os.path.relpath(run_dir, work.out), "config": work.fingerprint,
               "measured": measurement_of(work.experiment)}
    if resumed is not None:  # seconds then include the training of earlier attempts up to that checkpoint
        record["resumed_from"] = resumed
    log("    " + ", ".join(f"{k} {v:.4g}" for k, v in record.items() if isinstance(v, float | int)))
    return Record.from_json(record)


def _same_measurement(work: Work, log) -> Record | None:
    """An earlier record of the same model measured alike, as this job's (its folder relative to this suite's),
    or None."""
    for run_dir, record in work.earlier:
        if stands(record, work.key, work.experiment, work.cfg, work.fingerprint):
            log(f"    the same model and measurement as {record.run}")
            return record.replace(run=os.path.relpath(run_dir, work.out), seconds=0.0, trained=False)
    return None


def _train(work: Work, run_dir: Path, log) -> tuple[int, float, int | None]:
    """The job's model trained into run_dir, continued where an earlier attempt stopped part-way; (its
    parameters, the training seconds of earlier attempts, the step it continued from or None)."""
    cfg = work.cfg
    resumed = unfinished_step(run_dir, cfg, log)
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
    return params, earlier_seconds, resumed


def measure(experiment: Experiment, run_dir: Path) -> dict:
    """A trained run's values by its experiment's metric (`metrics.METRICS`)."""
    return get_metric(experiment.metric).measure(experiment, run_dir)


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


def holds_model(run_dir: Path, fingerprint: str) -> bool:
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
