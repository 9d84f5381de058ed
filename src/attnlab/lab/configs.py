"""A run's config: an arm's preset and changes at a seed and rate, and the fingerprint naming its model."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..config import RunConfig, apply_overrides, load_config, preset_values
from ..paths import user_path
from ..typed import from_dict
from .spec import UNCHANGED, Arm, Changes, Experiment, Suite
from .store import Results


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


@contextmanager
def notes_once(quiet: bool = False):
    """While it lasts, each note the configs say (a warmup capped to a short run, say) is said once: planning makes
    every config many times. quiet: none is said, where configs are made to read records, not to train (a report:
    the run said its notes, and its plan makes the configs of arms that this attempt did not train too)."""
    said = set()

    def first_time(record: logging.LogRecord) -> bool:
        new = not quiet and record.getMessage() not in said
        said.add(record.getMessage())
        return new

    logger = logging.getLogger("attnlab.config")
    logger.addFilter(first_time)
    try:
        yield
    finally:
        logger.removeFilter(first_time)


def configured(experiment: Experiment, arm: Arm, seed: int, lr: float | None, settings: Settings
               ) -> tuple[RunConfig, str]:
    """The config of one run of the suite, and its fingerprint: the arm's preset and changes at this seed and
    learning rate (None: the preset's), the quick tier's changes and the caller's overrides, its steps multiplied
    by scale. Made once for the same inputs: a plan is made again after every job."""
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
