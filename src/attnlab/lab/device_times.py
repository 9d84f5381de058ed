"""A run's training time predicted on a GPU that `attnlab doctor` measured, from its report (doctor.json).

Small models train launch-bound on a GPU: a step costs about as many kernel launches as it issues, whatever its
width. The doctor measures two things this prediction is built from, on the GPU itself:
- the demo model's training step (a 4-layer softmax decoder at d_model 128, 16 x 128 characters), evaluation and
  start-up included: what a step costs besides its mixers comes from it, in proportion to the layers;
- each mixer's layer forward+backward at the doctor's size (batch 8, d_model 512, bf16) at two lengths. Through
  the two points goes a line t(T) = a + b T: a, the fixed cost of the layer's launches; b T, its work, taken in
  proportion to the run's batch x d_model against the doctor's. A layer that grows faster than linearly (a
  negative intercept) gets the line through the origin and its shorter point instead, an upper bound below it.
Where the report has the doctor's packing section (the demo model in k processes at once), k runs at once each
run at its measured share; without it each is taken to keep its speed alone, which a launch-bound step allows
while every run has a CPU core of its own to launch from (said with the prediction).
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError

# the doctor's timed size (doctor.SIZES["gpu"]) and its demo model's (the "demo" preset)
DOCTOR_BATCH, DOCTOR_WIDTH = 8, 512
DEMO_LAYERS, DEMO_BATCH, DEMO_WIDTH, DEMO_LENGTH = 4, 16, 128, 128


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
    demo_step: float  # seconds per step of the doctor's demo training, everything included
    layers: dict[str, Line]  # mixer name -> its layer's line
    packing: dict[int, float]  # runs at once -> each one's speed against one alone (empty: not measured)

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
        packing = {int(k): row["x_one"] / int(k) for k, row in report.get("packing", {}).items()}
        return cls(env.get("gpu", "GPU"), str(path), train["seconds"] / train["steps"],
                   {label: Line.through(points) for label, points in layers.items() if len(points) >= 2}, packing)

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

    def slowdown(self, at_once: int) -> float:
        """How much slower each of at_once runs on the GPU is than one alone (1 where packing was not measured;
        the nearest measured count at or above, else the largest)."""
        if not self.packing or at_once <= 1:
            return 1.0
        counts = sorted(self.packing)
        k = next((c for c in counts if c >= at_once), counts[-1])
        return 1 / self.packing[k]

    def assumption(self) -> str:
        if self.packing:
            return f"runs at once slowed as the doctor's packing section measured ({self.source})"
        return ("runs at once each at its speed alone: a launch-bound step while every run has a CPU core of its "
                "own (not measured: the report has no packing section)")


def wall_seconds(durations: list[float], workers: int) -> float:
    """From start to end when the jobs, in this order, go to whichever of the workers is free first."""
    free = [0.0] * max(1, workers)
    for seconds in durations:
        heapq.heappush(free, heapq.heappop(free) + seconds)
    return max(free)
