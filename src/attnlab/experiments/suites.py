"""The four paper suites, sized for a 2-core CPU by default (``--scale`` grows them)."""

from __future__ import annotations

from .runner import Arm, Experiment, Suite

QUICK = ["train.steps=20", "train.eval_every=20", "train.eval_batches=2", "train.ckpt_every=20"]


def coupled_qk() -> Suite:
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


def ccq() -> Suite:
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


def boltzmann() -> Suite:
    modes = ["softmax", "h+J", "h-only", "j-only"]  # the paper's four-way ablation

    def window(T):  # the context, the Boltzmann window and the learned position table together
        return [f"train.seq_len={T}", f"model.mixer_options.boltzmann.window={T}", f"model.positions={T}"]

    def ablation(name, title, metric, preset, T, paper, *overrides):
        def arm(mode):
            choice = "model.mixer=softmax" if mode == "softmax" else f"model.mixer_options.boltzmann.mode={mode}"
            return Arm(mode, preset, [*window(T), choice, *overrides])

        return Experiment(name, title, metric, [arm(m) for m in modes], "softmax", dict(zip(modes, paper, strict=True)))

    paper_lm = {8: ["5.894", "5.846", "6.075", "6.318"], 12: ["5.628", "5.567", "6.030", "6.318"]}
    paper_brackets = {12: ["93.36%", "94.91%", "92.65%", "94.61%"], 16: ["93.08%", "95.97%", "90.06%", "87.42%"]}
    experiments = [
        ablation(
            f"lm-T{T}",
            f"Shakespeare 100K characters, T = {T}: validation perplexity",
            "val_ppl",
            "boltzmann-char",
            T,
            paper,
        )
        for T, paper in paper_lm.items()
    ] + [
        ablation(
            f"brackets-T{T}",
            f"Bracket matching, T = {T}: test accuracy",
            "accuracy",
            "brackets",
            T,
            paper,
            f"train.steps={1000 if T > 12 else 1500}",  # T = 16 enumerates 16x the configurations of T = 12
            "train.batch_size=32",
        )
        for T, paper in paper_brackets.items()
    ]
    experiments.append(ablation(
        "brackets-noffn-T12",
        "Bracket matching without the feed-forward block, T = 12: test accuracy",
        "accuracy",
        "brackets",
        12,
        ["91.19%", "93.29%", "90.93%", "84.65%"],
        "train.steps=1500",
        "train.batch_size=32",
        "model.ffn=false",
    ))
    lm_hj = experiments[1].arms[1]  # h+J at T = 12: its learned couplings (trained once, measured again)
    couplings = Experiment(
        "couplings",
        "Learned couplings of h+J at T = 12: mean J by distance |j - k|",
        "couplings",
        [Arm("h+J", lm_hj.preset, lm_hj.overrides)],
        "h+J",
        {"h+J": "positive at distances 2–4, negative at 6 and beyond (figure 2)"},
    )
    dqa_steps = ["train.steps=200"]  # annealing costs about 50x exact enumeration per step at T = 6
    dqa = Experiment(
        "dqa",
        "Simulated quantum annealing vs exact marginals, T = 6",
        "val_ppl",
        [
            Arm("exact", "boltzmann-char", window(6)),
            Arm("exact, 200 steps", "boltzmann-char", [*window(6), *dqa_steps]),
            Arm("dqa, 200 steps", "boltzmann-char",
                [*window(6), *dqa_steps, "model.mixer_options.boltzmann.inference=dqa"]),
        ],
        "exact, 200 steps",
        {"exact": "6.156 (T = 6)", "dqa, 200 steps": "6.182 (trained to convergence)"},
    )
    return Suite(
        "boltzmann",
        "Boltzmann attention in miniature",
        [*experiments, dqa, couplings],
        QUICK,
        "Claims: h+J beats softmax and the gap grows with T; h-only is no better than softmax; J-only is "
        "worst (and, as specified, attends uniformly); the gap is larger without the feed-forward block; "
        "simulated annealing trains to near exact quality; learned J is positive at short distances and "
        "negative at long ones.",
    )


def interdomain() -> Suite:
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


SUITES = {"coupled-qk": coupled_qk, "ccq": ccq, "boltzmann": boltzmann, "interdomain": interdomain}


def demo() -> Suite:
    """Every mechanism next to its baseline on one language-modelling and one retrieval task, in minutes."""
    mixers = [
        "softmax",
        "coupled-qk",
        "differential",
        "gla",
        "ccq-gla",
        "gdn",
        "ccq-gdn",
        "interdomain",
        "s4d",
        "boltzmann",
    ]
    # exact enumeration stops at short windows, so the demo's 64-token contexts use the mean-field marginals
    boltzmann = [
        "model.mixer_options.boltzmann.inference=mean-field",
        "model.mixer_options.boltzmann.couplings=distance",
        "model.mixer_options.boltzmann.window=64",
    ]
    small = [
        "model.d_model=64",
        "model.n_layers=2",
        "model.n_heads=2",
        "model.mixer_options.interdomain.modes=16",
        "model.mixer_options.s4d.modes=16",
    ]

    def arms(preset, *overrides):
        return [
            Arm(m, preset, [f"model.mixer={m}", *small, *overrides, *(boltzmann if m == "boltzmann" else [])])
            for m in mixers
        ]

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
        "not evidence. Boltzmann attention runs with mean-field marginals and distance couplings here (exact "
        "enumeration is for short windows). `attnlab reproduce <paper>` runs the papers' claims over seeds.",
    )


SUITES["demo"] = demo
