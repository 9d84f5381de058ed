"""A suite's results as types: the one place a run's key is written or parsed, and the one place that decides
whether a record still stands.

On disk a suite's results are `<out>/results.json`: the setting it was run with (suite, tier, --quick, --scale,
the caller's overrides), the newest attempt's machine (`meta`) and `runs`, a flat record per key. A key is
"<experiment>/<arm>/<seed>" for a seed and "<experiment>/<arm>/lr=<rate>" for a point of a learning-rate sweep.
A record holds what was measured (its values) beside what describes the run (RECORD_FIELDS: its folder, its
config's fingerprint, how far it trained, how long it took). The file keeps this format, and the order of its
records and of their fields, so that no results folder needs migrating and every report reads the same.
Only the driver of a suite writes the file, one record at a time under a lock (`Results.save_record`).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError

# what every run records beside its measurements (shown in the runs table, not as measured quantities)
RECORD_FIELDS = ("seconds", "trained", "params", "val_loss", "run", "config", "steps", "stopped_early", "best_step",
                 "best_val_loss", "measured", "resumed_from", "val_tokens", "ppl_tokens",
                 "val_blocks", "niah_depths", "state_bytes")
EXTENT_FIELDS = ("steps", "stopped_early", "best_step", "best_val_loss")  # where training ended, and what is measured


@dataclass(frozen=True)
class RunKey:
    """One run of a suite: a seed of an arm of an experiment, or (seed None) the point of the arm's learning-rate
    sweep at rate lr, which trains at the first seed."""

    experiment: str
    arm: str
    seed: int | None = None
    lr: float | None = None

    def __post_init__(self):
        if (self.seed is None) == (self.lr is None):
            raise ValueError(f"a run key has a seed or a sweep's rate, not both or neither: {self!r}")
        if self.lr is not None:  # the rate as its key writes it, so that a key read back is the same key
            object.__setattr__(self, "lr", float(f"{self.lr:g}"))

    @property
    def sweep(self) -> bool:
        return self.seed is None

    @property
    def trained_seed(self) -> int:
        """The seed its model trains with: a sweep's points train at the first."""
        return 0 if self.sweep else self.seed

    def __str__(self) -> str:
        last = f"lr={self.lr:g}" if self.sweep else str(self.seed)
        return f"{self.experiment}/{self.arm}/{last}"

    @classmethod
    def parse(cls, text: str) -> RunKey:
        prefix, _, last = text.rpartition("/")
        experiment, _, arm = prefix.partition("/")
        if last.isdigit():
            return cls(experiment, arm, seed=int(last))
        if last.startswith("lr="):
            return cls(experiment, arm, lr=float(last[3:]))
        raise UserError(f"'{text}' is not a run's key (<experiment>/<arm>/<seed> or <experiment>/<arm>/lr=<rate>)")


class Record(dict):
    """One run's record as results.json holds it (a flat mapping, in its written order), read through its parts:
    `values` (what the metric measured), `extent` (where training ended) and `fingerprint`/`measurement` (what it
    was trained and measured as)."""

    @property
    def values(self) -> dict:
        return {k: v for k, v in self.items() if k not in RECORD_FIELDS}

    @property
    def extent(self) -> dict:
        return {k: self[k] for k in EXTENT_FIELDS if k in self}

    @property
    def fingerprint(self) -> str | None:
        return self.get("config")

    @property
    def measurement(self) -> list | None:
        return self.get("measured")

    @property
    def folder(self) -> str:
        """Where its model lies, relative to its suite's folder."""
        return self["run"] if "/" in self["run"] else f"runs/{self['run']}"

    def ablated(self) -> bool:
        """Whether it holds a value measured with the mechanism's own component removed (spec.ablated)."""
        from .spec import is_ablated

        return any(is_ablated(key) for key in self)

    def stands(self, fingerprint: str, measurement: list, legacy: list | None, needs_ablation: bool) -> bool:
        """Whether this record is of the model of this fingerprint measured as `measurement` now measures it:
        legacy is what a record older than the `measured` field counts as (None: it must be measured again);
        needs_ablation: the value without the mechanism's component must be there."""
        if self.fingerprint != fingerprint or self.get("measured", legacy) != measurement:
            return False
        return not needs_ablation or self.ablated()


class Results:
    """A suite's results.json in memory: its setting, meta and records by RunKey, in written order."""

    def __init__(self, data: dict):
        self.data = {**data, "runs": None}  # the records live in self.records; "runs" keeps its place in the file
        self.records: dict[RunKey, Record] = {RunKey.parse(k): Record(r) for k, r in data.get("runs", {}).items()}

    @classmethod
    def empty(cls) -> Results:
        return cls({"runs": {}})

    @classmethod
    def load(cls, path: str | Path) -> Results:
        """A suite's results.json, or a one-line error saying why it cannot be used."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise UserError(f"{path} cannot be read as a suite's results ({err}); move it away to start "
                            "afresh") from None
        if not isinstance(data, dict) or not isinstance(data.get("runs"), dict) or "suite" not in data:
            raise UserError(f"{path} is not a suite's results (no 'suite' and 'runs'); move it away to start afresh")
        return cls(data)

    def to_json(self) -> dict:
        runs = {str(key): dict(record) for key, record in self.records.items()}
        return {k: runs if k == "runs" else v for k, v in self.data.items()}

    # the setting and the machine
    @property
    def suite(self) -> str:
        return self.data["suite"]

    @property
    def tier(self) -> str:
        return self.data.get("tier", "default")

    @property
    def meta(self) -> dict:
        return self.data.setdefault("meta", {})

    @property
    def shared_rates(self) -> dict[str, dict]:
        """Sweep experiment -> its shared-rate decision, made once (plan.shared_decision): {"lr": the rate every
        arm trains at, or None where each keeps its own best; "spreads" and "sweep": what the decision read}."""
        return self.data.get("shared_rates", {})

    @property
    def extra(self) -> list[str]:
        return self.data.get("extra", [])

    @property
    def setting(self) -> dict:
        """The suite, tier and --quick / --scale it was made with (older files kept the flags in their meta)."""
        meta = self.data.get("meta", {})
        return {"suite": self.suite, "tier": self.tier,
                "quick": self.data.get("quick", meta.get("quick", False)),
                "scale": self.data.get("scale", meta.get("scale", 1.0))}

    # reading records
    def __contains__(self, key: RunKey) -> bool:
        return key in self.records

    def __len__(self) -> int:
        return len(self.records)

    def get(self, key: RunKey) -> Record | None:
        return self.records.get(key)

    def items(self) -> Iterator[tuple[RunKey, Record]]:
        return iter(self.records.items())

    def of(self, experiment: str, arm: str | None = None, sweeps: bool = False) -> dict[RunKey, Record]:
        """The records of an experiment (of one arm of it), seeds only unless sweeps."""
        return {k: r for k, r in self.records.items() if k.experiment == experiment
                and (arm is None or k.arm == arm) and (sweeps or not k.sweep)}

    def by_seed(self, experiment: str, arm: str, metric: str) -> dict[int, float | None]:
        """The arm's values of one measured quantity, by seed in increasing order (None: never reached)."""
        return dict(sorted((k.seed, r[metric]) for k, r in self.of(experiment, arm).items() if metric in r))

    def without(self, keys) -> Results:
        """A copy without these records (superseded ones, say)."""
        kept = Results({**self.data, "runs": {}})  # the same setting and meta
        kept.records = {k: r for k, r in self.records.items() if k not in keys}
        return kept

    # writing
    def save_record(self, path: Path, key: RunKey, record: dict) -> None:
        """Adds one record, here and in the file at path, keeping the records another process (the same suite
        run with other --only experiments) has written there meanwhile; this takes those in too."""
        with _locked(path.parent):
            on_disk = Results.load(path).records if path.exists() else {}
            self.records = {**self.records, **on_disk, key: Record(record)}
            self.write(path)

    def save_shared_rates(self, path: Path, decided: dict[str, dict]) -> None:
        """Adds shared-rate decisions, here and in the file at path (taking in the records written there
        meanwhile, as save_record does)."""
        with _locked(path.parent):
            on_disk = Results.load(path) if path.exists() else Results.empty()
            self.records = {**self.records, **on_disk.records}
            self.data["shared_rates"] = {**on_disk.shared_rates, **self.shared_rates, **decided}
            self.write(path)

    def write(self, path: Path) -> None:
        """The whole file, atomically."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        os.replace(tmp, path)


def describe_setting(setting: dict) -> str:
    """"the default tier of demo", with ", a smoke run (--quick)" and ", training steps scaled by 0.5 (--scale)"."""
    text = f"the {setting['tier']} tier of {setting['suite']}"
    if setting["quick"]:
        text += ", a smoke run (--quick)"
    if setting["scale"] != 1:
        text += f", training steps scaled by {setting['scale']:g} (--scale)"
    return text


@contextmanager
def _locked(folder: Path):
    """An exclusive lock on the folder while the block runs: one writer of its results.json at a time."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # closing releases the lock
