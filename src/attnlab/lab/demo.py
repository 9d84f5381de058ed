"""The demo's suite: every mechanism next to its baseline on a language-modelling and a retrieval task.

`attnlab demo` (`commands/demo.py`) runs it after a small softmax Transformer trained on Shakespeare. The papers
bring their mixers' arms (`Paper.demo_arms`); importing this module imports nothing heavy."""

from __future__ import annotations

from dataclasses import dataclass, field

from .paper import Paper
from .spec import QUICK, Arm, Changes, Experiment, Suite

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


# registered beside the papers (`papers/__init__.py`): `attnlab report` rebuilds its report like theirs
DEMO = Paper("demo", ("default",), suite)
