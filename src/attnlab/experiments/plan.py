"""A suite's plan: every job it needs, with its dependencies and what it will cost, before anything trains.

A job is one run of an experiment (a seed of an arm, or a point of its learning-rate sweep) at a config. Jobs
depend on each other in three ways:
- a seed trains at the rate its arm's sweep chooses, so it waits for the sweep's points (and a sweep grows past
  an edge of its grid that wins, so its later points wait for the earlier ones: `spec.sweep_rates`);
- calibration before comparison: an arm that a claim's Anchor holds to the paper's number trains all its seeds
  first, and if it then misses that number, nothing is compared with it (no other arm of the experiment trains);
- several experiments may use the same model (the same fingerprint): the first trains it, the others measure it.
`plan` reads the results as they stand and says, for each job, whether its record stands (done), what it must do
(train, or measure a model that exists), or what it waits for. The driver (`runner.run_suite`) asks again after
every finished job, so a plan grows as sweeps choose and calibrations pass, and a stopped suite plans afresh.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import torch

from ..config import RunConfig, apply_overrides, load_config, preset_values
from ..errors import UserError
from ..model import Decoder
from ..typed import from_dict
from .claims import anchors_of, failed_calibrations
from .metrics import get_metric
from .spec import (
    UNCHANGED,
    Arm,
    Changes,
    Experiment,
    Suite,
    arm_seeds,
    seed_count,
    shared_rate,
    sweep_rates,
    sweep_source,
)
from .stats import mean_std
from .store import Record, Results, RunKey


@dataclass(frozen=True)
class Settings:
    """How this attempt trains the suite: its folder for runs, whether it is a smoke run (--quick), --scale, the
    caller's overrides and the seed count."""

    runs_dir: Path
    smoke: bool = False  # a smoke run's few steps calibrate nothing and choose no rate beyond the sweep's grid
    quick: Changes = UNCHANGED  # the suite's changes for a smoke run
    scale: float = 1.0
    extra: tuple = ()
    seeds: int = 3

    @classmethod
    def of(cls, suite: Suite, runs_dir: Path, smoke: bool, scale: float, extra, seeds: int) -> Settings:
        return cls(Path(runs_dir), smoke, suite.quick if smoke else UNCHANGED, scale, tuple(extra), seeds)


@dataclass
class Job:
    """One run to train and measure (or only measure: `model` names the job that trains its model)."""

    key: RunKey
    stage: str  # calibration (an anchored baseline's seed), sweep (a point of a learning-rate sweep) or seed
    experiment: Experiment
    arm: Arm
    lr: float | None  # the rate it trains at (None: its preset's)
    cfg: RunConfig | None  # None while it waits for its rate
    fingerprint: str | None = None
    status: str = "waiting"  # done | train | measure | waiting | blocked
    why: str = ""  # what it waits for, why it is blocked, or what it replaces
    model: RunKey | None = None  # the job whose model it measures (a model shared with another experiment)
    supersedes: bool = False  # its key holds a record of another config, which it replaces
    again: bool = False  # measured again on request, whatever its record: from its model, else trained again

    @property
    def runnable(self) -> bool:
        return self.status in ("train", "measure")


@dataclass
class Plan:
    jobs: list[Job]
    settings: Settings
    decided: dict[str, dict] = dataclasses.field(default_factory=dict)  # shared-rate decisions made by this plan

    def runnable(self) -> list[Job]:
        """The jobs that can start now: measurements of models that exist first (cheap, and as soon as the model
        is there), then the rest in plan order."""
        ready = [job for job in self.jobs if job.runnable]
        return sorted(ready, key=lambda job: job.status != "measure")

    def count(self, status: str) -> int:
        return sum(job.status == status for job in self.jobs)


def plan(suite: Suite, experiments: list[Experiment], results: Results, settings: Settings,
         models: frozenset = frozenset(), attempted: frozenset = frozenset(), beside: tuple = (),
         again: tuple[str, ...] = ()) -> Plan:
    """Every job of the selected experiments as the results stand. models: the fingerprints of the trained models
    on disk (in this suite's folder and those beside it); beside: the records of the folders beside this suite's,
    which a job may copy where one is of its model measured its way; attempted: keys this attempt has already run,
    which count as done whatever their record lacks, so that a measure that records nothing cannot loop; again:
    shell patterns over run keys (experiment/arm/seed) whose records are measured again whatever they hold."""
    jobs: list[Job] = []
    rates: dict[tuple[str, str], float | None | str] = {}  # (sweeping experiment, arm) -> rate, or why not yet
    decided: dict[str, dict] = {}
    for experiment in experiments:
        anchored = {a.arm for a in anchors_of(suite.claims) if a.experiment == experiment.name}
        gated = bool(anchored) and not settings.smoke  # a smoke run's few steps calibrate nothing
        order = sorted(experiment.arms, key=lambda arm: arm.label not in anchored) if gated else experiment.arms
        held = _held(_calibration(suite, experiment, results, settings) if gated else True)
        for arm in order:  # every arm's sweep before any seed
            for job in _sweep_jobs(suite, experiment, arm, results, settings, rates):
                jobs.append(dataclasses.replace(job, **held) if held and arm.label not in anchored else job)
        _share_rate(suite, experiment, results, settings, rates, decided)
        for seed in range(min(settings.seeds, experiment.seeds or settings.seeds)):  # seed by seed: stays paired
            for arm in order:
                if seed >= seed_count(experiment, arm, settings.seeds):
                    continue
                stage = "calibration" if gated and arm.label in anchored else "seed"
                job = _job(RunKey(experiment.name, arm.label, seed=seed), stage, experiment, arm,
                           rates.get(_sweep_of(suite, experiment, arm)), settings)
                jobs.append(dataclasses.replace(job, **held) if held and stage == "seed" else job)
    for pattern in again:
        if not any(not job.key.sweep and fnmatch(str(job.key), pattern) for job in jobs):
            example = next((str(job.key) for job in jobs if not job.key.sweep), "lm/softmax/0")
            raise UserError(f"--remeasure {pattern} matches no run of the selected experiments; a run is named "
                            f"experiment/arm/seed, e.g. {example}")
    _settle(jobs, results, models, attempted, beside, again)
    return Plan(jobs, settings, decided)


def _held(calibrated: bool | str | None) -> dict:
    """What holds back the arms compared with a baseline: nothing once it is calibrated, the calibration while
    its seeds are not all measured, for good where it missed the paper's number."""
    if calibrated is True:
        return {}
    return {"status": "waiting", "why": "the calibration"} if calibrated is None else {"status": "blocked",
                                                                                      "why": calibrated}


@contextmanager
def notes_once():
    """While it lasts, each note the configs say (a warmup capped to a short run, say) is said once: planning makes
    every config many times."""
    said = set()

    def first_time(record: logging.LogRecord) -> bool:
        new = record.getMessage() not in said
        said.add(record.getMessage())
        return new

    logger = logging.getLogger("attnlab.config")
    logger.addFilter(first_time)
    try:
        yield
    finally:
        logger.removeFilter(first_time)


def _sweep_of(suite: Suite, experiment: Experiment, arm: Arm) -> tuple[str, str] | None:
    source = sweep_source(suite, experiment)
    return None if source is None else (source.name, arm.label)


def _sweep_jobs(suite, experiment, arm, results, settings, rates) -> list[Job]:
    """The points of the sweep that chooses the arm's rate, as far as they can be known (a point beyond the grid
    is known once the grid's points stand: spec.sweep_rates); records the rate chosen, or what it waits for."""
    which = _sweep_of(suite, experiment, arm)
    if which is None or which in rates:
        return []
    source = sweep_source(suite, experiment)
    swept = next(a for a in source.arms if a.label == arm.label)
    jobs = {}

    def loss(lr: float) -> float | None:  # the point's validation loss where its record stands
        if lr not in jobs:
            jobs[lr] = _job(RunKey(source.name, arm.label, lr=lr), "sweep", source, swept, lr, settings)
        record = results.get(jobs[lr].key)
        return sweep_loss(record) if _stands(record, jobs[lr]) else None

    rates_tried = sweep_rates(source.lrs, loss, extend=not settings.smoke)
    chosen = min(rates_tried, key=lambda lr: math.inf if loss(lr) is None else loss(lr))
    known = [loss(lr) for lr in jobs]
    rates[which] = chosen if None not in known else f"the sweep of {source.name}/{arm.label}"
    return list(jobs.values())


def _share_rate(suite, experiment, results, settings, rates, decided) -> None:
    """Where the experiment's sweep has decided that its arms share a rate, every arm's seeds train at it; a
    decision made here (not yet in the results) goes to `decided`, for the driver to record."""
    source = sweep_source(suite, experiment)
    decision = None if source is None else shared_decision(source, results, settings)
    if decision is None:
        return
    if results.shared_rates.get(source.name) != decision:  # made now, or made again for a sweep trained again
        decided[source.name] = decision
    if decision["lr"] is None:
        return
    for arm in experiment.arms:
        if isinstance(rates.get((source.name, arm.label)), float):
            rates[source.name, arm.label] = decision["lr"]


def shared_decision(source: Experiment, results: Results, settings: Settings) -> dict | None:
    """Whether the arms of a sweep share a rate (spec.shared_rate): as the results record it, else decided from
    every arm's sweep and its seeds at its own best rate (their spread); None until those are all measured. The
    driver records a decision once made, so that seeds trained again at the shared rate, whose spread differs,
    cannot undo it; a sweep trained again (its losses are not those the decision read) decides again. {"lr": the
    shared rate, or None where each arm keeps its own; "spreads": arm -> spread; "sweep": the losses read}"""
    return _decision(source, results, settings, _every_sweep(source, results, settings))


def _decision(source: Experiment, results: Results, settings: Settings, losses: dict) -> dict | None:
    """shared_decision, given every arm's sweep (_every_sweep)."""
    if any(None in by_lr.values() for by_lr in losses.values()):
        return None
    recorded = results.shared_rates.get(source.name)
    if recorded is not None and recorded["sweep"] == _as_read(losses):  # a sweep trained again decides again
        return recorded
    spreads = {}
    for arm in source.arms:
        own, values = min(losses[arm.label], key=losses[arm.label].get), []
        for seed in range(seed_count(source, arm, settings.seeds)):
            key = RunKey(source.name, arm.label, seed=seed)
            cfg, print_ = configured(source, arm, seed, own, settings)
            if not stands(results.get(key), key, source, cfg, print_):
                return None
            values.append(sweep_loss(results.get(key)))
        spreads[arm.label] = mean_std(values)[1] if len(values) > 1 else 0.0
    return {"lr": shared_rate(losses, spreads), "spreads": spreads, "sweep": _as_read(losses)}


def _every_sweep(source: Experiment, results: Results, settings: Settings) -> dict[str, dict[float, float | None]]:
    """Every arm's sweep as far as the results know it (swept_losses), by arm label."""
    return {a.label: swept_losses(results, source, a.label, extend=not settings.smoke) for a in source.arms}


def _as_read(losses: dict[str, dict[float, float]]) -> dict[str, dict[str, float]]:
    """The sweep's losses as a decision records what it read (rates as JSON keys)."""
    return {label: {f"{lr:g}": loss for lr, loss in by_lr.items()} for label, by_lr in losses.items()}


def arm_rates(source: Experiment, results: Results, settings: Settings) -> dict[str, float]:
    """The rate each arm of a sweep trains at once its sweep is complete: the shared one where the arms share a
    rate, else its own best."""
    losses = _every_sweep(source, results, settings)
    own = {label: min(by_lr, key=by_lr.get) for label, by_lr in losses.items() if None not in by_lr.values()}
    decision = _decision(source, results, settings, losses)
    if decision is None or decision["lr"] is None:
        return own
    return dict.fromkeys(own, decision["lr"])


def _calibration(suite, experiment, results, settings) -> bool | str | None:
    """True where the experiment's anchored baselines match the paper, else why not (the paper's number they
    miss); None while their seeds are not all measured."""
    anchors = [a for a in anchors_of(suite.claims) if a.experiment == experiment.name]
    current = results.without(superseded(suite, results, settings))  # an earlier protocol calibrates nothing here
    counts = arm_seeds(suite, settings.seeds)
    for anchor in anchors:
        if len(current.of(experiment.name, anchor.arm)) < counts(experiment.name, anchor.arm):
            return None
    failed = failed_calibrations(anchors, current, counts)
    if experiment.name not in failed:
        return True
    return f"the baseline is not the paper's ({failed[experiment.name]})"


def _job(key: RunKey, stage: str, experiment: Experiment, arm: Arm, rate, settings: Settings) -> Job:
    """A job at its rate: a sweep point's own, the rate its sweep chose, or (a str) what it waits for."""
    lr = key.lr if key.sweep else rate
    if isinstance(lr, str):
        return Job(key, stage, experiment, arm, None, None, why=lr)
    cfg, print_ = configured(experiment, arm, key.trained_seed, lr, settings)
    return Job(key, stage, experiment, arm, lr, cfg, print_, status="")


def _settle(jobs: list[Job], results: Results, models: frozenset, attempted: frozenset, beside: tuple = (),
            again: tuple[str, ...] = ()) -> None:
    """Each job with its config: done where its record stands (or this attempt ran it); where another job of this
    plan trains its model, measure once that job is done (until then it waits); else measure where a model of its
    config is on disk or a record of it measured alike can be copied, train where neither is. A job held back by
    its calibration keeps waiting (or blocked). A job asked for `again` is measured from its model where one is on
    disk, else trained again, whatever its record holds (its next attempt finds the model and only measures)."""
    trainer: dict[str, Job] = {}  # fingerprint -> the first job of the plan with that model
    records = [*(r for _, r in results.items()), *beside]
    for job in jobs:
        if job.cfg is None or job.status == "blocked":
            continue
        record = results.get(job.key)
        first = trainer.setdefault(job.fingerprint, job)
        job.again = not job.key.sweep and any(fnmatch(str(job.key), pattern) for pattern in again)
        if job.key in attempted or (_stands(record, job) and not job.again):
            job.status = "done"
            continue
        if job.status == "waiting":  # on its calibration
            continue
        job.supersedes = record is not None and record.fingerprint != job.fingerprint
        if job.again:
            job.status, job.why = ("measure" if job.fingerprint in models else "train"), "asked for again"
            continue
        if first is not job and first.status != "done":
            job.model, job.status, job.why = first.key, "waiting", f"the model of {first.key}"
        elif job.fingerprint in models or any(r.fingerprint == job.fingerprint and _stands(r, job) for r in records):
            job.model, job.status = (None if first is job else first.key), "measure"
        else:  # its model is nowhere on disk (a results folder without its runs): trained again
            job.status = "train"


def _stands(record: Record | None, job: Job) -> bool:
    return stands(record, job.key, job.experiment, job.cfg, job.fingerprint)


def stands(record: Record | None, key: RunKey, experiment: Experiment, cfg: RunConfig, fingerprint: str) -> bool:
    """Whether a record is of this model (fingerprint) measured as the experiment measures (a sweep's point, of
    which only the validation loss is read, needs no value without the component)."""
    if record is None:
        return False
    metric, measurement = get_metric(experiment.metric), measurement_of(experiment)
    needs_ablation = not key.sweep and metric.ablation and ablates(cfg)
    return record.stands(fingerprint, measurement, None if metric.revision else measurement, needs_ablation)


def measurement_of(experiment: Experiment) -> list:
    """What a record's measured values depend on besides the model (a metric's revision, where it has one:
    records measured before are measured again, from the model where its folder is still there)."""
    revision = get_metric(experiment.metric).revision
    return [experiment.metric, experiment.lengths, experiment.target_losses, *([revision] if revision else [])]


_ABLATES: dict[str, bool] = {}  # repr of a model config -> whether its model has a component to remove


def ablates(cfg: RunConfig) -> bool:
    """Whether the run's model has a mechanism's own component to remove at evaluation (Decoder.ablates), from a
    model built on the meta device: no memory and no weights, only the mixers."""
    key = repr(cfg.model)
    if key not in _ABLATES:
        with torch.device("meta"):
            _ABLATES[key] = Decoder(cfg.model.fitted(vocab_size=1)).ablates()
    return _ABLATES[key]


def run_config(experiment: Experiment, arm: Arm, seed: int, lr: float | None, settings: Settings) -> RunConfig:
    """The config of one run of the suite: the arm's preset and changes at this seed and learning rate (None:
    the preset's), the quick tier's changes and the caller's overrides, its steps multiplied by scale."""
    return configured(experiment, arm, seed, lr, settings)[0]


def configured(experiment: Experiment, arm: Arm, seed: int, lr: float | None, settings: Settings
               ) -> tuple[RunConfig, str]:
    """run_config and its fingerprint, made once for the same inputs: a plan is made again after every job."""
    return _configured(experiment.name, arm, seed, lr, settings, _stamp(arm.preset))


@functools.lru_cache(maxsize=4096)
def _configured(experiment: str, arm: Arm, seed: int, lr: float | None, settings: Settings, stamp: int
                ) -> tuple[RunConfig, str]:
    name = "-".join([experiment, arm.label, *([f"lr{lr:g}"] if lr else []), f"s{seed}"])
    own = [*arm.changes, *(learning_rate(arm, lr) if lr else ()), *settings.quick]
    overrides = [*own, *_read_by_run(arm.preset, own, list(settings.extra)), ("name", name.replace("+", "p")),
                 ("out_dir", str(settings.runs_dir)), ("train.seed", 1000 + seed), ("train.keep_last", 1)]
    cfg = load_config(arm.preset, overrides)
    if settings.scale != 1.0:
        steps = max(1, round(cfg.train.steps * settings.scale))
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=steps))
    return cfg, fingerprint(cfg)


def _stamp(preset: str) -> int:
    """When a config file given by path last changed (a file edited since is read again); 0 for a registered
    preset, whose code does not change while the process runs."""
    from ..paths import user_path

    path = user_path(preset)
    return path.stat().st_mtime_ns if path.is_file() else 0


def settings_of(suite: Suite, results: Results, runs_dir: Path = Path("runs")) -> Settings:
    """The settings a results file was made with (the folder of its runs aside)."""
    setting = results.setting
    return Settings.of(suite, runs_dir, setting["quick"], setting["scale"], results.extra,
                       results.meta.get("seeds", suite.seeds))


def _read_by_run(preset: str, own: list[str], extra: list[str]) -> list[str]:
    """The caller's overrides but those of data fields that this run's source does not read (which its config
    would refuse): one list of them shrinks a suite whose arms train on text and on tasks alike."""
    data = from_dict(RunConfig, apply_overrides(preset_values(preset), [*own, *extra])).data
    return [o for o in extra if not o.startswith("data.") or data.reads(o.partition("=")[0].removeprefix("data."))]


def learning_rate(arm: Arm, lr: float) -> Changes:
    """The changes that train the arm at peak rate lr, its schedule's floor scaled alike."""
    base = load_config(arm.preset, arm.changes).train
    return Changes.train(lr=lr, min_lr=lr * base.min_lr / base.lr)


def superseded(suite: Suite, results: Results, settings: Settings | None = None) -> set[RunKey]:
    """The keys of records trained with another config than the suite now gives their run (its presets or
    protocol changed since): `attnlab reproduce` trains them again, and until then they describe something
    else. An arm with a learning-rate sweep is checked once its sweep is measured."""
    settings = settings or settings_of(suite, results)
    old = set()
    for experiment in suite.experiments:
        source = sweep_source(suite, experiment)
        lrs = {} if source is None else arm_rates(source, results, settings)
        arms = {arm.label: arm for arm in experiment.arms if source is None or arm.label in lrs}
        for key, record in results.of(experiment.name).items():
            # a record written by hand or by a version before fingerprints has no config to compare
            if key.arm not in arms or record.fingerprint is None:
                continue
            if record.fingerprint != configured(experiment, arms[key.arm], key.seed, lrs.get(key.arm), settings)[1]:
                old.add(key)
    return old


def swept_losses(results: Results, experiment: Experiment, label: str, extend: bool | None = None
                 ) -> dict[float, float | None]:
    """The arm's sweep as far as the results know it: each of its rates (spec.sweep_rates) -> the validation loss
    its first seed reached, None where it has not run yet (extend: whether the grid grows past a winning edge;
    by default as the results' setting has it, not for a smoke run)."""
    def loss(lr: float) -> float | None:
        record = results.get(RunKey(experiment.name, label, lr=lr))
        return None if record is None else sweep_loss(record)

    extend = not results.setting["quick"] if extend is None else extend
    return {lr: loss(lr) for lr in sweep_rates(experiment.lrs, loss, extend)}


def sweep_loss(record: Record) -> float:
    """The validation loss a sweep compares rates by: over the whole validation split where the record measured
    it (val_ppl's val_loss; extrapolation's perplexity at the training length), else the training's own validation
    (a sample of the split, unless the run set train.eval_batches=0)."""
    if "val_tokens" in record and "val_loss" in record:
        return record["val_loss"]
    if "ppl_tokens" in record:  # every window of the split at each length: the shortest is the training length
        lengths = [int(key.removeprefix("ppl@")) for key in record if key.startswith("ppl@")]
        return math.log(record[f"ppl@{min(lengths)}"])
    loss = record.get("best_val_loss")
    return math.inf if loss is None else loss  # a run that never validated (it diverged) loses


def fingerprint(cfg: RunConfig) -> str:
    """What decides the trained weights: the config fields that differ from their defaults, except the
    run's name and folder, train.compile (how the same arithmetic runs) and train.log_to (where its numbers
    are also sent). A field added later at its default leaves earlier runs valid (like the code, a changed
    default is not seen: delete results.json to train everything again)."""
    settings = _changed(cfg.settings(), type(cfg)().settings())
    for where in ("name", "out_dir"):
        settings.pop(where, None)
    for how in ("compile", "log_to"):
        settings.get("train", {}).pop(how, None)
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def _changed(values: dict, defaults: dict) -> dict:
    """The entries of a nested dict that differ from the defaults."""
    changed = {}
    for key, value in values.items():
        default = defaults.get(key)
        if isinstance(value, dict) and isinstance(default, dict):
            value = _changed(value, default)
            if value:
                changed[key] = value
        elif key not in defaults or value != default:
            changed[key] = value
    return changed
