"""Coupled Query-Key Dynamics: coupled (Euler, leapfrog) against standard and uncoupled attention on
character-level language modelling, sample efficiency, integration steps, coherent vs heterogeneous text
and MQAR."""

from __future__ import annotations

from .spec import Arm, Experiment, Suite

NAME = "coupled-qk"
TIERS = ("default",)
QUICK = ["train.steps=20", "train.eval_every=20", "train.eval_batches=2", "train.ckpt_every=20"]


def suite(tier: str = "default") -> Suite:
    # Every language model here reads the same 1.2M characters of plays (the coherent corpus), so an arm
    # that recurs in several experiments (softmax, Euler with one step) is trained once and measured again.
    lm_steps = ["train.steps=400", "train.eval_every=400", "train.ckpt_every=400", "data.max_chars=1200000"]

    def arm(label, mixer, *extra, **options):
        settings = [f"model.mixer_options.{mixer}.{k}={v}" for k, v in options.items()]
        return Arm(label, "coupled-qk-char", [f"model.mixer={mixer}", *lm_steps, *settings, *extra])

    softmax, euler = arm("softmax", "softmax"), arm("coupled-euler", "coupled-qk")
    leapfrog, uncoupled = arm("coupled-leapfrog", "coupled-qk", integrator="leapfrog"), arm("uncoupled", "uncoupled-qk")
    lm = Experiment(
        "lm",
        "Character-level Shakespeare: validation perplexity",
        "val_ppl",
        [softmax, euler, leapfrog, uncoupled, arm("differential", "differential")],
        baseline="softmax",
        paper={
            "softmax": "24.22 (WikiText-103, 60M)",
            "coupled-euler": "22.55–22.62",
            "coupled-leapfrog": "22.55–22.62",
            "uncoupled": "23.81 (8x the seed variance)",
        },
    )
    efficiency = Experiment(
        "efficiency",
        "Sample efficiency: training tokens until the training loss (mean of 5 logs) reaches 2.0 and 1.9 nats",
        "tokens_to_loss",
        [softmax, euler, leapfrog, uncoupled],
        baseline="softmax",
        paper={"softmax": "needs 2.4x the tokens to match coupled (60M)"},
        target_losses=[2.0, 1.9],
    )
    steps = Experiment(
        "steps",
        "Integration steps (the paper: no difference from 1 to 7)",
        "val_ppl",
        [
            Arm("1 step", euler.preset, euler.overrides),
            arm("3 steps", "coupled-qk", steps=3),
            arm("7 steps", "coupled-qk", steps=7),
        ],
        baseline="1 step",
    )
    heterogeneous = ["data.source=mixed"]
    corpus = [
        Experiment(
            f"corpus-{kind}",
            f"{kind.capitalize()} corpus{detail}: coupled vs standard",
            "val_ppl",
            [arm("softmax", "softmax", *source), arm("coupled-qk", "coupled-qk", *source)],
            baseline="softmax",
            paper={"coupled-qk": paper},
        )
        for kind, detail, source, paper in [
            ("coherent", " (the plays)", [], "−6.6% (WikiText-103), −4.5% (PubMed)"),
            ("heterogeneous", " (plays, Python source and documentation, shuffled)", heterogeneous,
             "+10.3% (web text)"),
        ]
    ]
    mqar = Experiment(
        "mqar",
        "MQAR, 64 tokens, 4 pairs (not in the paper)",
        "accuracy",
        [
            Arm("softmax", "mqar", ["train.steps=1000"]),
            Arm("coupled-qk", "mqar", ["model.mixer=coupled-qk", "train.steps=1000"]),
        ],
        baseline="softmax",
    )
    return Suite(
        "coupled-qk",
        "Coupled Query-Key Dynamics in miniature",
        [lm, efficiency, steps, *corpus, mqar],
        QUICK,
        "Claims: coupling lowers perplexity with Euler ≈ leapfrog < uncoupled ≤ standard and reaches a loss in "
        "fewer tokens; step count does not matter; the gain depends on the corpus (helps coherent text, hurts "
        "heterogeneous text).",
    )
