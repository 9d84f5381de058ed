"""The Curvature-Conditioned Query: CCQ-GLA and CCQ-GDN against their backbones on MQAR, S-NIAH and
length extrapolation."""

from __future__ import annotations

from . import recall
from .spec import Arm, Experiment, Suite

NAME = "ccq"
TIERS = ("default", "converged")
QUICK = ["train.steps=20", "train.eval_every=20", "train.eval_batches=2", "train.ckpt_every=20"]


def suite(tier: str = "default") -> Suite:
    return converged() if tier == "converged" else default()


def converged() -> Suite:
    """Recall trained to convergence: MQAR at zoology's protocol and S-NIAH pass-key until it stops improving."""
    mixers = ["softmax", "gla", "ccq-gla", "gdn", "ccq-gdn"]
    small = ["model.d_model=64", "model.n_layers=2", "model.n_heads=2"]
    niah = Experiment(
        "niah",
        "S-NIAH pass-key, trained at 128 tokens until validation loss stops improving: exact match at 1x and 2x",
        "niah",
        [Arm(m, "demo", [f"model.mixer={m}", *small, "data.source=niah", "train.seq_len=128", "train.batch_size=16",
                         "train.steps=6000", "train.eval_every=200", "train.patience=10", "train.ckpt_every=6000",
                         "data.niah.test_per_depth=10"]) for m in mixers],
        "softmax",
        lengths=[1, 2],
    )
    return Suite(NAME, "The Curvature-Conditioned Query: recall trained to convergence",
                 [*recall.mqar(mixers), niah], QUICK, tier="converged")


def default() -> Suite:
    pairs = [("gla", "ccq-gla"), ("gdn", "ccq-gdn")]
    small = ["model.d_model=64", "model.n_layers=2", "model.n_heads=2"]

    def arms(preset, *overrides):
        return [Arm(mixer, preset, [f"model.mixer={mixer}", *overrides]) for pair in pairs for mixer in pair]

    mqar = Experiment(
        "mqar",
        "MQAR accuracy, 64 tokens, 4 pairs",
        "accuracy",
        arms("mqar", "train.steps=800"),
        baseline="gla",
    )
    niah = Experiment(
        "niah",
        "S-NIAH pass-key, trained at 128 tokens: exact match at 1x and 2x the training length",
        "niah",
        arms("demo", *small, "data.source=niah", "train.seq_len=128", "train.steps=400", "train.batch_size=16",
             "train.eval_every=400", "train.ckpt_every=400", "data.niah.test_per_depth=10"),
        baseline="gla",
        paper={
            "gla": "1.3B: 100 / 86.4 / 47.8 (1K/2K/4K)",
            "ccq-gla": "1.3B: 100 / 100 / 96.8",
            "gdn": "1.3B: 100 / 99.8 / 100",
            "ccq-gdn": "1.3B: 100 / 99.8 / 100",
        },
        lengths=[1, 2],
    )
    extrapolation = Experiment(
        "extrapolation",
        "Perplexity against context length (trained at 128)",
        "extrapolation",
        arms("demo", *small, "train.steps=400", "train.eval_every=400", "train.ckpt_every=400"),
        baseline="gla",
        paper={
            "ccq-gla": "each CCQ model beats its backbone by 1–2.5 PPL at 5x",
            "ccq-gdn": "each CCQ model beats its backbone by 1–2.5 PPL at 5x",
        },
    )
    return Suite(
        "ccq",
        "The Curvature-Conditioned Query in miniature",
        [mqar, niah, extrapolation],
        QUICK,
        "Claims: CCQ improves recall (S-NIAH, MQAR) and length extrapolation over GLA and Gated DeltaNet.",
    )
