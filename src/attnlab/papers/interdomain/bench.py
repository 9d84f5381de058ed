"""Interdomain attention's cost: its chunked against its FFT form, and decode latency (`attnlab bench
--interdomain`). It also brings its GPU goal and its demo arm (and its S4D ablation's)."""

from __future__ import annotations

from ...bench.registry import BenchCase, SpeedGoal
from ...lab.demo import DemoArm

SPEED_GOALS = (SpeedGoal("interdomain", 2048, "<=", 2.0),)
DEMO_ARMS = (DemoArm("interdomain", {"modes": 16}), DemoArm("s4d", {"modes": 16}))

# one measurement in a fresh process, so that its peak resident memory is its own
_INTERDOMAIN_RUN = """
import resource, sys, time, torch
from attnlab.mixers import build_mixer
form, T, head_dim, modes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
mixer = build_mixer("interdomain", d_model=head_dim, n_heads=1, modes=modes, form="chunk" if form == "decode" else form)
x = torch.randn(1, T, head_dim, requires_grad=True)
if form == "decode":
    with torch.no_grad():
        _, state = mixer(x)
        token = x[:, -1:]
        mixer(token, state)
        start = time.perf_counter()
        for _ in range(50):
            mixer(token, state)
        seconds = (time.perf_counter() - start) / 50
else:
    start = time.perf_counter()
    mixer(x)[0].sum().backward()
    seconds = time.perf_counter() - start
print(seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def bench_forms(lengths=(1024, 4096, 16384), head_dim: int = 64, modes: int = 64,
                forms=("chunk", "fft", "decode"), log=print) -> dict:
    """One head of interdomain attention: forward+backward time and peak memory of the chunked and the
    FFT forms, and decode latency per token after a prefill of each length. Each measurement runs in a
    fresh process so that its peak resident memory is its own (reported above an idle process's)."""
    import subprocess
    import sys

    import torch

    def run(form, T):
        out = subprocess.run([sys.executable, "-c", _INTERDOMAIN_RUN, form, str(T), str(head_dim), str(modes)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            return None, None, out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
        seconds, rss_kib = out.stdout.split()
        return float(seconds), int(rss_kib) / 1024, None

    idle = subprocess.run([sys.executable, "-c", "import resource, torch, attnlab.mixers; "
                           "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"], capture_output=True, text=True)
    idle_mib = int(idle.stdout) / 1024
    log(f"interdomain, one head (d_h {head_dim}, M {modes}), batch 1, {torch.get_num_threads()} threads; "
        f"memory = peak resident set above an idle process ({idle_mib:.0f} MiB)")
    results = {}
    for T in lengths:
        for form in forms:
            seconds, rss, error = run(form, T)
            results[f"{form} T={T}"] = {"seconds": seconds, "rss_mib": rss}
            what = "decode per token" if form == "decode" else f"{form} fwd+bwd"
            if error:
                log(f"  T={T:<6} {what:<18} failed: {error}")
            else:
                log(f"  T={T:<6} {what:<18} {1e3 * seconds:>10.2f} ms   {rss - idle_mib:>8.0f} MiB")
    return results


CASE = BenchCase(
    "interdomain",
    "only interdomain's chunked vs FFT form at T=1K..16K (time, memory) and decode latency",
    bench_forms,
)
