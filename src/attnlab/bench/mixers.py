"""Every mixer alone: forward and forward+backward time against the sequence length, and decode latency against the
context. The times come with matmul GFLOP/s, activation memory and state size; the decode latency is per token."""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial

import torch

from ..errors import UserError
from ..mixers import build_mixer, list_mixers
from ..mixers.softmax import causal_sdpa
from ..timing import round_robin
from .instruments import count_flops, peak_share, saved_bytes
from .registry import VARIANTS


def contenders() -> list[tuple[str, str, dict]]:
    """(label, mixer, options): every registered mixer with its defaults, softmax first, then the variants the
    papers register to be timed (`registry.Variant`, e.g. a sliding-window form)."""
    names = sorted(list_mixers(), key=lambda n: (n != "softmax", n))
    return [(name, name, {}) for name in names] + [(v.label, v.mixer, v.options) for v in VARIANTS if v.timed]


def constant_state_mixers(d_model: int = 64, n_heads: int = 4) -> list[str]:
    """The contenders (labels) whose decoding state does not grow with the context, by their own
    ``state_size`` (no larger at 2048 tokens than at 1024): the recurrent mixers and sliding windows."""
    with torch.random.fork_rng(devices=[]):  # building initialises weights: leave the caller's RNG alone
        built = {label: build_mixer(name, d_model=d_model, n_heads=n_heads, **options)
                 for label, name, options in contenders()}
    return [label for label, mixer in built.items() if mixer.state_size(2048) <= mixer.state_size(1024)]


def _build(name: str, options: dict, d_model: int, n_heads: int):
    torch.manual_seed(0)
    return build_mixer(name, d_model=d_model, n_heads=n_heads, **options)


def inverted(seconds: dict) -> list[str]:
    """Labels whose forward+backward measured faster than their forward alone: impossible work, so noise."""
    labels = {label for label, _ in seconds}
    return sorted(label for label in labels if seconds[label, "fwd_bwd"] < seconds[label, "forward"])


def remeasure_inverted(tasks: dict, seconds: dict, repeats: int) -> list[str]:
    """Measures the inverted pairs again with three times the repeats (updating seconds); returns the labels
    still inverted, whose figures are then noise, not results."""
    again = {key: fn for key, fn in tasks.items() if key[0] in inverted(seconds)}
    if again:
        seconds.update(round_robin(again, 3 * repeats))
    return inverted(seconds)


def precision_context(precision: str):
    """The autocast a training run with train.precision=<precision> uses on the CPU."""
    if precision == "bf16":
        return partial(torch.autocast, "cpu", dtype=torch.bfloat16)
    return nullcontext


def bench_mixers(lengths=(256, 1024, 4096), batch: int = 1, d_model: int = 256, n_heads: int = 4,
                 repeats: int = 3, peak_gflops: float | None = None, precision: str = "fp32", log=print) -> list[dict]:
    """Rows of {mixer, seq_len, forward_ms, fwd_bwd_ms, x_softmax, gflops, peak_fraction, above_peak, noise,
    activation_mib, state_kib}; a mixer that refuses a length (one with an exact window) is reported and
    skipped. peak_gflops must be the best over the dtypes `precision` runs its products in."""
    autocast = precision_context(precision)
    log(f"mixers alone: batch {batch}, d_model {d_model}, {n_heads} heads, {precision}, {torch.get_num_threads()} "
        f"threads, median of {repeats}; GFLOP/s counts matrix products only (causal attention: the pairs it keeps)")
    log(f"{'mixer':<30} {'T':>6} {'fwd ms':>9} {'fwd+bwd ms':>11} {'x softmax':>10} {'GFLOP/s':>8} "
        f"{'of peak':>10} {'activ. MiB':>11} {'state KiB':>10}")
    rows = []
    for seq_len in lengths:
        x = torch.randn(batch, seq_len, d_model, requires_grad=True)
        tasks, info = {}, {}
        for label, name, options in contenders():
            mixer = _build(name, options, d_model, n_heads)
            try:
                with autocast():
                    activation = saved_bytes(lambda mixer=mixer, x=x: mixer(x))
            except UserError as err:  # e.g. a mixer with an exact window, past it
                log(f"{label:<30} {seq_len:>6}  not run: {str(err).split(';')[0]}")
                continue

            def forward(mixer=mixer, x=x):
                with torch.no_grad(), autocast():
                    mixer(x)

            def fwd_bwd(mixer=mixer, x=x):
                with autocast():
                    y = mixer(x)[0]
                y.float().sum().backward()

            tasks[label, "forward"], tasks[label, "fwd_bwd"] = forward, fwd_bwd
            info[label] = {"flops": count_flops(fwd_bwd), "activation_mib": activation / 2**20,
                           "state_kib": mixer.state_size(seq_len) * 4 / 1024}
        seconds = round_robin(tasks, repeats)
        noisy = remeasure_inverted(tasks, seconds, repeats)
        base = seconds.get(("softmax", "fwd_bwd"))
        for label, extra in info.items():
            row = _row(label, seq_len, seconds, extra, base, peak_gflops, label in noisy)
            rows.append(row)
            log(_format_row(row))
    return rows


def _row(label, seq_len, seconds, extra, base, peak_gflops, noise) -> dict:
    fwd_bwd = seconds[label, "fwd_bwd"]
    gflops = extra["flops"] / fwd_bwd / 1e9
    return {"mixer": label, "seq_len": seq_len, "forward_ms": 1e3 * seconds[label, "forward"],
            "fwd_bwd_ms": 1e3 * fwd_bwd, "x_softmax": fwd_bwd / base if base else None, "gflops": gflops,
            "peak_fraction": peak_share(gflops, peak_gflops) if peak_gflops else None,
            "above_peak": bool(peak_gflops) and gflops > peak_gflops, "noise": noise,
            "activation_mib": extra["activation_mib"], "state_kib": extra["state_kib"]}


def _format_row(row: dict) -> str:
    ratio = f"{row['x_softmax']:>10.2f}" if row["x_softmax"] else f"{'':>10}"
    if row["above_peak"]:
        share = f"{'ABOVE PEAK':>10}"  # a FLOP count or a timing is wrong: never shown as a share over 100%
    else:
        share = f"{100 * row['peak_fraction']:>9.1f}%" if row["peak_fraction"] is not None else f"{'':>10}"
    noise = "  noise: fwd+bwd measured faster than fwd, even with 3x the repeats" if row["noise"] else ""
    return (f"{row['mixer']:<30} {row['seq_len']:>6} {row['forward_ms']:>9.2f} {row['fwd_bwd_ms']:>11.2f} {ratio} "
            f"{row['gflops']:>8.1f} {share} {row['activation_mib']:>11.1f} {row['state_kib']:>10.0f}{noise}")


def bench_decode(contexts=(1024, 4096, 16384), batch: int = 1, d_model: int = 256, n_heads: int = 4,
                 steps: int = 20, prefill_chunk: int = 1024, log=print) -> list[dict]:
    """Milliseconds per decoded token after a prefill of each context length (the prefill runs in pieces
    of prefill_chunk tokens through the mixer's own state). Each step continues from the state the last one
    returned, as generation does, and the contexts take turns, so drift in the machine's speed hits them
    alike. Rows of {mixer, context, decode_ms, state_kib}."""
    log(f"decode latency per token after a prefill: batch {batch}, d_model {d_model}, {n_heads} heads, "
        f"median of {steps} steps continuing the sequence, the contexts in turn")
    log(f"{'mixer':<30} " + " ".join(f"{f'{c} ms':>10}" for c in contexts) + f" {'last/first':>11}")
    rows = []
    for label, name, options in contenders():
        mixer = _build(name, options, d_model, n_heads)
        generator = torch.Generator().manual_seed(0)
        steps_at, reason = {}, ""
        for context in contexts:
            try:
                steps_at[context] = _decoder_at(mixer, context, batch, d_model, prefill_chunk, generator)
            except UserError as err:
                reason = str(err).split(";")[0]
                break
        with torch.no_grad():
            seconds = round_robin(steps_at, steps) if steps_at else {}
        latencies = [1e3 * seconds[c] for c in steps_at]
        rows += [{"mixer": label, "context": c, "decode_ms": 1e3 * seconds[c],
                  "state_kib": mixer.state_size(c) * 4 / 1024} for c in steps_at]
        cells = " ".join(f"{ms:>10.3f}" for ms in latencies)
        growth = f"{latencies[-1] / latencies[0]:>11.2f}" if len(latencies) == len(contexts) else ""
        log(f"{label:<30} {cells} {growth}" + (f"  not run past that: {reason}" if reason else ""))
    return rows


def _decoder_at(mixer, context: int, batch: int, d_model: int, prefill_chunk: int, generator):
    """A callable that decodes the next token after a prefill of `context` random tokens, each call continuing
    from the state the previous one left (raises the mixer's UserError when it cannot reach the context)."""
    with torch.no_grad():
        state = None
        for start in range(0, context, prefill_chunk):
            piece = torch.randn(batch, min(prefill_chunk, context - start), d_model, generator=generator)
            _, state = mixer(piece, state)
    token = torch.randn(batch, 1, d_model, generator=generator)

    def step():
        nonlocal state
        _, state = mixer(token, state)

    return step


def bench_decode_floor(context: int = 16384, d_model: int = 256, n_heads: int = 4, steps: int = 60,
                       read_mib: int = 256, log=print) -> dict:
    """Softmax's decode step after `context` tokens against the least any step that attends to the whole cache
    can take: reading its keys and values once at this machine's memory bandwidth. The bandwidth is measured
    by summing a read_mib tensor (far larger than the caches) in turns with the decode steps, so both see the
    machine in the same state. Beside them, the one-query attention alone on a cache of the same shape: what
    the step's two matrix-vector products cost when they read from memory, as the step's do."""
    step = _decoder_at(_build("softmax", {}, d_model, n_heads), context, 1, d_model, 1024, torch.Generator())
    head_dim = d_model // n_heads
    q, k, v = (torch.randn(1, n_heads, n, head_dim) for n in (1, context, context))
    big = torch.ones(read_mib * 2**20 // 4)
    with torch.no_grad():  # in turns, each task evicting the last one's data from the caches
        seconds = round_robin({"decode": step, "read": big.sum, "attention": lambda: causal_sdpa(q, k, v)}, steps)
    gb_per_s = big.numel() * 4 / seconds["read"] / 1e9
    cache_bytes = 2 * d_model * context * 4  # keys and values, fp32, batch 1
    floor_ms = 1e3 * cache_bytes / (gb_per_s * 1e9)
    decode_ms, attention_ms = 1e3 * seconds["decode"], 1e3 * seconds["attention"]
    result = {"context": context, "gb_per_s": gb_per_s, "cache_mib": cache_bytes / 2**20, "floor_ms": floor_ms,
              "decode_ms": decode_ms, "x_floor": decode_ms / floor_ms, "attention_ms": attention_ms,
              "attention_x_floor": attention_ms / floor_ms}
    log(f"memory bandwidth {gb_per_s:.1f} GB/s (median of {steps} reads of {read_mib} MiB, in turns with the decode "
        f"steps): reading softmax's {result['cache_mib']:.0f} MiB cache at {context} tokens takes {floor_ms:.2f} ms; "
        f"a decode step takes {decode_ms:.2f} ms ({result['x_floor']:.2f}x); the one-query attention alone, on a cache "
        f"of the same shape, takes {attention_ms:.2f} ms ({result['attention_x_floor']:.2f}x)")
    return result
