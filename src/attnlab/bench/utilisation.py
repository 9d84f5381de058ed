"""Model FLOPs utilisation: the decoder's training step against what this machine's matrix products can do.

For each shape and precision: the model FLOPs one AdamW step of the decoder performs (matrix products,
attention counted causally, as `count_flops` counts them), divided by the step's median time, as a share of
the matmul peak of the dtype the products run in (fp32, or bf16 under autocast), measured in the same run.
Small models are overhead-bound: their share shows how far the framework's per-op cost is from the hardware.
"""

from __future__ import annotations

from functools import partial

import torch

from ..config import load_config
from ..model import Decoder
from ..timing import round_robin
from .instruments import count_flops, matmul_peak, peak_share
from .mixers import precision_context
from .models import adamw_step, random_batch


def bench_utilisation(shapes: dict[str, list[str]], precisions=("fp32", "bf16"), repeats: int = 5,
                      peak_sizes=(256, 512, 1024, 2048), log=print) -> dict:
    """shapes: {label: overrides of the demo preset}. Rows of {shape, precision, ms, tokens_per_s, gflops,
    peak_gflops, mfu}, per shape bf16's speed-up over fp32, the matmul peak of each dtype's products
    ("products") and the peak each precision's MFU divides by ("peaks": under bf16 autocast some products stay
    in fp32, so the faster of the two). bf16 steps are not timed where bf16 products are slower than fp32's:
    autocast could only slow the step there."""
    products = {p: matmul_peak([DTYPES[p]], peak_sizes)["gflops"] for p in dict.fromkeys(("fp32", *precisions))}
    peaks = {p: max(products[p], products["fp32"]) for p in precisions}
    log("decoder training step against the matmul peak of its products: "
        + ", ".join(f"{p} {g:.0f} GFLOP/s" for p, g in products.items()))
    if "bf16" in products and products["bf16"] < products["fp32"]:
        log(f"  bf16 steps not timed: bf16 products run at {products['bf16'] / products['fp32']:.2g}x fp32's here "
            f"(no native bf16 matrix unit)")
        precisions = tuple(p for p in precisions if p != "bf16")
    log(f"{'shape':<26} {'precision':<9} {'ms/step':>9} {'tokens/s':>10} {'GFLOP/s':>9} {'MFU':>7}")
    configs = {label: load_config("demo", ["model.vocab_size=256", *overrides]) for label, overrides in shapes.items()}
    rows, tasks, flops = [], {}, {}
    for label, cfg in configs.items():
        for precision in precisions:
            tasks[label, precision], flops[label, precision] = _training_step(cfg, precision)
    seconds = round_robin(tasks, repeats)
    speedup = {}
    for (label, precision), sec in seconds.items():
        cfg = configs[label]
        gflops = flops[label, precision] / sec / 1e9
        share = peak_share(gflops, peaks[precision])
        rows.append({"shape": label, "precision": precision, "ms": 1e3 * sec,
                     "tokens_per_s": cfg.train.batch_size * cfg.train.seq_len / sec, "gflops": gflops,
                     "peak_gflops": peaks[precision], "mfu": share})
        mfu = "ABOVE PEAK" if share is None else f"{100 * share:.1f}%"
        log(f"{label:<26} {precision:<9} {1e3 * sec:>9.1f} {rows[-1]['tokens_per_s']:>10,.0f} {gflops:>9.1f} {mfu:>7}")
    if {"fp32", "bf16"} <= set(precisions):
        for label in shapes:
            speedup[label] = seconds[label, "fp32"] / seconds[label, "bf16"]
            log(f"  {label}: bf16 step {speedup[label]:.2f}x as fast as fp32")
    return {"rows": rows, "bf16_speedup": speedup, "peaks": peaks, "products": products}


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _training_step(cfg, precision: str):
    """One AdamW step of the config's decoder on fixed random tokens, and the FLOPs it performs."""
    torch.manual_seed(0)
    model = Decoder(cfg.model)
    tokens = random_batch(cfg.model.vocab_size, cfg.train)
    step = adamw_step(model, partial(model.loss, tokens[:, :-1], tokens[:, 1:]), precision_context(precision))
    return step, count_flops(step)
