"""``attnlab demo``: every mechanism next to its baseline on a language-modelling and a retrieval task,
trained briefly on the CPU, then a table and a report."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from .experiments.report import write_report
from .experiments.runner import run_suite
from .experiments.stats import mean_std
from .experiments.suites import demo


def run_demo(out_dir: str = "runs/demo", quick: bool = False) -> dict:
    suite = demo()
    if Path(out_dir).exists():
        print(f"replacing the previous demo in {out_dir}")
        shutil.rmtree(out_dir)
    start = time.perf_counter()
    results = run_suite(suite, out_dir, seeds=1, quick=quick)
    report = write_report(suite, results, out_dir, seeds=1)
    lm, mqar = suite.experiments
    print(f"\n{'mixer':<14} {'val perplexity':>15} {'MQAR accuracy':>14} {'parameters':>11}")
    for arm in lm.arms:
        ppl = [r["val_ppl"] for k, r in results["runs"].items() if k.startswith(f"lm/{arm.label}/")]
        acc = [r["accuracy"] for k, r in results["runs"].items() if k.startswith(f"mqar/{arm.label}/")]
        params = results["runs"][f"lm/{arm.label}/0"]["params"]
        print(f"{arm.label:<14} {mean_std(ppl)[0]:>15.3f} {100 * mean_std(acc)[0]:>13.1f}% {params:>11,}")
    print(f"\n{time.perf_counter() - start:.0f} s; report: {report}; runs: {Path(out_dir) / 'runs'}")
    return results
