"""GPU-sized tiers: what a suite costs in GPU-hours, and the CPU smoke version of such a tier.

A training run costs 6 · N · D FLOPs: forward and backward (2 + 4 FLOPs per weight and token) over D tokens
through the N weights that multiply activations. Softmax-family attention adds its scores and weighted sum
over the causal context, 2 · layers · T · d per token forward (T/2 positions on average), so 6 · layers · T · d
in training (Kaplan et al. 2020, table 1). The chunked forms of linear attention and the state-space mixers add
O(chunk · d + head state) per token, a few percent of 6N at the papers' shapes: left out. Evaluation is left
out too. Hours are FLOPs over a sustained throughput, the assumption that matters most (SUSTAINED_TFLOPS).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .spec import Changes, Experiment, Suite, seed_count

if TYPE_CHECKING:  # the suites import this module for SMOKE and ASSUMPTION: it stays cheap to import
    from ..config import RunConfig
    from ..model import Decoder

H100_BF16_TFLOPS = 989.0  # an H100 SXM's dense bf16 peak (no sparsity)
# Model FLOPs utilisation of a well-tuned large training run: Llama 3 reports 38–43% in bf16 on H100s. It is
# optimistic for attnlab's mixers in plain PyTorch (no fused kernels), so read the hours as a lower bound.
UTILISATION = 0.4
SUSTAINED_TFLOPS = UTILISATION * H100_BF16_TFLOPS  # ≈ 396; estimate(..., tflops=...) overrides it
ASSUMPTION = (f"GPU-hours are training FLOPs (6 · parameters · tokens plus softmax attention's context term) at "
              f"{SUSTAINED_TFLOPS:.0f} TFLOP/s sustained: {UTILISATION:.0%} of an H100's {H100_BF16_TFLOPS:g} dense "
              "bf16 TFLOP/s, what a well-tuned large run reaches; attnlab's unfused mixers likely reach less")

# The --quick version of a paper tier: its arms shrunk to CPU size on local text, a check that every arm
# builds, trains and is measured end to end (not a result); characters read no BPE size, so an arm's
# data.bpe_vocab goes back to its default. Suites add their own QUICK (steps) and their mixers' sizes to it.
SMOKE = (Changes.data(source="shakespeare", tokenizer="char", bpe_vocab=4096)
         | Changes.model(vocab_size=0, d_model=64, n_layers=2, n_heads=2, ffn_hidden=None)
         | Changes.train(seq_len=64, batch_size=8, precision="fp32", warmup_steps=5))


def estimate(suite: Suite, tflops: float = SUSTAINED_TFLOPS, seeds: int | None = None) -> list[tuple[str, float]]:
    """GPU-hours per experiment at `tflops` sustained, for the suite's seeds (or `seeds`). A run that an earlier
    experiment trains with the same config is measured again, not trained: it costs nothing more. Early
    stopping's step cap counts in full (an upper bound)."""
    seeds = seeds or suite.seeds
    trained: set[str] = set()
    hours = []
    for experiment in suite.experiments:
        flops = 0.0
        for cfg in run_configs(experiment, seeds):
            identity = json.dumps(cfg.to_dict(), sort_keys=True)
            if identity not in trained:
                trained.add(identity)
                flops += training_flops(cfg)
        hours.append((experiment.name, flops / (tflops * 1e12) / 3600))
    return hours


def describe_estimate(suite: Suite, tflops: float = SUSTAINED_TFLOPS, seeds: int | None = None) -> str:
    """One line: the total and each experiment's GPU-hours, with the throughput they assume."""
    hours = estimate(suite, tflops, seeds)
    each = ", ".join(f"{name} {_hours(h)}" for name, h in hours)
    return (f"≈ {_hours(sum(h for _, h in hours))} GPU-hours at {tflops:,.0f} TFLOP/s sustained "
            f"({seeds or suite.seeds} seed(s)): {each}")


def run_configs(experiment: Experiment, seeds: int) -> Iterator[RunConfig]:
    """Every training run of the experiment, as run_suite makes them: a learning-rate sweep at the first seed
    (whose best run is that seed's), then the other seeds (at the chosen rate, which does not change the cost)."""
    from ..config import load_config

    for arm in experiment.arms:
        first = [Changes.train(lr=lr, seed=1000) for lr in experiment.lrs] or [Changes.train(seed=1000)]
        others = [Changes.train(seed=1000 + seed) for seed in range(1, seed_count(experiment, arm, seeds))]
        for extra in first + others:
            yield load_config(arm.preset, arm.changes | extra)


def training_flops(cfg: RunConfig) -> float:
    t = cfg.train
    tokens = t.steps * t.batch_size * t.seq_len
    params, attention_layers = _shape(cfg)
    return 6 * (params + attention_layers * t.seq_len * cfg.model.d_model) * tokens


_SHAPES: dict[str, tuple[int, int]] = {}  # a sized model config -> (its matmul parameters, its attention layers)


def _shape(cfg: RunConfig) -> tuple[int, int]:
    """The model's matmul parameters and attention layers, from one meta model per model config (a suite's arms
    and seeds share a few: building each again is most of an estimate's time)."""
    from ..mixers.attention import AttentionMixer

    key = repr(cfg.sized_model())
    if key not in _SHAPES:
        model = meta_model(cfg)
        _SHAPES[key] = matmul_params(model), sum(isinstance(block.mixer, AttentionMixer) for block in model.blocks)
    return _SHAPES[key]


def meta_model(cfg: RunConfig) -> Decoder:
    """The decoder's shapes, without memory or initialisation."""
    import torch

    from ..model import Decoder

    with torch.device("meta"):
        return Decoder(cfg.sized_model())


def matmul_params(model: Decoder) -> int:
    """The parameters that multiply activations: all but lookup tables (learned positions and an untied token
    embedding; a tied one is counted once, as the output head)."""
    lookups = [model.position] if model.position is not None else []
    lookups += [] if model.cfg.tie_embeddings else [model.embed]
    return model.num_params() - sum(table.weight.numel() for table in lookups)


def _hours(h: float) -> str:
    return f"{h:,.0f}" if h >= 100 else f"{h:.3g}"
