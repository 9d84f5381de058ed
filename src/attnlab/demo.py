"""``attnlab demo``: train the demo preset, report validation loss and speed, and print a sample."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from .config import load_config
from .inference import load_run
from .train import train

SAMPLE_PROMPT = "ROMEO.\n"


def run_demo(out_dir: str = "runs", steps: int | None = None) -> dict:
    overrides = [f"out_dir={out_dir}"] + ([f"train.steps={steps}"] if steps else [])
    cfg = load_config("demo", overrides)
    run_dir = Path(cfg.out_dir) / cfg.name
    if run_dir.exists():
        print(f"replacing the previous demo run in {run_dir}")
        shutil.rmtree(run_dir)
    start = time.perf_counter()
    summary = train(cfg)
    wall = time.perf_counter() - start
    sample = load_run(run_dir).complete(SAMPLE_PROMPT, tokens=400, temperature=0.8, seed=0)
    print()
    print(f"softmax Transformer, {summary['params']:,} parameters, {summary['steps']} steps in {wall:.0f} s "
          f"({summary['tokens_per_s']:,.0f} tokens/s)")
    print(f"validation loss {summary['val_loss']:.4f} nats/char, perplexity {summary['val_ppl']:.2f}")
    print(f"run folder: {run_dir}\n\nsample:\n{sample}")
    return dict(summary, wall_seconds=wall, sample=sample)
