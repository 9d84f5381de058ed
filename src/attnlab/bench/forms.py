"""Op forms against their references and peers, and the two mechanisms whose cost
has its own shape: Boltzmann inference (exact enumeration, banded chains) and interdomain's chunked vs
FFT forms."""

from __future__ import annotations

import statistics
import warnings
from functools import partial

import torch

from ..mixers import build_mixer
from ..timing import paired_ratio, round_robin, round_robin_times


def _fla_references() -> dict:
    """flash-linear-attention's pure-PyTorch references, when the package imports ([B, T, H, D] layout)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule
            from fla.ops.gla.naive import naive_recurrent_gla
    except ImportError:
        return {}
    return {"gla": naive_recurrent_gla, "gdn": naive_chunk_gated_delta_rule}


def bench_ops(seq_len: int = 4096, batch: int = 2, heads: int = 4, head_dim: int = 64, d_model: int = 256,
              repeats: int = 3, mixer_repeats: int = 10, log=print) -> dict:
    """Forward+backward seconds of each op form against its loop reference and flash-linear-attention's
    references; the softmax mixer against bare causal SDPA; CCQ mixers against their backbones, over
    mixer_repeats rounds and as the median of the ratios within a round (their gap is a few tens of percent,
    which drift between rounds would swamp)."""
    B, H, T, D = batch, heads, seq_len, head_dim
    tasks, fla = _op_tasks(B, H, T, D)
    seconds = round_robin(tasks, repeats)
    x = torch.randn(B, T, d_model, requires_grad=True)
    mixers = {f"{name} mixer": _backward_of(partial(build_mixer(name, d_model=d_model, n_heads=heads), x))
              for name in ("softmax", "gla", "ccq-gla", "gdn", "ccq-gdn")}
    mixer_times = round_robin_times(mixers, mixer_repeats)
    seconds |= {name: statistics.median(times) for name, times in mixer_times.items()}

    log(f"forward+backward, B={B} H={H} T={T} head dim {D} (mixers: d_model {d_model}, with their projections), "
        f"{torch.get_num_threads()} threads, median of {repeats} (mixers {mixer_repeats}), round-robin")
    for name, sec in seconds.items():
        log(f"  {name:<26} {1e3 * sec:>10.1f} ms")
    ratios = {
        "gla reference / chunk": seconds["gla reference"] / seconds["gla chunk"],
        "gdn reference / chunk": seconds["gdn reference"] / seconds["gdn chunk"],
        "ccq-gla / gla mixer": paired_ratio(mixer_times, "ccq-gla mixer", "gla mixer"),
        "ccq-gdn / gdn mixer": paired_ratio(mixer_times, "ccq-gdn mixer", "gdn mixer"),
        "softmax mixer / bare sdpa": seconds["softmax mixer"] / seconds["sdpa (causal)"],
    }
    if fla:
        ratios["fla naive_recurrent_gla / our gla chunk"] = seconds["gla fla naive_recurrent"] / seconds["gla chunk"]
        ratios["fla naive_chunk_gated_delta_rule / our gdn chunk"] = (seconds["gdn fla naive_chunk"]
                                                                      / seconds["gdn chunk"])
    else:
        log("  (flash-linear-attention is not installed: its references are not measured)")
    for name, ratio in ratios.items():
        log(f"  {name:<50} {ratio:>6.2f}x")
    return {"seconds": seconds, "ratios": ratios}


def _backward_of(fn):
    return lambda: fn()[0].sum().backward()


def _op_tasks(B: int, H: int, T: int, D: int) -> tuple[dict, dict]:
    """Forward+backward of the chunk forms, their loop references, fla's references (when installed) and bare
    causal SDPA on random inputs of one shape; and fla's references found."""
    from ..ops.delta_rule import delta_rule_chunk, delta_rule_reference
    from ..ops.gla import gla_chunk, gla_reference

    gen = torch.Generator().manual_seed(0)

    def leaf(*shape, fn=lambda t: t):
        return fn(torch.randn(*shape, generator=gen)).requires_grad_()

    q, v = leaf(B, H, T, D), leaf(B, H, T, D)
    k = leaf(B, H, T, D, fn=lambda t: torch.nn.functional.normalize(t, dim=-1))
    g_gla = leaf(B, H, T, D, fn=lambda t: torch.nn.functional.logsigmoid(t) / 16)
    g_gdn = leaf(B, H, T, fn=lambda t: torch.nn.functional.logsigmoid(t + 3))
    beta = leaf(B, H, T, fn=torch.sigmoid)

    def fla_layout(*xs):
        return [x.transpose(1, 2) for x in xs]

    tasks = {
        "gla chunk": _backward_of(lambda: gla_chunk(q, k, v, g_gla)),
        "gla reference": _backward_of(lambda: gla_reference(q, k, v, g_gla)),
        "gdn chunk": _backward_of(lambda: delta_rule_chunk(q, k, v, g_gdn, beta)),
        "gdn reference": _backward_of(lambda: delta_rule_reference(q, k, v, g_gdn, beta)),
    }
    fla = _fla_references()
    if fla:
        tasks["gla fla naive_recurrent"] = _backward_of(lambda: fla["gla"](*fla_layout(q, k, v, g_gla)))
        tasks["gdn fla naive_chunk"] = _backward_of(lambda: fla["gdn"](*fla_layout(q, k, v), g=g_gdn.transpose(1, 2),
                                                                         beta=beta.transpose(1, 2)))
    tasks["sdpa (causal)"] = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True
                                                                                       ).sum().backward()
    return tasks, fla


def bench_boltzmann(exact_lengths=(8, 12, 16), banded_lengths=(256, 1024, 4096), exact_batch: int = 32,
                    banded_batch: int = 1, band: int = 8, window: int = 64, head_dim: int = 64, repeats: int = 1,
                    log=print) -> dict:
    """Forward+backward time of Boltzmann attention (one head) with exact enumeration, O(T 2^T) per query,
    and with banded distance couplings over a sliding window, O(window 2^band) per query; each growth
    factor is against the previous length."""
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
        tasks[kind, T, batch] = _backward_of(partial(mixer, x))
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


def bench_interdomain(lengths=(1024, 4096, 16384), head_dim: int = 64, modes: int = 64,
                      forms=("chunk", "fft", "decode"), log=print) -> dict:
    """One head of interdomain attention: forward+backward time and peak memory of the chunked and the
    FFT forms, and decode latency per token after a prefill of each length. Each measurement runs in a
    fresh process so that its peak resident memory is its own (reported above an idle process's)."""
    import subprocess
    import sys

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
            results[(form, T)] = (seconds, rss)
            what = "decode per token" if form == "decode" else f"{form} fwd+bwd"
            if error:
                log(f"  T={T:<6} {what:<18} failed: {error}")
            else:
                log(f"  T={T:<6} {what:<18} {1e3 * seconds:>10.2f} ms   {rss - idle_mib:>8.0f} MiB")
    return results
