"""``attnlab bench``: speed measured side by side in one run.

Three views: every registered mixer alone (forward, forward+backward and one decode step vs sequence
length); whole training steps of a preset model with its mixer swapped (``--model``); and the forms of
the linear-attention ops against their loop-over-time references, flash-linear-attention's pure-PyTorch
references when installed, and CCQ's cost over its backbone (``--ops``). Timings are medians over
repeats, taken round-robin across the contenders so that drift in the machine's speed hits all of
them alike; every ratio compares numbers measured in the same run.
"""

from __future__ import annotations

import statistics
import time
import warnings

import torch

from .config import load_config
from .errors import UserError
from .mixers import build_mixer, list_mixers
from .model import Decoder


def _softmax_first(names) -> list[str]:
    return sorted(names, key=lambda n: (n != "softmax", n))


def _round_robin(tasks: dict, repeats: int) -> dict:
    """Median seconds of each zero-argument callable, after one warm-up call each."""
    for fn in tasks.values():
        fn()
    times = {name: [] for name in tasks}
    for _ in range(repeats):
        for name, fn in tasks.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def mixer_tasks(name: str, seq_len: int, batch: int, d_model: int, n_heads: int) -> dict:
    torch.manual_seed(0)
    mixer = build_mixer(name, d_model=d_model, n_heads=n_heads)
    x = torch.randn(batch, seq_len, d_model, requires_grad=True)
    with torch.no_grad():
        _, state = mixer(x)
    token = x[:, -1:].detach()

    def forward():
        with torch.no_grad():
            mixer(x)

    def forward_backward():
        mixer(x)[0].sum().backward()

    def decode():
        with torch.no_grad():
            mixer(token, state)

    decode()  # fails here, with the mixer's own message, if the mixer cannot run at this length
    return {"forward": forward, "fwd_bwd": forward_backward, "decode": decode,
            "state_kib": mixer.state_size(seq_len) * 4 / 1024}


def bench_mixers(lengths=(256, 1024), batch: int = 2, d_model: int = 256, n_heads: int = 4, repeats: int = 5):
    print(f"mixers alone: batch {batch}, d_model {d_model}, {n_heads} heads, fp32, {torch.get_num_threads()} threads")
    print(f"{'mixer':<22} {'T':>6} {'fwd ms':>9} {'fwd+bwd ms':>11} {'x softmax':>10} "
          f"{'decode ms/token':>16} {'state KiB/seq':>14}")
    rows = []
    for seq_len in lengths:
        setups = {}
        for name in _softmax_first(list_mixers()):
            try:
                setups[name] = mixer_tasks(name, seq_len, batch, d_model, n_heads)
            except UserError as err:
                print(f"{name:<22} {seq_len:>6}  not run with its defaults: {str(err).split(';')[0]}")
        tasks = {(name, kind): s[kind] for name, s in setups.items() for kind in ("forward", "fwd_bwd", "decode")}
        t = _round_robin(tasks, repeats)
        for name, s in setups.items():
            ratio = t[name, "fwd_bwd"] / t["softmax", "fwd_bwd"]
            print(f"{name:<22} {seq_len:>6} {1e3 * t[name, 'forward']:>9.2f} {1e3 * t[name, 'fwd_bwd']:>11.2f} "
                  f"{ratio:>10.2f} {1e3 * t[name, 'decode']:>16.3f} {s['state_kib']:>14.0f}")
            rows.append({"mixer": name, "seq_len": seq_len, "fwd_bwd_x_softmax": ratio,
                         **{f"{k}_ms": 1e3 * t[name, k] for k in ("forward", "fwd_bwd", "decode")}})
    return rows


def bench_training_step(preset: str, mixers=None, repeats: int = 10, overrides=()) -> dict:
    """Milliseconds per AdamW training step of the preset's model with each mixer, and the ratio to softmax."""
    cfg = load_config(preset, list(overrides))
    cfg.model.vocab_size = cfg.model.vocab_size or 256
    t = cfg.train
    names = list_mixers() if mixers == ["all"] else (mixers or [cfg.model.mixer])
    names = _softmax_first(set(names) | {"softmax"})
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(cfg.model.vocab_size, (t.batch_size, t.seq_len + 1), generator=generator)
    tasks = {}
    for name in names:
        cfg.model.mixer, cfg.model.layers = name, None
        torch.manual_seed(0)
        model = Decoder(cfg.model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(model=model, optimizer=optimizer):
            model.loss(tokens[:, :-1], tokens[:, 1:]).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        tasks[name] = step
    seconds = _round_robin(tasks, repeats)
    print(f"training step of the {preset} model (batch {t.batch_size} x {t.seq_len} tokens, "
          f"{torch.get_num_threads()} threads, median of {repeats}, round-robin)")
    print(f"{'mixer':<22} {'ms/step':>9} {'tokens/s':>10} {'x softmax':>10}")
    for name in names:
        print(f"{name:<22} {1e3 * seconds[name]:>9.1f} {t.batch_size * t.seq_len / seconds[name]:>10,.0f} "
              f"{seconds[name] / seconds['softmax']:>10.2f}")
    return {name: {"ms": 1e3 * s, "x_softmax": s / seconds["softmax"]} for name, s in seconds.items()}


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
              repeats: int = 3) -> dict:
    """Forward+backward seconds of each op form, and CCQ mixers against their backbones."""
    from .ops.delta_rule import delta_rule_chunk, delta_rule_reference
    from .ops.gla import gla_chunk, gla_reference

    gen = torch.Generator().manual_seed(0)

    def leaf(*shape, fn=lambda t: t):
        return fn(torch.randn(*shape, generator=gen)).requires_grad_()

    B, H, T, D = batch, heads, seq_len, head_dim
    q, v = leaf(B, H, T, D), leaf(B, H, T, D)
    k = leaf(B, H, T, D, fn=lambda t: torch.nn.functional.normalize(t, dim=-1))
    g_gla = leaf(B, H, T, D, fn=lambda t: torch.nn.functional.logsigmoid(t) / 16)
    g_gdn = leaf(B, H, T, fn=lambda t: torch.nn.functional.logsigmoid(t + 3))
    beta = leaf(B, H, T, fn=torch.sigmoid)

    def backward_of(fn):
        return lambda: fn()[0].sum().backward()

    def fla_layout(*xs):
        return [x.transpose(1, 2) for x in xs]

    tasks = {
        "gla chunk": backward_of(lambda: gla_chunk(q, k, v, g_gla)),
        "gla reference": backward_of(lambda: gla_reference(q, k, v, g_gla)),
        "gdn chunk": backward_of(lambda: delta_rule_chunk(q, k, v, g_gdn, beta)),
        "gdn reference": backward_of(lambda: delta_rule_reference(q, k, v, g_gdn, beta)),
    }
    fla = _fla_references()
    if fla:
        tasks["gla fla naive_recurrent"] = backward_of(lambda: fla["gla"](*fla_layout(q, k, v, g_gla)))
        tasks["gdn fla naive_chunk"] = backward_of(lambda: fla["gdn"](*fla_layout(q, k, v), g=g_gdn.transpose(1, 2),
                                                                       beta=beta.transpose(1, 2)))
    x = torch.randn(B, T, d_model, requires_grad=True)
    for name in ("gla", "ccq-gla", "gdn", "ccq-gdn"):
        mixer = build_mixer(name, d_model=d_model, n_heads=heads)
        tasks[f"{name} mixer"] = backward_of(lambda mixer=mixer: mixer(x))
    seconds = _round_robin(tasks, repeats)

    print(f"forward+backward, B={B} H={H} T={T} head dim {D} (mixers: d_model {d_model}), "
          f"{torch.get_num_threads()} threads, median of {repeats}, round-robin")
    for name, sec in seconds.items():
        print(f"  {name:<26} {1e3 * sec:>10.1f} ms")
    ratios = {
        "gla reference / chunk": seconds["gla reference"] / seconds["gla chunk"],
        "gdn reference / chunk": seconds["gdn reference"] / seconds["gdn chunk"],
        "ccq-gla / gla mixer": seconds["ccq-gla mixer"] / seconds["gla mixer"],
        "ccq-gdn / gdn mixer": seconds["ccq-gdn mixer"] / seconds["gdn mixer"],
    }
    if fla:
        ratios["fla naive_recurrent_gla / our gla chunk"] = seconds["gla fla naive_recurrent"] / seconds["gla chunk"]
        ratios["fla naive_chunk_gated_delta_rule / our gdn chunk"] = (seconds["gdn fla naive_chunk"]
                                                                      / seconds["gdn chunk"])
    else:
        print("  (flash-linear-attention is not installed: its references are not measured)")
    for name, ratio in ratios.items():
        print(f"  {name:<50} {ratio:>6.2f}x")
    return {"seconds": seconds, "ratios": ratios}


def bench_boltzmann(exact_lengths=(8, 12, 16), banded_lengths=(256, 1024, 4096), exact_batch: int = 32,
                    banded_batch: int = 1, band: int = 8, head_dim: int = 64, repeats: int = 1) -> dict:
    """Forward+backward time of Boltzmann attention (one head) with exact enumeration, O(T 2^T) per query,
    and with banded couplings, O(T 2^band) per query; each growth factor is against the previous length."""
    results = {}
    settings = [("exact", T, exact_batch, {"window": max(exact_lengths)}) for T in exact_lengths]
    settings += [("banded", T, banded_batch, {"inference": "banded", "couplings": "distance", "band": band,
                                              "window": band + 1}) for T in banded_lengths]
    print(f"Boltzmann attention, one head of {head_dim}, forward+backward, {torch.get_num_threads()} threads")
    previous = {}
    for kind, T, batch, options in settings:
        torch.manual_seed(0)
        mixer = build_mixer("boltzmann", d_model=head_dim, n_heads=1, j_init_std=0.1, **options)
        x = torch.randn(batch, T, head_dim, requires_grad=True)
        seconds = _round_robin({kind: lambda mixer=mixer, x=x: mixer(x)[0].sum().backward()}, repeats)[kind]
        growth = ""
        if kind in previous:
            growth = f"x{seconds / previous[kind][1]:.1f} for x{T / previous[kind][0]:.3g} the length"
        print(f"  {kind:<7} T={T:<5} batch {batch:<3} {seconds:>9.3f} s  {growth}")
        previous[kind] = (T, seconds)
        results[f"{kind} T={T}"] = seconds
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
                      forms=("chunk", "fft", "decode")) -> dict:
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
    print(f"interdomain, one head (d_h {head_dim}, M {modes}), batch 1, {torch.get_num_threads()} threads; "
          f"memory = peak resident set above an idle process ({idle_mib:.0f} MiB)")
    results = {}
    for T in lengths:
        for form in forms:
            seconds, rss, error = run(form, T)
            results[(form, T)] = (seconds, rss)
            what = "decode per token" if form == "decode" else f"{form} fwd+bwd"
            if error:
                print(f"  T={T:<6} {what:<18} failed: {error}")
            else:
                print(f"  T={T:<6} {what:<18} {1e3 * seconds:>10.2f} ms   {rss - idle_mib:>8.0f} MiB")
    return results
