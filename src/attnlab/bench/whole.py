"""The whole bench: `run_bench` runs a preset (`default`, about 10 minutes on 2 cores, or `quick`) through every
view. The views: the machine's matmul peak; each mixer alone against the sequence length; decode latency against the
context; op forms against their loop references and flash-linear-attention's pure-PyTorch references; training steps
of our softmax decoder against x-transformers, and on packed documents against plain rows; and the papers' own cases
(`registry.BENCH_CASES`: each mechanism's cost where it has its own shape). It prints tables and the goals, and
writes bench.json and PNG plots."""

from __future__ import annotations

import json
import os
import platform
from datetime import datetime
from pathlib import Path

import torch

from ..plots import new_figure, save_figure
from .forms import bench_ops
from .instruments import matmul_peak
from .mixers import bench_decode, bench_decode_floor, bench_mixers, constant_state_mixers, contenders
from .models import bench_x_transformers
from .packed import PACKED_GOAL, bench_packed
from .registry import BENCH_CASES
from .utilisation import bench_utilisation

TINY_MODEL = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "train.batch_size=2", "train.seq_len=32"]
PRESETS = {
    "default": {
        "judged": True,
        "peak_sizes": [256, 512, 1024, 2048],
        "mixers": {"lengths": [256, 1024, 4096], "repeats": 3, "precision": "fp32"},
        "decode": {"contexts": [1024, 4096, 16384], "steps": 60},
        "decode_floor": {"context": 16384, "steps": 60},
        "ops": {"seq_len": 4096, "repeats": 2},
        "x_transformers": {"preset": "demo", "repeats": 5, "overrides": []},
        "utilisation": {"shapes": {"demo (d 128)": [], "d 512": ["model.d_model=512", "model.n_heads=8"]},
                        "repeats": 5},
        "packed": {"seq_len": 512, "batch": 8, "d_model": 128, "repeats": 3},
    },
    "quick": {
        "judged": False,  # everything timed once, at toy sizes: its numbers show the harness works, nothing more
        "peak_sizes": [64, 128],
        "mixers": {"lengths": [16, 32], "repeats": 1, "d_model": 32, "precision": "fp32"},
        "decode": {"contexts": [32, 64], "steps": 2, "prefill_chunk": 32, "d_model": 32},
        "decode_floor": {"context": 64, "steps": 2, "d_model": 32, "read_mib": 4},
        "ops": {"seq_len": 32, "repeats": 1, "heads": 2, "head_dim": 8, "d_model": 16},
        "x_transformers": {"preset": "demo", "repeats": 1, "overrides": TINY_MODEL},
        "utilisation": {"shapes": {"tiny": TINY_MODEL}, "repeats": 1, "peak_sizes": [64, 128]},
        "packed": {"seq_len": 32, "batch": 2, "d_model": 32, "repeats": 1},
    },
}
PEAK_DTYPES = {"fp32": [torch.float32], "bf16": [torch.float32, torch.bfloat16]}  # autocast keeps some fp32 products


def goals(results: dict, judged: bool = True) -> list[dict]:
    """Each goal: what is measured, its value from this run, the bar, whether it is met and the verdict to
    print. Unjudged (a preset that times everything once) leaves met as None: one timing says nothing."""
    ratios = results["ops"]["ratios"]
    decode = {}
    for row in results["decode"]:
        decode.setdefault(row["mixer"], []).append(row["decode_ms"])
    rows = [
        ("GLA chunkwise vs loop reference, fwd+bwd (x faster)", ratios.get("gla reference / chunk"), ">=", 10),
        ("GLA chunkwise vs fla naive_recurrent_gla (x faster)", ratios.get("fla naive_recurrent_gla / our gla chunk"),
         ">=", 3),
        ("gated delta rule chunkwise vs fla naive_chunk_gated_delta_rule (x faster)",
         ratios.get("fla naive_chunk_gated_delta_rule / our gdn chunk"), ">=", 1.0),
        ("our softmax decoder / x-transformers training tokens/s (x)",
         results["x_transformers"]["ratio"] if results["x_transformers"] else None, ">=", 1.0),
    ]
    contexts = results["config"]["decode"]["contexts"]
    for name in constant_state_mixers():
        series = decode.get(name, [])
        value = series[-1] / series[0] if len(series) == len(contexts) else None
        rows.append((f"{name} decode ms/token at {contexts[-1]} / at {contexts[0]} context", value, "<=", 1.1))
    series = decode.get("softmax", [])
    rows.append((f"softmax decode ms/token at {contexts[-1]} / at {contexts[0]} context (grows)",
                 series[-1] / series[0] if len(series) == len(contexts) else None, ">", 1.1))
    rows += _attention_goals(results)
    for label, row in results.get("packed", {}).items():
        rows.append((f"{label} packed documents / plain rows, training step (x)", row["x_plain"], "<=", PACKED_GOAL))
    for name, case in BENCH_CASES.items():
        if name in results.get("cases", {}):
            rows += case.goals(results["cases"][name])
    out = []
    for what, value, op, bar in rows:
        met = None if value is None else (value >= bar if op == ">=" else value <= bar if op == "<=" else value > bar)
        if not judged:
            met, verdict = None, "not judged (quick)"
        else:
            verdict = {True: "met", False: "NOT MET", None: "not measured"}[met]
        out.append({"goal": what, "value": value, "bar": f"{op} {bar:g}", "met": met, "verdict": verdict})
    return out


def _attention_goals(results: dict) -> list[tuple]:
    """Differential and sigmoid attention against softmax at the longest length (time, and memory growing
    no faster than the length); softmax decode against one read of its cache at the measured bandwidth;
    bf16 training steps against fp32 where the machine's bf16 products are faster."""
    rows = []
    by_mixer = {}
    for row in results.get("mixers", []):
        by_mixer.setdefault(row["mixer"], {})[row["seq_len"]] = row
    lengths = results["config"].get("mixers", {}).get("lengths", [])
    first, last = (lengths[0], lengths[-1]) if len(lengths) >= 2 else (1, 1)
    for name, bar in (("differential", 2.2), ("sigmoid", 2.0)):
        at = by_mixer.get(name, {})
        rows.append((f"{name} / softmax mixer fwd+bwd at T={last} (x)", at.get(last, {}).get("x_softmax"), "<=", bar))
        growth = at[last]["activation_mib"] / at[first]["activation_mib"] if first in at and last in at else None
        rows.append((f"{name} activation memory T={last} / T={first} (linear: {last / first:g})", growth, "<=",
                     1.125 * last / first))
    floor = results.get("decode_floor")
    if floor:
        rows.append((f"softmax decode ms/token at {floor['context']} / one read of its cache at "
                     f"{floor['gb_per_s']:.0f} GB/s (x)", floor["x_floor"], "<=", 1.5))
    utilisation = results.get("utilisation")
    products = utilisation["products"] if utilisation else {}
    if utilisation and utilisation["bf16_speedup"] and products["bf16"] >= 1.5 * products["fp32"]:
        label = list(utilisation["bf16_speedup"])[-1]
        rows.append((f"bf16 / fp32 training step speed, {label} (x; bf16 products "
                     f"{products['bf16'] / products['fp32']:.1f}x fp32's here)",
                     utilisation["bf16_speedup"][label], ">=", 1.2))
    return rows


def run_bench(preset: str = "default", out_dir: str | Path = "runs/bench", log=print) -> dict:
    settings = PRESETS[preset]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    peak = matmul_peak(PEAK_DTYPES[settings["mixers"]["precision"]], settings["peak_sizes"])
    log(f"matmul peak: {peak['gflops']:.1f} GFLOP/s ({peak['dtype']}, {peak['size']} x {peak['size']}), the best of "
        f"square products of {', '.join(peak['measured'])}, {torch.get_num_threads()} threads\n")
    cases = {name: case for name, case in BENCH_CASES.items() if preset in case.settings}
    results = {"config": {**settings, "cases": {name: case.settings[preset] for name, case in cases.items()}},
               "preset": preset, "peak": peak,
               "machine": {"cpus": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
                           "platform": platform.platform()},
               "date": datetime.now().isoformat(timespec="minutes")}
    results["mixers"] = bench_mixers(**settings["mixers"], peak_gflops=peak["gflops"], log=log)
    log("")
    results["decode"] = bench_decode(**settings["decode"], log=log)
    results["decode_floor"] = bench_decode_floor(**settings["decode_floor"], log=log)
    log("")
    results["ops"] = bench_ops(**settings["ops"], log=log)
    log("")
    results["x_transformers"] = bench_x_transformers(**settings["x_transformers"], log=log)
    log("")
    results["utilisation"] = bench_utilisation(**settings["utilisation"], log=log)
    log("")
    results["packed"] = bench_packed(**settings["packed"], log=log)
    results["cases"] = {}
    for name, case in cases.items():
        log("")
        results["cases"][name] = case.run(**case.settings[preset], log=log)
    results["goals"] = goals(results, settings["judged"])
    log("\ngoals (measured in this run):")
    for goal in results["goals"]:
        value = "–" if goal["value"] is None else f"{goal['value']:.3g}"
        log(f"  {goal['goal']:<78} {value:>8}  {goal['bar']:<8} {goal['verdict']}")
    (out / "bench.json").write_text(json.dumps(results, indent=1))
    figures = plot_bench(results, out)
    log(f"\nwrote {out / 'bench.json'} and {', '.join(str(f) for f in figures)}")
    return results


# 11 markers and 4 line styles: coprime counts, so (marker, line style) pairs repeat only after 44 lines
MARKERS = "osD^vP*X<>p"
LINE_STYLES = ("-", "--", "-.", ":")


def line_styles(n: int) -> list[dict]:
    """n plot styles, each with its own colour and its own (marker, line style) pair, so that every line can
    be told apart in colour and in shape (and in grey)."""
    import matplotlib

    tab20 = matplotlib.colormaps["tab20"].colors
    colours = tab20[0::2] + tab20[1::2]  # the ten strong colours first, then their light twins
    if n > len(colours):
        raise ValueError(f"{n} lines need more than the {len(colours)} distinct colours of the plots")
    return [{"color": colours[i], "marker": MARKERS[i % len(MARKERS)], "linestyle": LINE_STYLES[i % len(LINE_STYLES)]}
            for i in range(n)]


def plot_bench(results: dict, out: Path) -> list[Path]:
    styles = line_styles(len(contenders()))
    figures = []
    for name, rows, x, y, xlabel, ylabel in [
        ("time_vs_length.png", results["mixers"], "seq_len", "fwd_bwd_ms", "sequence length", "forward+backward ms"),
        ("decode_vs_context.png", results["decode"], "context", "decode_ms", "context length", "ms per decoded token"),
    ]:
        fig, ax = new_figure(figsize=(7.5, 5))
        for i, (label, *_) in enumerate(contenders()):
            points = [(r[x], r[y]) for r in rows if r["mixer"] == label]
            if points:
                ax.plot(*zip(*points, strict=True), label=label, **styles[i])
        ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel)
        ax.legend(fontsize=6, ncol=2)
        ax.grid(True, which="both", alpha=0.3)
        figures.append(save_figure(fig, out / name, dpi=110))
    return figures
