"""CCQ's cost: each CCQ mixer against its backbone (`attnlab bench --ccq`); the GPU goals and demo arms of both."""

from __future__ import annotations

from ...bench.registry import BenchCase, SpeedGoal
from ...lab.demo import DemoArm

PAIRS = [("gla", "ccq-gla"), ("gdn", "ccq-gdn")]  # each backbone and its CCQ variant
MIXERS = [name for pair in PAIRS for name in pair]
# on a GPU, fused: no slower than 1.5x softmax at 2K tokens, and faster from 8K on
SPEED_GOALS = tuple(goal for name in MIXERS for goal in (SpeedGoal(name, 2048, "<=", 1.5),
                                                         SpeedGoal(name, 8192, "<", 1.0)))
DEMO_ARMS = tuple(DemoArm(name) for name in MIXERS)
OVERHEAD = 1.3  # the curvature correction's forward+backward cost on top of its backbone, at most


def bench_backbones(seq_len: int = 4096, batch: int = 2, heads: int = 4, d_model: int = 256, repeats: int = 10,
                    log=print) -> dict:
    """Forward+backward seconds of each CCQ mixer and its backbone, over `repeats` rounds, and their ratio as the
    median of the ratios within a round (the gap is a few tens of percent, which drift between rounds would
    swamp)."""
    import statistics
    from functools import partial

    import torch

    from ...bench.forms import backward_of
    from ...mixers import build_mixer
    from ...timing import paired_ratio, round_robin_times

    x = torch.randn(batch, seq_len, d_model, requires_grad=True)
    mixers = {name: backward_of(partial(build_mixer(name, d_model=d_model, n_heads=heads), x))
              for pair in PAIRS for name in pair}
    times = round_robin_times(mixers, repeats)
    log(f"CCQ mixers against their backbones, forward+backward, B={batch} T={seq_len} d_model {d_model} "
        f"{heads} heads, {torch.get_num_threads()} threads, {repeats} rounds")
    seconds = {name: statistics.median(runs) for name, runs in times.items()}
    ratios = {f"{ccq} / {backbone}": paired_ratio(times, ccq, backbone) for backbone, ccq in PAIRS}
    for name, sec in seconds.items():
        log(f"  {name:<10} {1e3 * sec:>10.1f} ms")
    for name, ratio in ratios.items():
        log(f"  {name:<16} {ratio:>6.2f}x")
    return {"seconds": seconds, "ratios": ratios}


def overhead(timings: dict) -> list[tuple]:
    return [(f"{name.upper()} mixer fwd+bwd (x)", ratio, "<=", OVERHEAD) for name, ratio in timings["ratios"].items()]


CASE = BenchCase(
    "ccq",
    "only the CCQ mixers against their backbones (GLA, gated delta rule), forward+backward at T=4096",
    bench_backbones,
    settings={"default": {"seq_len": 4096, "repeats": 10},
              "quick": {"seq_len": 32, "heads": 2, "d_model": 16, "repeats": 1}},
    goals=overhead,
)
