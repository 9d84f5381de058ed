"""``attnlab demo``: a small softmax Transformer trained on Shakespeare with a sample of its writing, then every
mechanism next to its baseline on a language-modelling and a retrieval task (the demo's suite), with a table and
a report. About eight minutes on two CPU cores. The papers bring their mixers' arms (`Paper.demo_arms`); importing
this module imports nothing heavy."""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .paper import Paper
from .spec import QUICK, Arm, Changes, Experiment, Suite

SAMPLE_PROMPT = "ROMEO.\n"
SMALL = Changes.model(d_model=64, n_layers=2, n_heads=2)


@dataclass(frozen=True)
class DemoArm:
    """A mixer in the demo, with the options that fit it to a few CPU minutes (a small size, a form that runs at
    the demo's 64-token contexts) and a note for the demo's report where they change what the mixer computes."""

    mixer: str
    options: dict = field(default_factory=dict)  # model.mixer_options.<mixer>
    note: str = ""


DEMO_ARMS: dict[str, DemoArm] = {}  # mixer -> its arm, in the order the papers register them


def register_demo_arm(arm: DemoArm) -> DemoArm:
    DEMO_ARMS[arm.mixer] = arm
    return arm


def arms(preset: str, changes: Changes) -> list[Arm]:
    """Softmax and every mixer the papers put in the demo, small, on the preset with these changes and each
    mixer's own options."""
    mixers = {"softmax": {}, **{mixer: arm.options for mixer, arm in DEMO_ARMS.items()}}
    return [Arm(m, preset, Changes.mixer(m, **options) | SMALL | changes) for m, options in mixers.items()]


def suite(tier: str = "default") -> Suite:
    """Every mechanism next to its baseline on one language-modelling and one retrieval task, in minutes."""
    lm = Experiment(
        "lm",
        "Character-level Shakespeare, 64-character context: validation perplexity",
        "val_ppl",
        arms("demo", Changes.train(seq_len=64, steps=300, batch_size=16, eval_every=300, warmup_steps=30,
                                   ckpt_every=300)),
        baseline="softmax",
    )
    mqar = Experiment(
        "mqar",
        "MQAR, 32 tokens, 2 key-value pairs: test accuracy",
        "accuracy",
        arms("mqar", Changes.train(seq_len=32, steps=400, eval_every=400, ckpt_every=400)
             | Changes.task("mqar", pairs=2, test_pairs=[2], train_examples=10000, test_examples=500)),
        baseline="softmax",
    )
    return Suite(
        "demo",
        "attnlab demo: every mechanism at a glance",
        [lm, mqar],
        QUICK,
        "One seed and a few hundred steps per model: a first look and a check that everything trains, "
        "not evidence. " + "".join(f"{arm.note} " for arm in DEMO_ARMS.values() if arm.note)
        + "`attnlab reproduce <paper>` runs the papers' claims over seeds.",
    )


# registered beside the papers (`experiments/__init__.py`): `attnlab report` rebuilds its report like theirs
DEMO = Paper("demo", ("default",), suite)


def run_demo(out_dir: str = "runs/demo", quick: bool = False) -> dict:
    from .configs import notes_once

    with notes_once():  # the demo's runs share their settings, and each run's config is read more than once
        return _run_demo(Path(out_dir), quick)


def _run_demo(out: Path, quick: bool) -> dict:
    from .plan import plan_of
    from .report import write_report
    from .runner import run_suite
    from .stats import mean_std
    from .store import RunKey

    if out.exists():
        print(f"replacing the previous demo in {out}")
        shutil.rmtree(out)
    start = time.perf_counter()
    shakespeare = _shakespeare(out, quick)
    demo = suite()
    print("\nevery mechanism, one seed, a few hundred steps each:")
    results = run_suite(demo, out, seeds=1, quick=quick)
    report = write_report(demo, results, plan_of(demo, results), out)
    print(f"\n{'mixer':<14} {'val perplexity':>15} {'MQAR accuracy':>14} {'parameters':>11}")
    for arm in demo.experiments[0].arms:
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
