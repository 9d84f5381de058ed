"""A run's training time predicted on a GPU that `attnlab doctor` measured, from its report (doctor.json).

Small models train launch-bound on a GPU: a step costs about as many kernel launches as it issues, whatever its
width. The doctor measures what this prediction is built from, on the GPU itself:
- the demo model's training (a 4-layer softmax decoder at d_model 128, 16 x 128 characters): its steady step
  (the tokens/s of its last logged steps), from which what a step costs besides its mixers comes, in proportion
  to the layers; and the rest of its time, the start-up every run pays once (set-up, the final evaluation);
- each mixer's layer forward+backward at the doctor's size (batch 8, d_model 512, bf16) at two lengths. Through
  the two points goes a line t(T) = a + b T: a, the fixed cost of the layer's launches; b T, its work, taken in
  proportion to the run's batch x d_model against the doctor's. A layer that grows faster than linearly (a
  negative intercept) gets the line through the origin and its shorter point instead, an upper bound below it;
- the demo model again under train.compile: what compiling costs a run before its steps (compile warm-up). A
  report without that section takes ASSUMED_WARMUP instead, and says so;
- the demo model in 1, 4 and 16 processes at once (the packing section): how much slower each of k runs sharing
  the GPU is than one alone. A report without it gives from start to end as a range: every run at its speed
  alone (packing costs nothing) to one after another (packing gains nothing).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError

# the doctor's timed size (doctor.SIZES["gpu"]) and its demo model's (the "demo" preset)
DOCTOR_BATCH, DOCTOR_WIDTH = 8, 512
DEMO_LAYERS, DEMO_BATCH, DEMO_WIDTH, DEMO_LENGTH = 4, 16, 128, 128
# Seconds a compiled run spends compiling, where the doctor's report does not say: about a minute, what a run's
# compilation took on this repository's CPUs (papers/recall.py); a GPU's Triton kernels may take longer.
ASSUMED_WARMUP = 60.0


@dataclass(frozen=True)
class Line:
    """A mixer layer's forward+backward in seconds: fixed + per_token x T at the doctor's batch x width."""

    fixed: float
    per_token: float

    @classmethod
    def through(cls, points: dict[int, float]) -> Line:
        (t1, s1), (t2, s2) = min(points.items()), max(points.items())
        slope = (s2 - s1) / (t2 - t1)
        fixed = s1 - slope * t1
        return cls(fixed, slope) if fixed >= 0 else cls(0.0, s1 / t1)

    def seconds(self, length: int, batch: int, width: int) -> float:
        return self.fixed + self.per_token * length * batch * width / (DOCTOR_BATCH * DOCTOR_WIDTH)


@dataclass(frozen=True)
class DeviceTimes:
    device: str
    source: str  # the report it was read from
    demo_step: float  # seconds per step of the doctor's demo training, at its steady speed
    start_up: float  # seconds of the demo's training besides its steps: what every run pays once
    layers: dict[str, Line]  # mixer name -> its layer's line
    packing: dict[int, float]  # runs at once -> each one's speed against one alone (empty: not measured)
    warmup: float | None  # seconds a compiled run spends compiling (None: not measured)
    unmeasured: dict[str, str]  # "packing" / "compile" -> why the report has no such measurement

    @classmethod
    def load(cls, path: str | Path) -> DeviceTimes:
        """A committed doctor report's timings; one line naming what is missing where it cannot predict."""
        try:
            report = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise UserError(f"--predict-on {path}: not a readable doctor.json ({err}); give the doctor.json that "
                            "`attnlab doctor` wrote on the GPU") from None
        env, train, speed = report.get("environment", {}), report.get("train"), report.get("speed", {})
        if not env.get("cuda") or not train or len(speed) < 2:
            raise UserError(f"--predict-on {path}: the report holds no GPU's demo training and mixer timings at two "
                            "lengths; give a doctor.json written on a GPU (not a dry run)")
        layers: dict[str, dict[int, float]] = {}
        for length, rows in speed.items():
            for label, row in rows.items():
                layers.setdefault(label, {})[int(length)] = row["ms"] / 1e3
        packing, unmeasured = _packing(report.get("packing"), path), {}
        warmup = _number(report.get("compile"), "warmup_s", path)
        for section, measured in (("packing", packing), ("compile", warmup is not None)):
            if not measured:
                failed = (report.get(section) or {}).get("error")
                unmeasured[section] = (f"the doctor's {section} section failed: {failed[:120]}" if failed else
                                       f"the report has no {section} section")
        return cls(env.get("gpu", "GPU"), str(path), *_demo(train),
                   {label: Line.through(points) for label, points in layers.items() if len(points) >= 2}, packing,
                   warmup, unmeasured)

    def step_seconds(self, cfg) -> float | None:
        """A training step of cfg's run (every micro-batch of it), None where a layer's mixer was not timed."""
        mixers = cfg.model.layer_mixers()
        if any(m not in self.layers for m in mixers):
            return None
        demo_mixers = DEMO_LAYERS * self.layers["softmax"].seconds(DEMO_LENGTH, DEMO_BATCH, DEMO_WIDTH)
        rest_per_layer = max(0.0, self.demo_step - demo_mixers) / DEMO_LAYERS
        t = cfg.train
        micro = max(1, t.batch_size // t.grad_accum)
        layer = sum(self.layers[m].seconds(t.seq_len, micro, cfg.model.d_model) for m in mixers)
        return (layer + rest_per_layer * len(mixers)) * t.grad_accum

    def run_parts(self, cfg) -> tuple[float, float] | None:
        """cfg's run alone on the GPU: (its seconds before its steps, start-up and compile warm-up where it
        compiles; its steps' seconds), None where a layer's mixer was not timed."""
        step = self.step_seconds(cfg)
        if step is None:
            return None
        return self.start_up + (self.compile_warmup if cfg.train.compile else 0.0), step * cfg.train.steps

    @property
    def compile_warmup(self) -> float:
        return ASSUMED_WARMUP if self.warmup is None else self.warmup

    def slowdown(self, at_once: int) -> float:
        """How much slower each of at_once runs on the GPU is than one alone, as the packing section measured it
        (the nearest measured count at or above, else the largest); only where it was measured."""
        if at_once <= 1:
            return 1.0
        counts = sorted(self.packing)
        k = next((c for c in counts if c >= at_once), counts[-1])
        return 1 / self.packing[k]

    def walls(self, groups: list[tuple[list[tuple[float, float]], int]]) -> tuple[float, float]:
        """From start to end for groups of (each job's run_parts, in plan order; the workers that run them), all on
        this GPU at once: (least, most). One number twice where packing was measured; else every run at its speed
        alone, and one after another."""
        if self.packing:
            wall = packed_wall(groups, self.slowdown)
            return wall, wall
        return packed_wall(groups, lambda n: 1.0), packed_wall(groups, lambda n: float(n))

    def assumptions(self) -> list[str]:
        """What the prediction takes as measured, and what it assumes, one item each."""
        warmup = (f"{self.compile_warmup:.0f} s measured (the doctor's compiled demo)" if self.warmup is not None
                  else f"{self.compile_warmup:.0f} s ASSUMED, unmeasured ({self.unmeasured['compile']})")
        if self.packing:
            shares = ", ".join(f"{k} at once each at {share:.2f}" for k, share in sorted(self.packing.items()))
            packing = (f"runs stepping at once: as the doctor's packing section measured the demo model ({shares} "
                       "of its speed alone; a count between takes the next one measured above it)")
        else:
            packing = (f"runs stepping at once: packing UNMEASURED ({self.unmeasured['packing']}), so from start to "
                       "end is a range: every run at its speed alone (packing costs nothing) to their steps one "
                       "after another (packing gains nothing)")
        return [f"solo speed: each step from the doctor's timings on {self.device} ({self.source}: the demo model's "
                "steady step, each mixer layer's forward+backward at two lengths), timed uncompiled",
                f"before its steps, each run: {self.start_up:.1f} s of start-up (measured: the demo's set-up and "
                f"evaluation), and where it compiles, compile warm-up: {warmup}; on the CPU, a core per run, "
                "whatever the GPU's sharing", packing]


def _demo(train: dict) -> tuple[float, float]:
    """(the demo's steady step, its start-up) in seconds: its last logged steps' speed, and the rest of its time.
    A report without that speed spreads the start-up over the steps."""
    rate = train.get("tokens_per_s")
    if not rate:
        return train["seconds"] / train["steps"], 0.0
    step = DEMO_BATCH * DEMO_LENGTH / rate
    return step, max(0.0, train["seconds"] - train["steps"] * step)


def _packing(section: dict | None, path) -> dict[int, float]:
    """The packing section as {runs at once: each one's speed against one alone}; {} where it is absent or
    failed. A row that is not a count with its positive x_one is one line naming it."""
    if not section or "error" in section:
        return {}
    if not isinstance(section, dict):
        raise UserError(f"--predict-on {path}: packing is {section!r}, not the doctor's rows of runs at once; give "
                        "the packing section `attnlab doctor` wrote, or remove it")
    shares = {}
    for count, row in section.items():
        x_one = _number(row, "x_one", path, f"packing[{count!r}]")
        if not str(count).isdigit() or int(count) < 1 or x_one is None or x_one <= 0:
            raise UserError(f"--predict-on {path}: packing[{count!r}] is not a count of runs at once with a positive "
                            "x_one (their summed speed against one alone); give the packing section `attnlab doctor` "
                            "wrote, or remove it")
        shares[int(count)] = x_one / int(count)
    return shares


def _number(section, key: str, path, where: str | None = None) -> float | None:
    """section[key] as a number of zero or more; None where the section is absent or failed (holds "error")."""
    if section is None or (isinstance(section, dict) and "error" in section):
        return None
    where = where or f"compile[{key!r}]"
    value = section.get(key) if isinstance(section, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise UserError(f"--predict-on {path}: {where} is {value!r}, not a number of 0 or more; give the section "
                        "`attnlab doctor` wrote, or remove it")
    return float(value)


def packed_wall(groups: list[tuple[list[tuple[float, float]], int]], slowdown: Callable[[int], float]) -> float:
    """From start to end when each group's jobs, in order, go to whichever of its workers is free first. A job is
    (seconds before its steps, its steps' seconds alone): the first part on the CPU at its own speed (a core each,
    sharing nothing), the second on the GPU, slowdown(runs stepping on it now) times slower than alone: slowdown 1
    keeps each at its speed alone, slowdown n shares the GPU evenly (the steps one after another)."""
    queues = [list(jobs) for jobs, _ in groups]
    free = [max(1, workers) for _, workers in groups]
    running: list[list] = []  # [seconds before its steps left, seconds of steps alone left, group]
    now = 0.0
    while True:
        for group, queue in enumerate(queues):
            while free[group] and queue:
                running.append([*queue.pop(0), group])
                free[group] -= 1
        if not running:
            return now
        share = slowdown(max(1, sum(run[0] <= 0 for run in running)))
        wait = min(run[0] if run[0] > 0 else run[1] * share for run in running)  # until the next run changes part
        now += wait
        for run in running:
            if run[0] > 0:
                run[0] -= wait
            else:
                run[1] -= wait / share
        for *_, group in [run for run in running if run[0] <= 0 and run[1] <= 1e-9]:
            free[group] += 1
        running = [run for run in running if run[0] > 0 or run[1] > 1e-9]
