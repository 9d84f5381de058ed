"""Boltzmann attention's cost: exact enumeration against banded inference (`attnlab bench --boltzmann`), its GPU
goal and its demo arm. It also brings the sliding-window forms that the bench and the doctor time beside every
mixer."""

from __future__ import annotations

from ...bench.registry import BenchCase, SpeedGoal, Variant
from ...lab.demo import DemoArm

# a form that runs at any length: banded inference over a sliding window of distance couplings
SLIDING = Variant("boltzmann (banded 4, window 64)", "boltzmann",
                  {"inference": "banded", "couplings": "distance", "window": 64, "band": 4})
VARIANTS = (
    SLIDING,
    # fields only over the same window: FlexAttention's case, whose fused backend the doctor compares with the
    # torch form
    Variant("boltzmann (h-only, window 64)", "boltzmann",
            {"mode": "h-only", "inference": "banded", "couplings": "distance", "window": 64, "band": 4}, timed=False),
)
SPEED_GOALS = (SpeedGoal(SLIDING.label, 2048, "<=", 8.0),)
# exact enumeration stops at short windows, so the demo's 64-token contexts use the mean-field marginals
DEMO_ARMS = (DemoArm("boltzmann", {"inference": "mean-field", "couplings": "distance", "window": 64},
                     note="Boltzmann attention runs with mean-field marginals and distance couplings here (exact "
                     "enumeration is for short windows)."),)

def bench_inference(exact_lengths=(8, 12, 16), banded_lengths=(256, 1024, 4096), exact_batch: int = 32,
                    banded_batch: int = 1, band: int = 8, window: int = 64, head_dim: int = 64, repeats: int = 1,
                    log=print) -> dict:
    """Forward+backward time of Boltzmann attention (one head) with exact enumeration, O(T 2^T) per query,
    and with banded distance couplings over a sliding window, O(window 2^band) per query; each growth
    factor is against the previous length."""
    from functools import partial

    import torch

    from ...bench.forms import backward_of
    from ...mixers import build_mixer
    from ...timing import round_robin

    settings = [("exact", T, exact_batch, {"window": max(exact_lengths)}) for T in exact_lengths]
    settings += [("banded", T, banded_batch, {"inference": "banded", "couplings": "distance", "band": band,
                                              "window": window}) for T in banded_lengths]
    log(f"Boltzmann attention, one head of {head_dim}, forward+backward, {torch.get_num_threads()} threads; "
        f"banded: band {band}, window {window}; median of {repeats}, the lengths in turn")
    tasks = {}
    for kind, T, batch, options in settings:
        torch.manual_seed(0)
        mixer = build_mixer("boltzmann", d_model=head_dim, n_heads=1, j_init_std=0.1, **options)
        x = torch.randn(batch, T, head_dim, requires_grad=True)
        tasks[kind, T, batch] = backward_of(partial(mixer, x))
    seconds = round_robin(tasks, repeats)
    results, previous = {}, {}
    for (kind, T, batch), sec in seconds.items():
        growth = ""
        if kind in previous:
            growth = f"x{sec / previous[kind][1]:.1f} for x{T / previous[kind][0]:.3g} the length"
        log(f"  {kind:<7} T={T:<5} batch {batch:<3} {sec:>9.3f} s  {growth}")
        previous[kind] = (T, sec)
        results[f"{kind} T={T}"] = sec
    return results


def linear_growth(timings: dict) -> list[tuple]:
    """Banded inference's time grows no faster than the length (within 12.5%) from the first to the last."""
    banded = {int(key[len("banded T="):]): s for key, s in timings.items() if key.startswith("banded")}
    if len(banded) < 2:
        return []
    first, last = min(banded), max(banded)
    return [(f"Boltzmann banded fwd+bwd, T={last} / T={first} (linear: {last / first:g})",
             banded[last] / banded[first], "<=", 1.125 * last / first)]


CASE = BenchCase(
    "boltzmann",
    "only Boltzmann attention: exact enumeration at T=8,12,16 and banded inference at T=256..4096",
    bench_inference,
    settings={"default": {"exact_lengths": [8, 12, 16], "banded_lengths": [1024, 4096], "repeats": 5},
              "quick": {"exact_lengths": [4], "banded_lengths": [32, 64], "exact_batch": 2, "head_dim": 8,
                        "window": 16}},
    goals=linear_growth,
)
