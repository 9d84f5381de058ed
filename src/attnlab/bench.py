"""``attnlab bench``: forward and forward+backward time of every mixer vs sequence length, and decode
latency per token, measured side by side in one run."""

from __future__ import annotations

import statistics
import time

import torch

from .mixers import build_mixer, list_mixers


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_mixer(name: str, seq_len: int, batch: int, d_model: int, n_heads: int, repeats: int) -> dict:
    torch.manual_seed(0)
    mixer = build_mixer(name, d_model=d_model, n_heads=n_heads)
    x = torch.randn(batch, seq_len, d_model, requires_grad=True)

    def forward():
        with torch.no_grad():
            mixer(x)

    def forward_backward():
        y, _ = mixer(x)
        y.sum().backward()

    with torch.no_grad():
        _, state = mixer(x)
        token = x[:, -1:].detach()
        decode = _median_seconds(lambda: mixer(token, state), repeats)
    return {
        "forward_ms": 1e3 * _median_seconds(forward, repeats),
        "fwd_bwd_ms": 1e3 * _median_seconds(forward_backward, repeats),
        "decode_ms": 1e3 * decode,
        "state_kib": mixer.state_size(seq_len) * 4 / 1024,
    }


def run_bench(lengths=(256, 1024), batch: int = 2, d_model: int = 256, n_heads: int = 4, repeats: int = 3) -> list:
    print(f"batch {batch}, d_model {d_model}, {n_heads} heads, fp32, {torch.get_num_threads()} threads; "
          "median of repeats; ratios are against softmax at the same length")
    print(f"{'mixer':<14} {'T':>6} {'fwd ms':>9} {'fwd+bwd ms':>11} {'x softmax':>10} "
          f"{'decode ms/token':>16} {'state KiB/seq':>14}")
    rows = []
    for seq_len in lengths:
        base = None
        for name in ["softmax"] + [m for m in list_mixers() if m != "softmax"]:
            r = bench_mixer(name, seq_len, batch, d_model, n_heads, repeats)
            base = r["fwd_bwd_ms"] if name == "softmax" else base
            ratio = f"{r['fwd_bwd_ms'] / base:.2f}" if base else ""
            print(f"{name:<14} {seq_len:>6} {r['forward_ms']:>9.2f} {r['fwd_bwd_ms']:>11.2f} {ratio:>10} "
                  f"{r['decode_ms']:>16.3f} {r['state_kib']:>14.0f}")
            rows.append(dict(r, mixer=name, seq_len=seq_len))
    return rows
