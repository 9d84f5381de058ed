"""Every mixer alone: forward and forward+backward time against the sequence length (with matmul
GFLOP/s, activation memory and state size), and decode latency per token against the context length."""

from __future__ import annotations

from functools import partial

import torch

from ..errors import UserError
from ..mixers import build_mixer, list_mixers
from .timing import count_flops, round_robin, saved_bytes

# a Boltzmann variant that runs at any length: banded inference over a sliding window of distance couplings
SLIDING_BOLTZMANN = ("boltzmann (banded 4, window 64)", "boltzmann",
                     {"inference": "banded", "couplings": "distance", "window": 64, "band": 4})


def contenders() -> list[tuple[str, str, dict]]:
    """(label, mixer, options): every registered mixer with its defaults, softmax first, and the
    sliding-window Boltzmann variant."""
    names = sorted(list_mixers(), key=lambda n: (n != "softmax", n))
    return [(name, name, {}) for name in names] + [SLIDING_BOLTZMANN]


def _build(name: str, options: dict, d_model: int, n_heads: int):
    torch.manual_seed(0)
    return build_mixer(name, d_model=d_model, n_heads=n_heads, **options)


def bench_mixers(lengths=(256, 1024, 4096), batch: int = 1, d_model: int = 256, n_heads: int = 4,
                 repeats: int = 3, peak_gflops: float | None = None, log=print) -> list[dict]:
    """Rows of {mixer, seq_len, forward_ms, fwd_bwd_ms, x_softmax, gflops, peak_fraction, activation_mib,
    state_kib}; a mixer that refuses a length (Boltzmann's exact window) is reported and skipped."""
    log(f"mixers alone: batch {batch}, d_model {d_model}, {n_heads} heads, fp32, {torch.get_num_threads()} threads, "
        f"median of {repeats}; GFLOP/s counts matrix products only")
    log(f"{'mixer':<30} {'T':>6} {'fwd ms':>9} {'fwd+bwd ms':>11} {'x softmax':>10} {'GFLOP/s':>8} "
        f"{'of peak':>8} {'activ. MiB':>11} {'state KiB':>10}")
    rows = []
    for seq_len in lengths:
        x = torch.randn(batch, seq_len, d_model, requires_grad=True)
        tasks, info = {}, {}
        for label, name, options in contenders():
            mixer = _build(name, options, d_model, n_heads)
            try:
                activation = saved_bytes(lambda mixer=mixer, x=x: mixer(x))
            except UserError as err:  # e.g. exact Boltzmann inference past its window
                log(f"{label:<30} {seq_len:>6}  not run: {str(err).split(';')[0]}")
                continue

            def forward(mixer=mixer, x=x):
                with torch.no_grad():
                    mixer(x)

            def fwd_bwd(mixer=mixer, x=x):
                mixer(x)[0].sum().backward()

            tasks[label, "forward"], tasks[label, "fwd_bwd"] = forward, fwd_bwd
            info[label] = {"flops": count_flops(fwd_bwd), "activation_mib": activation / 2**20,
                           "state_kib": mixer.state_size(seq_len) * 4 / 1024}
        seconds = round_robin(tasks, repeats)
        base = seconds.get(("softmax", "fwd_bwd"))
        for label, extra in info.items():
            fwd_bwd = seconds[label, "fwd_bwd"]
            gflops = extra["flops"] / fwd_bwd / 1e9
            row = {"mixer": label, "seq_len": seq_len, "forward_ms": 1e3 * seconds[label, "forward"],
                   "fwd_bwd_ms": 1e3 * fwd_bwd, "x_softmax": fwd_bwd / base if base else None, "gflops": gflops,
                   "peak_fraction": gflops / peak_gflops if peak_gflops else None,
                   "activation_mib": extra["activation_mib"], "state_kib": extra["state_kib"]}
            rows.append(row)
            ratio = f"{row['x_softmax']:>10.2f}" if base else f"{'':>10}"
            peak = f"{100 * row['peak_fraction']:>7.1f}%" if peak_gflops else f"{'':>8}"
            log(f"{label:<30} {seq_len:>6} {row['forward_ms']:>9.2f} {row['fwd_bwd_ms']:>11.2f} {ratio} "
                f"{gflops:>8.1f} {peak} {row['activation_mib']:>11.1f} {row['state_kib']:>10.0f}")
    return rows


def bench_decode(contexts=(1024, 4096, 16384), batch: int = 1, d_model: int = 256, n_heads: int = 4,
                 steps: int = 20, prefill_chunk: int = 1024, log=print) -> list[dict]:
    """Milliseconds per decoded token after a prefill of each context length (the prefill runs in pieces
    of prefill_chunk tokens through the mixer's own state). Rows of {mixer, context, decode_ms, state_kib}."""
    log(f"decode latency per token after a prefill: batch {batch}, d_model {d_model}, {n_heads} heads, "
        f"median of {steps} steps")
    log(f"{'mixer':<30} " + " ".join(f"{f'{c} ms':>10}" for c in contexts) + f" {'last/first':>11}")
    rows = []
    for label, name, options in contenders():
        mixer = _build(name, options, d_model, n_heads)
        generator = torch.Generator().manual_seed(0)
        latencies, reason = [], ""
        for context in contexts:
            try:
                with torch.no_grad():
                    state = None
                    for start in range(0, context, prefill_chunk):
                        piece = torch.randn(batch, min(prefill_chunk, context - start), d_model, generator=generator)
                        _, state = mixer(piece, state)
                    token = torch.randn(batch, 1, d_model, generator=generator)
                    step = partial(mixer, token, state)
                    seconds = round_robin({"step": step}, steps)["step"]
            except UserError as err:
                reason = str(err).split(";")[0]
                break
            latencies.append(1e3 * seconds)
            rows.append({"mixer": label, "context": context, "decode_ms": 1e3 * seconds,
                         "state_kib": mixer.state_size(context) * 4 / 1024})
        cells = " ".join(f"{ms:>10.3f}" for ms in latencies)
        growth = f"{latencies[-1] / latencies[0]:>11.2f}" if len(latencies) == len(contexts) else ""
        log(f"{label:<30} {cells} {growth}" + (f"  not run past that: {reason}" if reason else ""))
    return rows
