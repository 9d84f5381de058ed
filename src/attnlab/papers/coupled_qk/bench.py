"""Coupled QK's cost: its training step against softmax's (`attnlab bench --coupled-qk`), and the demo arms. The
demo arms are its own and differential attention's, its peer in the paper's table."""

from __future__ import annotations

from ...bench.registry import BenchCase
from ...lab.demo import DemoArm

DEMO_ARMS = (DemoArm("coupled-qk"), DemoArm("differential"))
OVERHEAD = 1.2  # the coupling's cost per training step on top of softmax's, at most


def training_step(preset: str = "coupled-qk-char", repeats: int = 10, overrides=(), log=print) -> dict:
    """Seconds per training step of the preset's model with coupled QK and with softmax, side by side."""
    from ...bench.models import bench_training_step

    return bench_training_step(preset, ["coupled-qk"], repeats, overrides, log=log)


def overhead(timings: dict) -> list[tuple]:
    return [("coupled-qk / softmax training step (x)", timings["coupled-qk"]["x_softmax"], "<=", OVERHEAD)]


CASE = BenchCase(
    "coupled-qk",
    "only training steps of coupled QK against softmax (the coupled-qk-char preset)",
    training_step,
    settings={"default": {"repeats": 5},
              "quick": {"repeats": 1, "overrides": ["model.d_model=32", "model.n_layers=1", "model.n_heads=2",
                                                    "train.batch_size=2", "train.seq_len=32"]}},
    goals=overhead,
)
