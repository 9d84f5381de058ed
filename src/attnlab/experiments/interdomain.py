"""Interdomain attention: the ablation cube against S4D and softmax, length extrapolation and MQAR."""

from __future__ import annotations

from .spec import Arm, Experiment, Suite

NAME = "interdomain"
TIERS = ("default",)
QUICK = ["train.steps=20", "train.eval_every=20", "train.eval_batches=2", "train.ckpt_every=20"]


def suite(tier: str = "default") -> Suite:
    # the extrapolation arms are the cube's own models (trained once, measured again)
    lm_steps = ["train.steps=300", "train.eval_every=300", "train.ckpt_every=300"]
    cube = [
        ("interdomain", []),
        ("no RoPE", ["model.mixer_options.interdomain.rope=false"]),
        ("single input", ["model.mixer_options.interdomain.input=single"]),
        ("dual + linear", ["model.mixer_options.interdomain.query=linear"]),
        ("s4d", ["model.mixer=s4d"]),
        ("softmax", ["model.mixer=softmax"]),
    ]
    paper = {
        "interdomain": "16.48",
        "no RoPE": "16.51",
        "single input": "16.94",
        "dual + linear": "20.18",
        "s4d": "19.22",
        "softmax": "16.65",
    }
    lm = Experiment(
        "cube",
        "The ablation cube on character Shakespeare: validation perplexity",
        "val_ppl",
        [Arm(label, "interdomain-char", [*o, *lm_steps]) for label, o in cube],
        "softmax",
        {k: f"{v} (125M)" for k, v in paper.items()},
    )
    extrapolation = Experiment(
        "extrapolation",
        "Perplexity against context length (trained at 128)",
        "extrapolation",
        [
            Arm(label, "interdomain-char", [*o, *lm_steps])
            for label, o in [("interdomain", []), ("s4d", ["model.mixer=s4d"]), ("softmax", ["model.mixer=softmax"])]
        ],
        "softmax",
        {
            "interdomain": "14.36 / 14.14 / 14.26 (4K/8K/14K, 1.3B)",
            "softmax": "12.79 / 20.54 / 55.92",
            "s4d": "27.24 / 26.89 / 26.75",
        },
        lengths=[1, 2, 3.5],
    )
    mqar = Experiment(
        "mqar",
        "MQAR recall, 64 tokens",
        "accuracy",
        [Arm(m, "mqar", [f"model.mixer={m}", "train.steps=500"]) for m in ("interdomain", "s4d", "softmax")],
        "softmax",
    )
    return Suite(
        "interdomain",
        "Interdomain attention in miniature",
        [lm, extrapolation, mqar],
        QUICK,
        "Claims: the query-conditioned read is the dominant ingredient (cube); the fixed state makes "
        "perplexity flat beyond the training length; exact recall is a weakness of fixed-state models.",
    )
