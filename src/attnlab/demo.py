"""``attnlab demo``: a small softmax Transformer trained on Shakespeare with a sample of its writing,
then every mechanism next to its baseline on a language-modelling and a retrieval task, with a table
and a report. About eight minutes on two CPU cores."""

from __future__ import annotations

import logging
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from . import config
from .config import load_config
from .experiments import demo_suite
from .experiments.report import write_report
from .experiments.runner import run_suite
from .experiments.stats import mean_std
from .experiments.store import RunKey
from .inference import load_run
from .train import train

SAMPLE_PROMPT = "ROMEO.\n"


@contextmanager
def _each_note_once():
    """Each distinct note of the configs said once: the demo's runs share their settings, and each run's
    config is read more than once (to train it, to fingerprint it, for the report), so a note such as a
    warmup cut to fit a shortened run would come again and again."""
    said = set()

    def first_time(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in said:
            return False
        said.add(message)
        return True

    notes = logging.getLogger(config.__name__)
    notes.addFilter(first_time)
    try:
        yield
    finally:
        notes.removeFilter(first_time)


@_each_note_once()
def run_demo(out_dir: str = "runs/demo", quick: bool = False) -> dict:
    out = Path(out_dir)
    if out.exists():
        print(f"replacing the previous demo in {out}")
        shutil.rmtree(out)
    start = time.perf_counter()
    shakespeare = _shakespeare(out, quick)
    suite = demo_suite.suite()
    print("\nevery mechanism, one seed, a few hundred steps each:")
    results = run_suite(suite, out, seeds=1, quick=quick)
    report = write_report(suite, results, out)
    print(f"\n{'mixer':<14} {'val perplexity':>15} {'MQAR accuracy':>14} {'parameters':>11}")
    for arm in suite.experiments[0].arms:
        ppl = list(results.by_seed("lm", arm.label, "val_ppl").values())
        acc = list(results.by_seed("mqar", arm.label, "accuracy").values())
        params = results.get(RunKey("lm", arm.label, seed=0))["params"]
        print(f"{arm.label:<14} {mean_std(ppl)[0]:>15.3f} {100 * mean_std(acc)[0]:>13.1f}% {params:>11,}")
    print(f"\n{time.perf_counter() - start:.0f} s in all; report: {report}; runs: {out / 'runs'}")
    return {"shakespeare": shakespeare, "comparison": results}


def _shakespeare(out: Path, quick: bool) -> dict:
    """The demo preset (a 0.8M-parameter softmax Transformer) on character-level Shakespeare."""
    steps = 20 if quick else 500
    cfg = load_config("demo", [f"out_dir={out}", f"train.steps={steps}", f"train.eval_every={steps}",
                               f"train.ckpt_every={steps}"])
    start = time.perf_counter()
    # a bar redraws in place on a terminal; written to a file or a pipe it would be one line per refresh
    summary = train(cfg, progress=sys.stderr.isatty())
    sample = load_run(Path(cfg.out_dir) / cfg.name).complete(SAMPLE_PROMPT, tokens=300, temperature=0.8, seed=0)
    print(f"softmax Transformer, {summary['params']:,} parameters, {steps} steps in "
          f"{time.perf_counter() - start:.0f} s ({summary['tokens_per_s']:,.0f} tokens/s): validation loss "
          f"{summary['val_loss']:.4f} nats/char, perplexity {summary['val_ppl']:.2f}\n\n{sample}")
    return summary
