"""A suite's results as types: run keys, records, and the results.json that holds them.

On disk a suite's results are `<out>/results.json`: the setting it was run with (suite, tier, --quick, --scale,
the caller's overrides), the newest attempt's machine (`meta`), where a paper kept outside attnlab comes from
(`source`: what --import takes, so that its report is rebuilt without it) and `runs`, a flat record per key. A
key is "<experiment>/<arm>/<seed>" for a seed and "<experiment>/<arm>/lr=<rate>" for a point of a learning-rate
sweep. A record holds what was measured (its values, and the details its metric declares) beside what describes
the run (JOB_FIELDS and EXTENT_FIELDS: its folder, its config's fingerprint, how far it trained, how long it
took). The file keeps this format, and the order of its records and of their fields, so that no results
folder needs migrating and every report reads the same.
Only the driver of a suite writes the file, one record at a time under a lock (`Results.save_record`); the
command that ran it adds the paper's source under the same lock (`record_source`).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from .metrics import detail_keys
from .spec import is_ablated
from .sweeps import SharedRate

# what a job records of every run beside the metric's values and details (the file's names)
JOB_FIELDS = ("params", "seconds", "trained", "run", "config", "measured", "resumed_from")
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


@dataclass(frozen=True)
class Record:
    """One run's record: what the job wrote of it, where training ended, and what the metric measured.

    values: the measured quantities (None: never reached); details: what the metric writes beside them
    (Metric.details, e.g. the tokens it scored); order: the fields as the file had them, so that a file read
    and written back is unchanged.
    """

    run: str | None = None  # its folder, relative to its suite's (an older record: the run's name)
    fingerprint: str | None = None  # its config's (configs.fingerprint); None in records written by hand
    measured: list | None = None  # what its values depend on besides the model (plan.measurement_of)
    params: int | None = None
    seconds: float | None = None  # training and measurement, earlier attempts' included
    trained: bool | None = None  # False where the model came from another job
    resumed_from: int | None = None  # the checkpoint a run continued from after an interrupt
    extent: dict = field(default_factory=dict)  # EXTENT_FIELDS, where recorded
    values: dict[str, float | None] = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def from_json(cls, data, where: str = "a record") -> Record:
        """A record as results.json holds it (a flat object), or one line naming what is wrong with it."""
        if not isinstance(data, dict):
            raise UserError(f"{where} is not an object of named values ({type(data).__name__}); fix or remove it")
        details = detail_keys()
        own = {name: data.get(name) for name in JOB_FIELDS}
        values = {k: v for k, v in data.items() if k not in JOB_FIELDS + EXTENT_FIELDS and k not in details}
        for name, value in values.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise UserError(f"{where}: '{name}' is {value!r}, not a number; fix or remove the record (a metric "
                                "declares what it keeps beside its values in Metric.details)")
        own["fingerprint"] = own.pop("config")
        return cls(**own, extent={k: data[k] for k in EXTENT_FIELDS if k in data}, values=values,
                   details={k: v for k, v in data.items() if k in details}, order=tuple(data))

    def to_json(self) -> dict:
        """The flat object results.json holds, its fields in the order they were read."""
        own = {"params": self.params, **self.extent, **self.values, **self.details, "seconds": self.seconds,
               "trained": self.trained, "run": self.run, "config": self.fingerprint, "measured": self.measured,
               "resumed_from": self.resumed_from}
        flat = {k: v for k, v in own.items() if v is not None or k not in JOB_FIELDS or k in self.order}
        return {**{k: flat[k] for k in self.order if k in flat}, **flat}

    def replace(self, **fields) -> Record:
        """A copy with these fields changed (the order kept)."""
        return dataclasses.replace(self, **fields)

    @property
    def folder(self) -> str:
        """Where its model lies, relative to its suite's folder."""
        return self.run if "/" in self.run else f"runs/{self.run}"

    def ablated(self) -> bool:
        """Whether it holds a value measured with the mechanism's own component removed (spec.ablated)."""
        return any(is_ablated(key) for key in self.values)

    def stands(self, fingerprint: str, measurement: list, legacy: list | None, needs_ablation: bool) -> bool:
        """Whether this record is of the model of this fingerprint measured as `measurement` now measures it.

        legacy: what a record older than the `measured` field counts as (None: it must be measured again);
        needs_ablation: the value without the mechanism's component must be there.
        """
        measured = self.measured if "measured" in self.order or self.measured is not None else legacy
        if self.fingerprint != fingerprint or measured != measurement:
            return False
        return not needs_ablation or self.ablated()


class Results:
    """A suite's results.json in memory: its setting, meta and records by RunKey, in written order."""

    def __init__(self, data: dict):
        self.data = {**data, "runs": None}  # the records live in self.records; "runs" keeps its place in the file
        runs = data.get("runs", {})
        self.records = {RunKey.parse(k): Record.from_json(r, f"the record {k}") for k, r in runs.items()}

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
        try:
            return cls(data)
        except UserError as err:  # a record of the wrong shape, or a key that is not a run's
            raise UserError(f"{path}: {err}") from None

    def to_json(self) -> dict:
        runs = {str(key): record.to_json() for key, record in self.records.items()}
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
    def shared_rates(self) -> dict[str, SharedRate]:
        """Sweep experiment -> its shared-rate decision, recorded once made."""
        return {name: SharedRate.from_json(d) for name, d in self.data.get("shared_rates", {}).items()}

    @property
    def source(self) -> str | None:
        """What imports the suite's paper again (a module's name or a .py file's path); None: attnlab's own."""
        return self.data.get("source")

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

    def params(self, experiment: str, arm: str, sweeps: bool = False) -> int | None:
        """The arm's parameter count: its first record's that has one (None: no run yet)."""
        return next((r.params for r in self.of(experiment, arm, sweeps).values() if r.params is not None), None)

    def by_seed(self, experiment: str, arm: str, metric: str) -> dict[int, float | None]:
        """The arm's values of one measured quantity, by seed in increasing order (None: never reached)."""
        records = self.of(experiment, arm).items()
        return dict(sorted((k.seed, r.values[metric]) for k, r in records if metric in r.values))

    def without(self, keys) -> Results:
        """A copy without these records (superseded ones, say)."""
        kept = Results({**self.data, "runs": {}})  # the same setting and meta
        kept.records = {k: r for k, r in self.records.items() if k not in keys}
        return kept

    # writing
    def save_record(self, path: Path, key: RunKey, record: Record) -> None:
        """Adds one record, here and in the file at path, keeping the records another process (the same suite
        run with other --only experiments) has written there meanwhile; this takes those in too."""
        with _locked(path.parent):
            on_disk = Results.load(path).records if path.exists() else {}
            self.records = {**self.records, **on_disk, key: record}
            self.write(path)

    def save_shared_rates(self, path: Path, decided: dict[str, SharedRate]) -> None:
        """Adds shared-rate decisions, here and in the file at path, taking in the records and the decisions
        another process of the suite (other --only experiments) has written there meanwhile: a decision in the
        file is the newest of its experiment (every decision is saved at once), so it wins over this one's
        copy, and only the decisions given win over it."""
        with _locked(path.parent):
            on_disk = Results.load(path) if path.exists() else Results.empty()
            self.records = {**self.records, **on_disk.records}
            rates = {**self.shared_rates, **on_disk.shared_rates, **decided}
            self.data["shared_rates"] = {name: rate.to_json() for name, rate in rates.items()}
            self.write(path)

    def write(self, path: Path) -> None:
        """The whole file, atomically."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        os.replace(tmp, path)


def record_source(path: Path, source: str | None) -> None:
    """Records in the results.json at path where its suite's paper comes from (None, attnlab's own: nothing),
    keeping the records another process has written there meanwhile."""
    if source is None or not path.exists():
        return
    with _locked(path.parent):
        results = Results.load(path)
        if results.source != source:
            results.data["source"] = source
            results.write(path)


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
