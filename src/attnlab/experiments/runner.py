"""Running a suite: every arm of every experiment for every seed, results saved as they finish.

Results go to <out>/results.json after each run (written atomically), so an interrupted suite resumes
where it stopped; the report is rebuilt from that file alone. Each write adds its record to what the file
holds then, under a lock, so runs of the same suite with different --only experiments can share a folder.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import math
import os
import platform
import shutil
import time
from contextlib import contextmanager
from datetime import datetime
from fnmatch import fnmatch
from pathlib import Path

import torch

from .. import checkpoint
from ..config import RunConfig, apply_overrides, load_config, load_yaml
from ..errors import ConfigError, UserError
from ..inference import load_run
from ..model import Decoder
from ..starting_point import as_fitted
from ..train import train
from ..typed import from_dict
from .claims import anchors_of, failed_calibrations
from .metrics import get_metric
from .spec import Arm, Experiment, Suite, arm_seeds, is_ablated, seed_count, split_key, sweep_rates, sweep_source


def measure(experiment: Experiment, run_dir: Path) -> dict:
    """A trained run's values by its experiment's metric (`metrics.METRICS`)."""
    return get_metric(experiment.metric).measure(experiment, run_dir)


def run_suite(suite: Suite, out_dir: str | Path, seeds: int | None = None, quick: bool = False, scale: float = 1.0,
              extra: list[str] = (), log=print, only: list[str] = (), arms: list[str] = ()) -> dict:
    """Train and measure every run of the suite (seeds: the suite's own count unless given; only: the
    experiments whose names match one of these shell patterns; arms: their arms whose labels match one),
    keeping the runs that an earlier, interrupted attempt finished with the same config."""
    seeds = seeds or suite.seeds
    experiments = _selected(suite, only, arms)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = _open_results(out, suite, {"suite": suite.name, "tier": suite.tier, "quick": quick, "scale": scale},
                            extra, seeds=suite.seeds if only else seeds, partial=bool(only))
    runs = _SuiteRuns(suite, experiments, seeds, out, results, suite.quick if quick else (), scale, extra, log)
    for experiment in experiments:
        # a smoke run trains every arm: its few steps calibrate nothing
        arms = experiment.arms if quick else _calibrate_first(suite, experiment, runs, seeds, log)
        lrs = {arm.label: runs.rate(experiment, arm) for arm in arms}  # every arm's sweep before any seed
        for seed in range(min(seeds, experiment.seeds or seeds)):  # seed by seed: a stopped suite stays paired
            for arm in (a for a in arms if seed < seed_count(experiment, a, seeds)):
                runs.run(f"{experiment.name}/{arm.label}/{seed}", arm, experiment, seed, lrs[arm.label])
    return results


def _calibrate_first(suite: Suite, experiment: Experiment, runs: _SuiteRuns, seeds: int, log) -> list[Arm]:
    """The experiment's arms to train. Calibration before comparison: an arm that a claim's Anchor holds to the
    paper's number trains all its seeds first, and if it then misses that number, nothing is compared with it:
    no other arm of the experiment is trained."""
    anchors = [a for a in anchors_of(suite.claims) if a.experiment == experiment.name]
    if not anchors:
        return experiment.arms
    baselines = [arm for arm in experiment.arms if arm.label in {a.arm for a in anchors}]
    for arm in baselines:
        for seed in range(seed_count(experiment, arm, seeds)):
            runs.run(f"{experiment.name}/{arm.label}/{seed}", arm, experiment, seed, runs.rate(experiment, arm))
    old = superseded(suite, runs.results)  # records of an earlier protocol do not calibrate this one
    now = {**runs.results, "runs": {k: r for k, r in runs.results["runs"].items() if k not in old}}
    failed = failed_calibrations(anchors, now, arm_seeds(suite, seeds))
    if experiment.name not in failed:
        return experiment.arms
    log(f"[{suite.name}] {experiment.name}: the baseline is not the paper's ({failed[experiment.name]}), "
        "so its other arms are not trained")
    return baselines


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


def _open_results(out: Path, suite: Suite, setting: dict, extra: list[str], seeds: int, partial: bool) -> dict:
    """The folder's results.json (empty for a new folder) updated with this attempt's setting and machine; a
    folder of another setting (a smoke run, a rescaled one) is refused. A partial run (--only) leaves the seed
    count as it was, or starts a folder at the suite's own."""
    results_path = out / "results.json"
    results = load_results(results_path) if results_path.exists() else {"runs": {}}
    if results["runs"] and setting_of(results) != setting:  # a smoke run must never mix with, or replace, results
        raise UserError(f"{out} holds results of {describe_setting(setting_of(results))}, not of "
                        f"{describe_setting(setting)}; give another --out, or move {out} away to start afresh")
    results |= setting
    results["extra"] = list(extra)  # the caller's overrides: what `superseded` needs to know the configs
    results["meta"] = {**results.get("meta", {}), "cpu": _cpu_name(),  # the newest attempt's
                       "threads": torch.get_num_threads(), "torch": torch.__version__}
    if partial:
        results["meta"].setdefault("seeds", seeds)
    else:
        results["meta"]["seeds"] = seeds
    return results


class _SuiteRuns:
    """The runs of one attempt at a suite: each trained and measured once, recorded as soon as it is measured,
    and measured at once by every other experiment that uses the same model."""

    def __init__(self, suite, experiments, seeds, out, results, quick, scale, extra, log):
        self.suite, self.out, self.results, self.log = suite, out, results, log
        self.settings = (out, quick, scale, extra)
        # every run of the selected experiments, key -> (experiment, arm, seed, rate: a sweep's own; None for a
        # seed, which trains at the rate its sweep chooses), so that a model is measured by every experiment that
        # uses it as soon as it is trained (it may not be on disk when a later session resumes the suite)
        self.plan = {}
        for e in experiments:
            for a in e.arms:
                self.plan |= {sweep_key(e.name, a.label, lr): (e, a, 0, lr) for lr in e.lrs}
                self.plan |= {f"{e.name}/{a.label}/{s}": (e, a, s, None) for s in range(seed_count(e, a, seeds))}
        self.rates = {}  # (the name of the experiment that sweeps, arm label) -> the rate its sweep chose
        self.fingerprints = {}
        self.measured = set()  # the keys this attempt measured: each once, whatever its record lacks

    def config(self, experiment: Experiment, arm: Arm, seed: int, lr: float | None) -> RunConfig:
        return run_config(experiment, arm, seed, lr, *self.settings)

    def rate(self, experiment: Experiment, arm: Arm) -> float | None:
        """The learning rate the arm's seeds train at: the one its sweep chooses (the sweep runs first where it
        has not), None without a sweep (the preset's)."""
        source = sweep_source(self.suite, experiment)
        if source is None:
            return None
        if (source.name, arm.label) not in self.rates:
            swept = next(a for a in source.arms if a.label == arm.label)
            self.rates[source.name, arm.label] = _sweep(source, swept, self.run, extend=not self.settings[1])
        return self.rates[source.name, arm.label]

    def planned(self, key: str) -> tuple[Experiment, Arm, int, float | None] | None:
        """A planned run with its rate, None for the seed of a sweep that has not chosen yet."""
        experiment, arm, seed, lr = self.plan[key]
        source = sweep_source(self.suite, experiment)
        if lr is None and source is not None:
            lr = self.rates.get((source.name, arm.label))
            if lr is None:
                return None
        return experiment, arm, seed, lr

    def planned_fingerprint(self, key: str) -> str | None:
        if key not in self.fingerprints:
            planned = self.planned(key)
            if planned is None:
                return None
            self.fingerprints[key] = _fingerprint(self.config(*planned))
        return self.fingerprints[key]

    def run(self, key: str, arm: Arm, experiment: Experiment, seed: int, lr: float | None = None) -> dict:
        """One trained and measured model, recorded in results.json as soon as it is measured."""
        cfg = self.config(experiment, arm, seed, lr)
        fingerprint = _fingerprint(cfg)
        if not self.done(key, fingerprint, experiment, cfg):
            self.measured.add(key)
            self.log(f"[{self.suite.name}] {key}")
            record = _train_and_measure(cfg, experiment, self.results, fingerprint, self.out, self.log)
            self.results["meta"]["finished"] = datetime.now().isoformat(timespec="minutes")
            _save_record(self.out / "results.json", self.results, key, record)
        for other, (other_experiment, *_) in self.plan.items():  # the same model elsewhere: measure it now
            if self.planned_fingerprint(other) != fingerprint or self.done(other, fingerprint, other_experiment, cfg):
                continue
            other_experiment, other_arm, other_seed, other_lr = self.planned(other)
            self.run(other, other_arm, other_experiment, other_seed, other_lr)
        return self.results["runs"][key]

    def done(self, key: str, fingerprint: str, experiment: Experiment, cfg: RunConfig) -> bool:
        """Whether the run needs no measuring: this attempt measured it, or an earlier one did with this config
        (a sweep's point, of which only the validation loss is read, needs no value without the component)."""
        sweep = split_key(key)[2] is None
        record = self.results["runs"].get(key, {})
        return key in self.measured or _current(record, fingerprint, experiment, None if sweep else cfg)


def run_config(experiment: Experiment, arm: Arm, seed: int, lr: float | None, out: Path, quick: list[str] = (),
               scale: float = 1.0, extra: list[str] = ()) -> RunConfig:
    """The config of one run of the suite: the arm's preset and overrides at this seed and learning rate (None:
    the preset's), the quick tier's overrides and the caller's, its steps multiplied by scale."""
    name = "-".join([experiment.name, arm.label, *([f"lr{lr:g}"] if lr else []), f"s{seed}"])
    own = [*arm.overrides, *(learning_rate(arm, lr) if lr else []), *quick]
    overrides = [*own, *_read_by_run(arm.preset, own, extra), f"name={name}".replace("+", "p"),
                 f"out_dir={out / 'runs'}", f"train.seed={1000 + seed}", "train.keep_last=1"]
    cfg = load_config(arm.preset, overrides)
    if scale == 1.0:
        return cfg
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=max(1, round(cfg.train.steps * scale))))


def _read_by_run(preset: str, own: list[str], extra: list[str]) -> list[str]:
    """The caller's overrides but those of data fields that this run's source does not read (which its config
    would refuse): one list of them shrinks a suite whose arms train on text and on tasks alike."""
    data = from_dict(RunConfig, apply_overrides(load_yaml(preset), [*own, *extra])).data
    return [o for o in extra if not o.startswith("data.") or data.reads(o.partition("=")[0].split(".")[1])]


def superseded(suite: Suite, results: dict) -> set[str]:
    """The keys of records trained with another config than the suite now gives their run (its presets or
    protocol changed since): `attnlab reproduce` trains them again, and until then they describe something
    else. An arm with a learning-rate sweep is checked once its sweep is measured."""
    setting = setting_of(results)
    quick, scale, extra = suite.quick if setting["quick"] else (), setting["scale"], results.get("extra", [])
    old = set()
    for experiment in suite.experiments:
        lrs, source = {}, sweep_source(suite, experiment)
        if source is not None:
            losses = {a.label: swept_losses(results, source, a.label) for a in source.arms}
            lrs = {label: min(by_lr, key=by_lr.get) for label, by_lr in losses.items() if None not in by_lr.values()}
        arms = {arm.label: arm for arm in experiment.arms if source is None or arm.label in lrs}
        for key, record in results["runs"].items():
            name, label, seed = split_key(key)
            # a record written by hand or by a version before fingerprints has no config to compare
            if name != experiment.name or label not in arms or seed is None or "config" not in record:
                continue
            cfg = run_config(experiment, arms[label], seed, lrs.get(label), Path(), quick, scale, extra)
            if record["config"] != _fingerprint(cfg):
                old.add(key)
    return old


def _sweep(experiment: Experiment, arm: Arm, run, extend: bool) -> float:
    """The rate of the arm's sweep (spec.sweep_rates) whose first-seed run reaches the lowest validation loss."""
    losses = {}

    def loss(lr: float) -> float:
        if lr not in losses:
            losses[lr] = _sweep_loss(run(sweep_key(experiment.name, arm.label, lr), arm, experiment, 0, lr))
        return losses[lr]

    return min(sweep_rates(experiment.lrs, loss, extend), key=loss)


def swept_losses(results: dict, experiment: Experiment, label: str) -> dict[float, float | None]:
    """The arm's sweep as far as the results know it: each of its rates (spec.sweep_rates) -> the validation loss
    its first seed reached, None where it has not run yet."""
    def loss(lr: float) -> float | None:
        record = results["runs"].get(sweep_key(experiment.name, label, lr))
        return None if record is None else _sweep_loss(record)

    rates = sweep_rates(experiment.lrs, loss, extend=not setting_of(results)["quick"])
    return {lr: loss(lr) for lr in rates}


def _sweep_loss(record: dict) -> float:
    loss = record.get("best_val_loss")
    return math.inf if loss is None else loss  # a run that never validated (it diverged) loses


def learning_rate(arm: Arm, lr: float) -> list[str]:
    """Overrides that train the arm at peak rate lr, its schedule's floor scaled alike."""
    base = load_config(arm.preset, arm.overrides).train
    return [f"train.lr={lr}", f"train.min_lr={lr * base.min_lr / base.lr}"]


def sweep_key(experiment: str, arm: str, lr: float) -> str:
    return f"{experiment}/{arm}/lr={lr:g}"


def _train_and_measure(cfg, experiment: Experiment, results: dict, fingerprint: str, out: Path, log) -> dict:
    start = time.perf_counter()
    earlier = _earlier_runs(results, fingerprint, out, log)
    for run_dir, record in earlier:
        if _measured(record, experiment, cfg):  # the same model, measured the same way
            log(f"    the same model and measurement as {record['run']}")
            return {**record, "run": os.path.relpath(run_dir, out), "seconds": 0.0, "trained": False}
    run_dir = next((d for d, _ in earlier if _holds(d, fingerprint)), None)
    trained, resumed, earlier_seconds = run_dir is None, None, 0.0
    if trained:
        run_dir = Path(cfg.out_dir) / cfg.name
        resumed = unfinished_step(run_dir, cfg, log)  # an earlier attempt stopped part-way: continue it
        if resumed is None:
            shutil.rmtree(run_dir, ignore_errors=True)  # anything else there is not this run's
        else:
            log(f"    continuing from the checkpoint at step {resumed}")
        summary = train(cfg, resume=None if resumed is None else "auto", progress=False, log=lambda *_: None)
        params, earlier_seconds = summary["params"], summary["earlier_seconds"]
        (run_dir / FINGERPRINT).write_text(fingerprint)
    else:  # an arm of another experiment trained this very model: measure it again
        log(f"    the same model as {run_dir.name}")
        params = load_run(run_dir).model.num_params()
    record = {"params": params, **training_extent(run_dir), **measure(experiment, run_dir)}
    record |= {"seconds": time.perf_counter() - start + earlier_seconds, "trained": trained,
               "run": os.path.relpath(run_dir, out), "config": fingerprint, "measured": _measurement(experiment)}
    if resumed is not None:  # seconds then include the training of earlier attempts up to that checkpoint
        record["resumed_from"] = resumed
    log("    " + ", ".join(f"{k} {v:.4g}" for k, v in record.items() if isinstance(v, float | int)))
    return record


FINGERPRINT = "fingerprint"  # written into a run folder once its model is trained: the config it was trained with


def _holds(run_dir: Path, fingerprint: str) -> bool:
    """Whether the folder holds a finished model of this config (a folder may since have been trained again)."""
    path = run_dir / FINGERPRINT
    return path.is_file() and path.read_text() == fingerprint


def _measurement(experiment: Experiment) -> list:
    """What a record's measured values depend on besides the model (a metric's revision, where it has one:
    records measured before are measured again, from the model where its folder is still there)."""
    revision = get_metric(experiment.metric).revision
    return [experiment.metric, experiment.lengths, experiment.target_losses, *([revision] if revision else [])]


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
    if _fingerprint(as_fitted(cfg, saved)) != _fingerprint(saved):
        return None
    return json.loads((ckpt / checkpoint.MANIFEST).read_text())["step"]


def _current(record: dict, fingerprint: str, experiment: Experiment, cfg: RunConfig | None) -> bool:
    """Whether a record is of this model (of this fingerprint) measured as the experiment measures (cfg: see
    _measured)."""
    return record.get("config") == fingerprint and _measured(record, experiment, cfg)


def _measured(record: dict, experiment: Experiment, cfg: RunConfig | None) -> bool:
    """Whether a record of cfg's model holds what the experiment measures: measured the same way (records older
    than the measured field count as measured this way, unless their metric has a revision since), with the value
    without the mechanism's own component where the metric measures one and the model has that component (records
    from before the metric measured it lack it; cfg None: not needed)."""
    metric, measurement = get_metric(experiment.metric), _measurement(experiment)
    if record.get("measured", None if metric.revision else measurement) != measurement:
        return False
    return cfg is None or not (metric.ablation and _ablates(cfg)) or any(is_ablated(key) for key in record)


_ABLATES: dict[str, bool] = {}  # repr of a model config -> whether its model has a component to remove


def _ablates(cfg: RunConfig) -> bool:
    """Whether the run's model has a mechanism's own component to remove at evaluation (Decoder.ablates), from a
    model built on the meta device: no memory and no weights, only the mixers."""
    key = repr(cfg.model)
    if key not in _ABLATES:
        with torch.device("meta"):
            _ABLATES[key] = Decoder(cfg.model.fitted(vocab_size=1)).ablates()
    return _ABLATES[key]


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


def _fingerprint(cfg) -> str:
    """What decides the trained weights: the config fields that differ from their defaults, except the
    run's name and folder, train.compile (how the same arithmetic runs) and train.log_to (where its numbers
    are also sent). A field added later at its
    default leaves earlier runs valid (like the code, a changed default is not seen: delete results.json
    to train everything again)."""
    settings = _changed(cfg.to_dict(), type(cfg)().to_dict())
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


def _earlier_runs(results: dict, fingerprint: str, out: Path, log=print) -> list[tuple[Path, dict]]:
    """The models with this config that this suite, or another suite beside it (a sibling folder of results),
    has trained already, with their records: such a model is measured again (or its record reused), not
    trained again. A sibling's results.json that cannot be read is skipped with a warning."""
    found, earlier = [], [(out, results)]
    for path in sorted(out.parent.glob("*/results.json")):
        if path.parent != out:
            try:
                earlier.append((path.parent, load_results(path)))
            except UserError as err:
                log(f"    skipping {path}: {err}")
    for folder, recorded in earlier:
        found += [(folder / run_path(r), r) for r in recorded["runs"].values() if r.get("config") == fingerprint]
    return found


def load_results(path: Path) -> dict:
    """A suite's results.json, or a one-line error saying why it cannot be used."""
    try:
        results = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"{path} cannot be read as a suite's results ({err}); move it away to start afresh") from None
    if not isinstance(results, dict) or not isinstance(results.get("runs"), dict) or "suite" not in results:
        raise UserError(f"{path} is not a suite's results (no 'suite' and 'runs'); move it away to start afresh")
    return results


def setting_of(results: dict) -> dict:
    """The suite, tier and --quick / --scale that a results.json was made with (older files kept the flags in
    their meta)."""
    meta = results.get("meta", {})
    return {"suite": results["suite"], "tier": results.get("tier", "default"),
            "quick": results.get("quick", meta.get("quick", False)),
            "scale": results.get("scale", meta.get("scale", 1.0))}


def describe_setting(setting: dict) -> str:
    """"the default tier of demo", with ", a smoke run (--quick)" and ", training steps scaled by 0.5 (--scale)"."""
    text = f"the {setting['tier']} tier of {setting['suite']}"
    if setting["quick"]:
        text += ", a smoke run (--quick)"
    if setting["scale"] != 1:
        text += f", training steps scaled by {setting['scale']:g} (--scale)"
    return text


def run_path(record: dict) -> str:
    """Where a record's model lies, relative to its suite's folder."""
    return record["run"] if "/" in record["run"] else f"runs/{record['run']}"


def _save_record(path: Path, results: dict, key: str, record: dict) -> None:
    """Adds one record to results and to the file at path, keeping the records that another process (the same
    suite run with other --only experiments) has written there meanwhile; results takes those in too."""
    with _locked(path.parent):
        on_disk = load_results(path)["runs"] if path.exists() else {}
        results["runs"] = {**results["runs"], **on_disk, key: record}
        _write_json(path, results)


@contextmanager
def _locked(folder: Path):
    """An exclusive lock on the folder while the block runs: one writer of its results.json at a time."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # closing releases the lock


def _write_json(path: Path, value) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)
