"""The demo: every mechanism next to its baseline on one language-modelling and one retrieval task."""

from __future__ import annotations

import sys

from .registry import DEMO_ARMS, register_suite
from .spec import QUICK, Arm, Experiment, Suite

NAME = "demo"
TIERS = ("default",)


SMALL = ["model.d_model=64", "model.n_layers=2", "model.n_heads=2"]


def arms(preset: str, *overrides: str) -> list[Arm]:
    """Softmax and every mixer the papers put in the demo (`registry.register_demo_arm`), small, on the preset
    with these overrides and each mixer's own."""
    mixers = {"softmax": [], **{mixer: own for mixer, (own, _) in DEMO_ARMS.items()}}
    return [Arm(m, preset, [f"model.mixer={m}", *SMALL, *overrides, *own]) for m, own in mixers.items()]


def suite(tier: str = "default") -> Suite:
    """Every mechanism next to its baseline on one language-modelling and one retrieval task, in minutes."""
    lm = Experiment(
        "lm",
        "Character-level Shakespeare, 64-character context: validation perplexity",
        "val_ppl",
        arms(
            "demo",
            "train.seq_len=64",
            "train.steps=300",
            "train.batch_size=16",
            "train.eval_every=300",
            "train.warmup_steps=30",
            "train.ckpt_every=300",
        ),
        baseline="softmax",
    )
    mqar = Experiment(
        "mqar",
        "MQAR, 32 tokens, 2 key-value pairs: test accuracy",
        "accuracy",
        arms(
            "mqar",
            "train.seq_len=32",
            "train.steps=400",
            "data.mqar.pairs=2",
            "data.mqar.test_pairs=[2]",
            "data.mqar.train_examples=10000",
            "data.mqar.test_examples=500",
            "train.eval_every=400",
            "train.ckpt_every=400",
        ),
        baseline="softmax",
    )
    return Suite(
        "demo",
        "attnlab demo: every mechanism at a glance",
        [lm, mqar],
        QUICK,
        "One seed and a few hundred steps per model: a first look and a check that everything trains, "
        "not evidence. " + "".join(f"{note} " for _, note in DEMO_ARMS.values() if note)
        + "`attnlab reproduce <paper>` runs the papers' claims over seeds.",
    )


register_suite(sys.modules[__name__], paper=False)
