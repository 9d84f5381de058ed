"""attnlab demo: every mechanism on a language-modelling and a retrieval task, in minutes on a CPU.

A small softmax Transformer trained on Shakespeare with a sample of its writing, then the demo's suite
(`lab.demo`: every mechanism next to its baseline), with a table and a report. About eight minutes on two
CPU cores.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from ..errors import UserError
from ..paths import user_path

SAMPLE_PROMPT = "ROMEO.\n"


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="every mechanism on a language-modelling and a retrieval task (CPU, minutes)")
    p.add_argument("--out", default="runs/demo", help="folder for the runs and report, replaced if it holds an "
                   "earlier demo (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="a few steps per model: a smoke test")
    p.set_defaults(func=main, check=check)


def check(args) -> None:
    out = user_path(args.out)
    # the demo deletes its folder before it starts: only an empty folder or an earlier demo's may be replaced
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "demo").is_dir())):
        raise UserError(f"--out {args.out} exists and is not an earlier demo's folder (no demo/ inside), and the "
                        "demo replaces its folder; give a new folder")


def main(args) -> None:
    run_demo(out_dir=args.out, quick=args.quick)


def run_demo(out_dir: str = "runs/demo", quick: bool = False) -> dict:
    from ..lab.configs import notes_once

    with notes_once():  # the demo's runs share their settings, and each run's config is read more than once
        return _run_demo(Path(out_dir), quick)


def _run_demo(out: Path, quick: bool) -> dict:
    from ..lab import demo  # the papers' arms with it
    from ..lab.driver import run_suite
    from ..lab.plan import plan_of
    from ..lab.report import write_report
    from ..lab.stats import mean_std
    from ..lab.store import RunKey

    if out.exists():
        print(f"replacing the previous demo in {out}")
        shutil.rmtree(out)
    start = time.perf_counter()
    shakespeare = _shakespeare(out, quick)
    suite = demo.suite()
    print("\nevery mechanism, one seed, a few hundred steps each:")
    results = run_suite(suite, out, seeds=1, quick=quick)
    report = write_report(suite, results, plan_of(suite, results), out)
    print(f"\n{'mixer':<14} {'val perplexity':>15} {'MQAR accuracy':>14} {'parameters':>11}")
    for arm in suite.experiments[0].arms:
        ppl = list(results.by_seed("lm", arm.label, "val_ppl").values())
        acc = list(results.by_seed("mqar", arm.label, "accuracy").values())
        params = results.get(RunKey("lm", arm.label, seed=0)).params
        print(f"{arm.label:<14} {mean_std(ppl)[0]:>15.3f} {100 * mean_std(acc)[0]:>13.1f}% {params:>11,}")
    print(f"\n{time.perf_counter() - start:.0f} s in all; report: {report}; runs: {out / 'runs'}")
    return {"shakespeare": shakespeare, "comparison": results}


def shakespeare_config(out: Path, steps: int):
    """The demo preset (a 0.8M-parameter softmax Transformer) trained for `steps` on character-level Shakespeare."""
    from ..config import load_config

    return load_config("demo", [f"out_dir={out}", f"train.steps={steps}", f"train.eval_every={steps}",
                                f"train.ckpt_every={steps}"])


def _shakespeare(out: Path, quick: bool) -> dict:
    from ..inference import load_run
    from ..train import train

    steps = 20 if quick else 500
    cfg = shakespeare_config(out, steps)
    start = time.perf_counter()
    # a bar redraws in place on a terminal; written to a file or a pipe it would be one line per refresh
    summary = train(cfg, progress=sys.stderr.isatty())
    sample = load_run(Path(cfg.out_dir) / cfg.name).complete(SAMPLE_PROMPT, tokens=300, temperature=0.8, seed=0)
    print(f"softmax Transformer, {summary['params']:,} parameters, {steps} steps in "
          f"{time.perf_counter() - start:.0f} s ({summary['tokens_per_s']:,.0f} tokens/s): validation loss "
          f"{summary['val_loss']:.4f} nats/char, perplexity {summary['val_ppl']:.2f}\n\n{sample}")
    return summary
