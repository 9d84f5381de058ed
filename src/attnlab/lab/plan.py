"""A suite's plan: every job it needs, with its dependencies and what it will cost, before anything trains.

A job is one run of an experiment (a seed of an arm, or a point of its learning-rate sweep) at a config. Jobs
depend on each other in three ways:
- a seed trains at the rate its arm's sweep chooses, so it waits for the sweep's points (and a sweep grows past
  an edge of its grid that wins, so its later points wait for the earlier ones: `sweeps.sweep_rates`);
- calibration before comparison: an arm that a claim's Anchor holds to the paper's number trains all its seeds
  first, and if it then misses that number, nothing is compared with it (no other arm of the experiment trains);
- several experiments may use the same model (the same fingerprint): the first trains it, the others measure it.
`plan` reads the results as they stand and says, for each job, whether its record stands (done), what it must do
(train, or measure a model that exists), or what it waits for, beside the decisions behind that (each arm's
sweep, shared rates, superseded records), which the report reads rather than makes again. The driver asks again
after every finished job, so a plan grows as sweeps choose and calibrations pass, and a stopped suite plans afresh.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Literal

import torch

from ..config import RunConfig, TrainConfig
from ..data import TASKS, Floor
from ..errors import UserError
from ..model import Decoder
from .claims import anchors_of, failed_calibrations
from .configs import Settings, configured, notes_once, settings_of
from .metrics import get_metric
from .spec import Arm, Experiment, Suite, arm_seeds, seed_count, sweep_source
from .stats import mean_std
from .store import Record, Results, RunKey
from .sweeps import SharedRate, Sweep, Waiting, as_read, pair_rates, sweep_loss, sweep_rates

Status = Literal["done", "train", "measure", "waiting", "blocked"]
Stage = Literal["calibration", "sweep", "seed"]  # an anchored baseline's seed, a point of a sweep, a seed


@dataclass
class Job:
    """One run to train and measure (or only measure: `model` names the job that trains its model)."""

    key: RunKey
    stage: Stage
    experiment: Experiment
    arm: Arm
    lr: float | None  # the rate it trains at (None: its preset's, or not known yet)
    cfg: RunConfig  # while its rate is not known, the config at its preset's rate (as costly to train)
    fingerprint: str | None = None  # None while its rate is not known
    status: Status = "train"
    why: str = ""  # what it waits for, why it is blocked, or what it replaces
    model: RunKey | None = None  # the job whose model it measures (a model shared with another experiment)
    supersedes: bool = False  # its key holds a record of another config, which it replaces
    again: bool = False  # measured again on request, whatever its record: from its model, else trained again

    @property
    def runnable(self) -> bool:
        return self.status in ("train", "measure")


@dataclass
class Plan:
    """Every job of the selected experiments, and the decisions behind them, for the driver and the report."""

    jobs: list[Job]
    settings: Settings
    sweeps: dict[tuple[str, str], Sweep]  # (sweeping experiment, arm) -> its sweep as the results know it
    shared_rates: dict[str, SharedRate]  # sweeping experiment -> which compared arms share a rate, once decided
    superseded: frozenset[RunKey]  # records of another config than their run now has (trained again)
    decided: dict[str, SharedRate]  # the shared-rate decisions made by this plan, for the driver to record

    def runnable(self) -> list[Job]:
        """The jobs that can start now: measurements of models that exist first (cheap, and as soon as the model
        is there), then the rest in plan order."""
        ready = [job for job in self.jobs if job.runnable]
        return sorted(ready, key=lambda job: job.status != "measure")

    def count(self, status: Status) -> int:
        return sum(job.status == status for job in self.jobs)

    def seeds(self, experiment: str, arm: str) -> int:
        """How many seeds the arm trains (0: no such arm in the plan)."""
        return sum((job.key.experiment, job.key.arm) == (experiment, arm) and not job.key.sweep for job in self.jobs)

    def train(self, experiment: str, arm: str) -> TrainConfig:
        """How an arm's seeds train (steps, stopping), from its first seed's config."""
        return next(job.cfg.train for job in self.jobs if (job.key.experiment, job.key.arm) == (experiment, arm)
                    and not job.key.sweep)

    def floor(self, experiment: str, key: str) -> Floor | None:
        """The chance floor of an experiment's accuracy under key (Task.floor of the task its runs train on);
        None for a text corpus, a task without one, or an experiment not in the plan."""
        data = next((job.cfg.data for job in self.jobs if job.key.experiment == experiment), None)
        if data is None or data.source not in TASKS:
            return None
        return TASKS[data.source].floor(data.task_config(), key)


def plan(suite: Suite, experiments: list[Experiment], results: Results, settings: Settings,
         models: frozenset = frozenset(), attempted: frozenset = frozenset(), beside: tuple = (),
         again: tuple[str, ...] = ()) -> Plan:
    """Every job of the selected experiments as the results stand. models: the fingerprints of the trained models
    on disk (in this suite's folder and those beside it); beside: the records of the folders beside this suite's,
    which a job may copy where one is of its model measured its way; attempted: keys this attempt has already run,
    which count as done whatever their record lacks, so that a measure that records nothing cannot loop; again:
    shell patterns over run keys (experiment/arm/seed) whose records are measured again whatever they hold."""
    decisions = Decisions(suite, results, settings)
    jobs = [job for experiment in experiments for job in _experiment_jobs(suite, experiment, decisions)]
    for pattern in again:
        if not any(not job.key.sweep and fnmatch(str(job.key), pattern) for job in jobs):
            example = next((str(job.key) for job in jobs if not job.key.sweep), "lm/softmax/0")
            raise UserError(f"--remeasure {pattern} matches no run of the selected experiments; a run is named "
                            f"experiment/arm/seed, e.g. {example}")
    _settle(jobs, results, models, attempted, beside, again)
    shared = {name: rate for name, rate in decisions.shared.items() if rate is not None}
    decided = {name: rate for name, rate in shared.items() if results.shared_rates.get(name) != rate}
    return Plan(jobs, settings, decisions.sweeps, shared, decisions.superseded, decided)


def plan_of(suite: Suite, results: Results) -> Plan:
    """The plan of every experiment as a results file stands, with the settings it was made with: what its report
    reads. Its configs say no notes: their runs said them when they trained."""
    with notes_once(quiet=True):
        return plan(suite, suite.experiments, results, settings_of(suite, results))


def _experiment_jobs(suite: Suite, experiment: Experiment, decisions: Decisions) -> list[Job]:
    """An experiment's jobs: every arm's sweep before any seed, seed by seed (so that they stay paired), an
    anchored baseline's seeds first where its calibration holds the other arms back."""
    settings, jobs = decisions.settings, []
    anchored = {a.arm for a in anchors_of(suite.claims) if a.experiment == experiment.name}
    gated = bool(anchored) and not settings.smoke  # a smoke run's few steps calibrate nothing
    order = sorted(experiment.arms, key=lambda arm: arm.label not in anchored) if gated else experiment.arms
    held = _held(decisions.calibration(experiment) if gated else True)
    for arm in order:
        for job in decisions.sweep_jobs(experiment, arm):
            jobs.append(dataclasses.replace(job, **held) if held and arm.label not in anchored else job)
    decisions.share_rate(experiment)
    for seed in range(min(settings.seeds, experiment.seeds or settings.seeds)):
        for arm in order:
            if seed >= seed_count(experiment, arm, settings.seeds):
                continue
            stage = "calibration" if gated and arm.label in anchored else "seed"
            job = _job(RunKey(experiment.name, arm.label, seed=seed), stage, experiment, arm,
                       decisions.rate(experiment, arm), settings)
            jobs.append(dataclasses.replace(job, **held) if held and stage == "seed" else job)
    return jobs


def _held(calibrated: bool | str | None) -> dict:
    """What holds back the arms compared with a baseline: nothing once it is calibrated, the calibration while
    its seeds are not all measured, for good where it missed the paper's number."""
    if calibrated is True:
        return {}
    return {"status": "waiting", "why": "the calibration"} if calibrated is None else {"status": "blocked",
                                                                                      "why": calibrated}


class Decisions:
    """What a plan decides from the results, each once: every arm's sweep and rate, the shared rates, the
    superseded records and the calibrations."""

    def __init__(self, suite: Suite, results: Results, settings: Settings):
        self.suite, self.results, self.settings = suite, results, settings
        self.sweeps: dict[tuple[str, str], Sweep] = {}
        self.rates: dict[tuple[str, str], float | Waiting] = {}  # the rate each swept arm's seeds train at
        self.shared: dict[str, SharedRate | None] = {}  # the selected experiments' sweeps' decisions
        self._decisions: dict[str, SharedRate | None] = {}  # every sweep's, made once
        self.superseded = frozenset(superseded(suite, results, settings, self.shared_rate))
        self.current = results.without(self.superseded)  # an earlier protocol calibrates nothing here

    def shared_rate(self, source: Experiment) -> SharedRate | None:
        """Whether the arms of a sweep share a rate (shared_decision), decided once per plan."""
        if source.name not in self._decisions:
            pairs = compared_pairs(self.suite, source)
            self._decisions[source.name] = shared_decision(source, self.results, self.settings, pairs)
        return self._decisions[source.name]

    def rate(self, experiment: Experiment, arm: Arm) -> float | Waiting | None:
        """The rate the arm's seeds train at: its sweep's, or None where its preset's rate is used."""
        source = sweep_source(self.suite, experiment)
        return None if source is None else self.rates.get((source.name, arm.label))

    def sweep_jobs(self, experiment: Experiment, arm: Arm) -> list[Job]:
        """The points of the sweep that chooses the arm's rate, as far as they can be known (a point beyond the
        grid is known once the grid's points stand: sweeps.sweep_rates); records the sweep and its choice."""
        source = sweep_source(self.suite, experiment)
        if source is None or (source.name, arm.label) in self.sweeps:
            return []
        swept = next(a for a in source.arms if a.label == arm.label)
        jobs: dict[float, Job] = {}

        def loss(lr: float) -> float | None:  # the point's validation loss where its record stands
            if lr not in jobs:
                jobs[lr] = _job(RunKey(source.name, arm.label, lr=lr), "sweep", source, swept, lr, self.settings)
            record = self.results.get(jobs[lr].key)
            return sweep_loss(record) if _stands(record, jobs[lr]) else None

        tried = sweep_rates(source.lrs, loss, extend=not self.settings.smoke)
        chosen = min(tried, key=lambda lr: math.inf if loss(lr) is None else loss(lr))
        if None in (loss(lr) for lr in jobs):
            chosen = Waiting(f"the sweep of {source.name}/{arm.label}")
        recorded = _recorded(self.results, source, arm.label, extend=not self.settings.smoke)
        self.sweeps[source.name, arm.label] = Sweep(source.name, arm.label, recorded, chosen)
        self.rates[source.name, arm.label] = chosen
        return list(jobs.values())

    def share_rate(self, experiment: Experiment) -> None:
        """Where the experiment's sweep has decided that compared arms share a rate, their seeds train at it."""
        source = sweep_source(self.suite, experiment)
        if source is None:
            return
        decision = self.shared[source.name] = self.shared_rate(source)
        if decision is None:
            return
        for arm in experiment.arms:
            if arm.label in decision.rates and isinstance(self.rates.get((source.name, arm.label)), float):
                self.rates[source.name, arm.label] = decision.rates[arm.label]

    def calibration(self, experiment: Experiment) -> bool | str | None:
        """True where the experiment's anchored baselines match the paper, else why not (the paper's number they
        miss); None while their seeds are not all measured."""
        anchors = [a for a in anchors_of(self.suite.claims) if a.experiment == experiment.name]
        counts = arm_seeds(self.suite, self.settings.seeds)
        for anchor in anchors:
            if len(self.current.of(experiment.name, anchor.arm)) < counts(experiment.name, anchor.arm):
                return None
        failed = failed_calibrations(anchors, self.current, counts)
        if experiment.name not in failed:
            return True
        return f"the baseline is not the paper's ({failed[experiment.name]})"


def compared_pairs(suite: Suite, source: Experiment) -> list[tuple[str, str]]:
    """The pairs of arms whose rates a sweep decides together: the (arm, baseline) of each claim on the sweeping
    experiment or on one that takes its rates, in the suite's order; without such claims, each arm with the
    experiment's baseline."""
    names = {e.name for e in suite.experiments if (s := sweep_source(suite, e)) is not None and s.name == source.name}
    labels = {arm.label for arm in source.arms}
    pairs = [(c.arm, c.baseline) for c in suite.claims
             if c.baseline is not None and {c.experiment, c.contrast} & names and {c.arm, c.baseline} <= labels]
    return list(dict.fromkeys(pairs)) or [(a.label, source.baseline) for a in source.arms if a.label != source.baseline]


def shared_decision(source: Experiment, results: Results, settings: Settings, pairs: list[tuple[str, str]]
                    ) -> SharedRate | None:
    """Which compared arms of a sweep share a rate (sweeps.pair_rates), decided from every arm's sweep and its seeds
    at its own best rate (their spread); None until those are all measured. The driver records a decision once
    made, so that seeds trained again at a shared rate, whose spread differs, cannot undo it: a recorded decision's
    spreads are read, not measured again, while the sweep is the one it read (a sweep trained again decides again)."""
    losses = _every_sweep(source, results, settings)
    if any(None in by_lr.values() for by_lr in losses.values()):
        return None
    recorded = results.shared_rates.get(source.name)
    if recorded is not None and recorded.read == as_read(losses):
        return SharedRate(pair_rates(losses, recorded.spreads, pairs), recorded.spreads, recorded.read)
    spreads = {}
    for arm in source.arms:
        values = _seed_losses(source, arm, min(losses[arm.label], key=losses[arm.label].get), results, settings)
        if values is None:
            return None
        spreads[arm.label] = mean_std(values)[1] if len(values) > 1 else 0.0
    return SharedRate(pair_rates(losses, spreads, pairs), spreads, as_read(losses))


def _seed_losses(source: Experiment, arm: Arm, lr: float, results: Results, settings: Settings
                 ) -> list[float] | None:
    """The sweep losses of the arm's seeds at rate lr, None until every one stands."""
    values = []
    for seed in range(seed_count(source, arm, settings.seeds)):
        key = RunKey(source.name, arm.label, seed=seed)
        cfg, print_ = configured(source, arm, seed, lr, settings)
        if not stands(results.get(key), key, source, cfg, print_):
            return None
        values.append(sweep_loss(results.get(key)))
    return values


def _recorded(results: Results, source: Experiment, label: str, extend: bool) -> dict[float, float | None]:
    """The arm's sweep as the results record it, a record of an earlier config included: each of its rates -> the
    validation loss its first seed reached, None where it has not run yet."""
    def loss(lr: float) -> float | None:
        record = results.get(RunKey(source.name, label, lr=lr))
        return None if record is None else sweep_loss(record)

    return {lr: loss(lr) for lr in sweep_rates(source.lrs, loss, extend)}


def _every_sweep(source: Experiment, results: Results, settings: Settings) -> dict[str, dict[float, float | None]]:
    """Every arm's sweep as far as the results record it, by arm label."""
    return {a.label: _recorded(results, source, a.label, not settings.smoke) for a in source.arms}


def arm_rates(source: Experiment, results: Results, settings: Settings, decision: SharedRate | None
              ) -> dict[str, float]:
    """The rate each arm of a sweep trains at once its sweep is complete: the one it shares with the arm it is
    compared with (decision), else its own best."""
    losses = _every_sweep(source, results, settings)
    own = {label: min(by_lr, key=by_lr.get) for label, by_lr in losses.items() if None not in by_lr.values()}
    shared = {} if decision is None else decision.rates
    return {label: shared.get(label, lr) for label, lr in own.items()}


def superseded(suite: Suite, results: Results, settings: Settings, shared) -> set[RunKey]:
    """The keys of records trained with another config than the suite now gives their run (its presets or
    protocol changed since): `attnlab reproduce` trains them again, and until then they describe something
    else. An arm whose sweep is measured is checked at the rate it chose; one whose sweep is still going, against
    every rate its sweep may yet choose (a record at none of them is of another protocol). shared(source): the
    sweep's shared-rate decision."""
    old = set()
    for experiment in suite.experiments:
        source = sweep_source(suite, experiment)
        lrs = {} if source is None else arm_rates(source, results, settings, shared(source))
        for key, record in results.of(experiment.name).items():
            arm = next((a for a in experiment.arms if a.label == key.arm), None)
            # a record written by hand or by a version before fingerprints has no config to compare
            if arm is None or record.fingerprint is None:
                continue
            if source is None or key.arm in lrs:
                rates = [lrs.get(key.arm)]
            else:
                rates = list(_recorded(results, source, key.arm, extend=not settings.smoke))
            if record.fingerprint not in {configured(experiment, arm, key.seed, lr, settings)[1] for lr in rates}:
                old.add(key)
    return old


def _job(key: RunKey, stage: Stage, experiment: Experiment, arm: Arm, rate: float | Waiting | None,
         settings: Settings) -> Job:
    """A job at its rate: a sweep point's own, the rate its sweep chose, or (Waiting) at its preset's rate until
    its sweep chooses."""
    lr = key.lr if key.sweep else rate
    if isinstance(lr, Waiting):
        cfg, _ = configured(experiment, arm, key.trained_seed, None, settings)
        return Job(key, stage, experiment, arm, None, cfg, status="waiting", why=lr.why)
    cfg, print_ = configured(experiment, arm, key.trained_seed, lr, settings)
    return Job(key, stage, experiment, arm, lr, cfg, print_)


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
        if job.fingerprint is None or job.status == "blocked":
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


