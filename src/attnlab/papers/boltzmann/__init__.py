"""Boltzmann attention (Kim & Park 2026): its four-way ablation, annealing against exact marginals, and the learned
couplings. The ablation is softmax / h+J / h-only / J-only, on the Shakespeare LM and on bracket matching.

Tiers: `default` fits in about 45 minutes on 2 CPU cores (3 seeds, fixed steps); `paper` follows the paper's
protocol where it states one (early stopping with patience 20 epochs, dropout 0.1, its learning rates) and, where it
is silent, the readings its calibration chooses: 10 seeds for the headline arms (softmax and h+J at T = 12), 3 for
the others and T = 8, 5 for brackets, whose generator the spec reconstructs."""

from __future__ import annotations

from ...lab.claims import Anchor, Claim, relative
from ...lab.paper import Paper
from ...lab.registry import register_paper
from ...lab.spec import ABLATED, QUICK, UNCHANGED, Arm, Changes, Experiment, Suite, ablated, sensitivity
from . import bench, presets
from .couplings import METRIC as COUPLINGS
from .couplings import add_parser as couplings_command

PROVENANCE = {"Boltzmann attention": "from the paper's full text ([P]: the Ising energy, the marginals, the "
                   "ablations and the learning rates); the sum normalisation over visible keys is inferred ([I]), "
                   "and the block details and protocol the paper leaves unstated are our choices ([C]), "
                   "calibrated in the paper tier."}
# J-only as the paper specifies it: without fields every marginal is exactly 1/2, whatever J
UNIFORM = "as specified, it attends uniformly (without fields every marginal is 1/2, whatever the couplings)"
# what Mixer.ablated removes from the mechanism at evaluation, named in the report
ABLATION = "the couplings J set to 0, so h+J reads with its fields h alone"

NAME = "boltzmann"
TIERS = ("default", "paper")
MODES = ["softmax", "h+J", "h-only", "j-only"]  # the paper's four-way ablation

# The paper's numbers (tables 2, 3 and 5), by mode in the order of MODES.
PAPER_LM = {8: [5.894, 5.846, 6.075, 6.318], 12: [5.628, 5.567, 6.030, 6.318]}
PAPER_BRACKETS = {12: [93.36, 94.91, 92.65, 94.61], 16: [93.08, 95.97, 90.06, 87.42]}
PAPER_BRACKETS_NO_FFN = {12: [91.19, 93.29, 90.93, 84.65], 16: [85.13, 89.65, 85.78, 76.65]}
PAPER_DQA = {"exact": 6.156, "dqa": 6.182}  # table 4, T = 6: perplexity with exact marginals and with annealing

# The paper's protocol (§3.1 and the spec's chosen defaults for what it leaves unstated): evaluate every
# 200 steps, stop after 20 evaluations without a lower validation loss, at most 20,000 steps, dropout 0.1.
PROTOCOL = Changes.train(eval_every=200, patience=20, steps=20000, ckpt_every=20000) | Changes.model(dropout=0.1)


# Readings of what the paper leaves unstated, each a softmax arm at T = 12 that must reach the paper's 5.628
# before any comparison is made (the spec's ambiguity rows 9-11b). One pass over the windows of the 90K
# training characters at batch 64 is 90,000 / 64 ≈ 1,406 steps: an "epoch" read that way.
EPOCH_STEPS = 1406
ROW_11 = PROTOCOL  # an epoch of 200 steps, the 20,000-step cap, the printed plays, SwiGLU and RMSNorm
# Tiny Shakespeare's play and layout: 61 characters, as the paper
DIALOGUE = Changes.data(source="shakespeare-dialogue")
PAPER_BLOCK = Changes.model(ffn_kind="gelu", norm="layer")  # the paper's two-layer GELU FFN; LayerNorm
PASSES = (Changes.train(eval_every=EPOCH_STEPS, patience=20, steps=100 * EPOCH_STEPS, ckpt_every=100 * EPOCH_STEPS)
          | Changes.model(dropout=0.1))
UNTIED = Changes.model(tie_embeddings=False)  # the spec's block (row 9): an output head of its own


def by_epochs(epoch_steps: int) -> Changes:
    """Evaluate once an epoch, stop after 20 epochs without a lower validation loss, at most 200 epochs (Fig. 3's
    curves run to about 175), a checkpoint every 20, dropout 0.1."""
    return (Changes.train(eval_every=epoch_steps, patience=20, steps=200 * epoch_steps, ckpt_every=20 * epoch_steps)
            | Changes.model(dropout=0.1))


LONGER = by_epochs(EPOCH_STEPS)
READINGS = {
    "row 11": ROW_11,
    "+ dialogue": ROW_11 | DIALOGUE,
    "+ GELU, LayerNorm": ROW_11 | DIALOGUE | PAPER_BLOCK,
    "+ epoch = one pass": DIALOGUE | PAPER_BLOCK | PASSES,
    "dialogue, SwiGLU, one pass": DIALOGUE | PASSES,
    "+ untied head, 200 passes": DIALOGUE | PAPER_BLOCK | UNTIED | LONGER,
}
READING_NOTE = (
    "Each arm adds one reading to the one above: *row 11* is the spec's first reading (the printed plays from "
    "the first, All's Well, 74 characters; SwiGLU and RMSNorm; an evaluation epoch of 200 steps, patience 20, "
    "at most 20,000 steps); *+ dialogue* trains on Tiny Shakespeare's play and layout (Coriolanus, speeches "
    "only: 61 characters, the paper's count); *+ GELU, LayerNorm* uses the paper's two-layer GELU feed-forward "
    f"block; *+ epoch = one pass* counts an epoch as one pass over the training windows ({EPOCH_STEPS:,} steps "
    f"of 64), with patience 20 epochs and at most 100; *dialogue, SwiGLU, one pass* is the last with our own "
    "block (SwiGLU of the same width, three matrices: more parameters); *+ untied head, 200 passes* adds to "
    "*+ epoch = one pass* the spec's untied output head and a cap of 200 epochs (figure 3's bracket curves run "
    "to about 175), with a checkpoint every 20. Every arm is validated, stopped early and measured on every "
    "position of the validation split.")
WHOLE_SPLIT = Changes.train(eval_batches=0)  # validation (and early stopping) on every position of the split


def survey(name: str, title: str, metric: str, preset: str, T: int, readings: dict, paper: str, note: str,
           seeds: int, mode: str = "softmax") -> Experiment:
    """One mode at length T under each reading (label -> changes), every row against the paper's one number."""
    arms = [Arm(label, preset, window(T) | choose(mode) | reading) for label, reading in readings.items()]
    return Experiment(name, title, metric, arms, arms[0].label, dict.fromkeys(readings, paper), note=note, seeds=seeds)


def calibration() -> Experiment:
    """A survey at one seed: the chosen reading's softmax is the lm-T12 softmax arm, whose every seed the
    calibration line then judges."""
    readings = {label: reading | WHOLE_SPLIT for label, reading in READINGS.items()}
    return survey("calibration", "Calibration: softmax at T = 12 under each reading of the unstated settings",
                  "val_ppl", "boltzmann-char", 12, readings, f"{PAPER_LM[12][0]:g} ± 0.019", READING_NOTE, seeds=1)


# Brackets count an epoch as an evaluation every 200 steps (the spec's row 11), at most 200 of them (40,000 steps:
# Fig. 3's curves at T = 12 run to about 175 epochs), validated on every example. The language model's reading, an
# epoch as one pass over the training examples (312 steps of 64 over 20,000), was measured too: it leaves softmax
# without the FFN at T = 12 outside the tolerance of the paper's accuracy, where this one holds it (the
# calibration-epoch tables show both). The first reading's cap, 20,000 steps, ended every h+J model without the
# FFN at T = 12 before early stopping did.
BRACKET_EXAMPLES = 20_000  # the bracket task's training set (data.brackets.train_examples), stated where read
BRACKET_PROTOCOL = by_epochs(200) | WHOLE_SPLIT
ONE_PASS = Changes.task("brackets", train_examples=BRACKET_EXAMPLES) | by_epochs(BRACKET_EXAMPLES // 64) | WHOLE_SPLIT
NO_FFN = Changes.model(ffn=False)

# Readings of the bracket generator, each a softmax arm that must reach the paper's accuracy before any bracket
# comparison is made (the spec's ambiguity row 12)
BALANCED = Changes.task("brackets", balanced=True)
BRACKET_BLOCK = Changes.model(ffn_kind="gelu", ffn_hidden=64, norm="layer")  # §3.3: GELU, d_ff = 64
BRACKET_READINGS = {"row 12, random pairs and fillers": UNCHANGED, "balanced, no fillers": BALANCED,
                    "row 12, the paper's GELU block": BRACKET_BLOCK,
                    "balanced, the paper's GELU block": BALANCED | BRACKET_BLOCK,
                    # the paper gives no training-set size: a smaller one leaves softmax less to learn from
                    **{f"row 12, the paper's GELU block, {n:,} examples":
                       BRACKET_BLOCK | Changes.task("brackets", train_examples=n) for n in (2_000, 5_000)}}
BRACKET_NOTE = (
    "*Row 12* is the spec's generator: 1 to T/2 pairs of a random well-nested word, with fillers at random places "
    "between them; *balanced* always has T/2 pairs and no fillers; *the paper's GELU block* is §3.3's two-layer GELU "
    "feed-forward block of width 64 with LayerNorm, in place of our SwiGLU and RMSNorm; the last two rows train on "
    f"fewer examples than {BRACKET_EXAMPLES:,} (the paper gives no size).")


def bracket_calibration(T: int) -> Experiment:
    readings = {label: reading | BRACKET_PROTOCOL for label, reading in BRACKET_READINGS.items()}
    return survey(f"calibration-brackets-T{T}", f"Calibration: softmax on brackets at T = {T} under each reading of "
                  "the generator", "accuracy", "brackets", T, readings, f"{PAPER_BRACKETS[T][0]:g}%", BRACKET_NOTE,
                  seeds=1)


EPOCHS = {"an epoch of 200 steps": BRACKET_PROTOCOL, "an epoch of one pass": ONE_PASS}


def epoch_calibration(T: int) -> Experiment:
    """Softmax without the FFN under both readings of an epoch, at every seed of the tier's bracket experiments: the
    first is the brackets-noffn softmax arm (the same models, measured again)."""
    readings = {label: NO_FFN | protocol for label, protocol in EPOCHS.items()}
    return survey(f"calibration-epoch-T{T}", f"Calibration: softmax on brackets without the feed-forward block at "
                  f"T = {T} under each reading of an epoch", "accuracy", "brackets", T, readings,
                  f"{PAPER_BRACKETS_NO_FFN[T][0]:g}%", EPOCH_NOTE, seeds=5)


EPOCH_NOTE = (
    "The paper stops training after 20 epochs without a lower validation loss. *An epoch of 200 steps* evaluates "
    f"every 200 steps, at most 200 times; *an epoch of one pass* every pass over the {BRACKET_EXAMPLES:,} training "
    f"examples ({BRACKET_EXAMPLES // 64} steps of 64), at most 200 passes, as the language model reads it. Both "
    "validate on every validation example. The tier's bracket experiments train by the first.")


def window(T: int) -> Changes:
    """The context, the Boltzmann window and the learned position table, all T."""
    return Changes.train(seq_len=T) | Changes.options("boltzmann", window=T) | Changes.model(positions=T)


def ablation(name: str, title: str, metric: str, preset: str, T: int, paper: list[float], unit: str,
             changes: Changes = UNCHANGED, modes=MODES, seeds: int | None = None, arm_seeds: dict | None = None
             ) -> Experiment:
    def arm(mode):
        return Arm(mode, preset, window(T) | choose(mode) | changes, seeds=(arm_seeds or {}).get(mode))

    quoted = {mode: f"{value:g}{unit}" for mode, value in zip(MODES, paper, strict=True)}
    return Experiment(name, title, metric, [arm(m) for m in modes], "softmax", {m: quoted[m] for m in modes},
                      seeds=seeds)


def choose(mode: str) -> Changes:
    """The change that makes a model's attention one of MODES."""
    return Changes.mixer("softmax") if mode == "softmax" else Changes.options("boltzmann", mode=mode)


def relative_gain(paper: list[float], mode: str) -> float:
    """The paper's perplexity of `mode` relative to softmax, in %."""
    return relative(paper[MODES.index(mode)], paper[0])


def points(paper: list[float], mode: str) -> float:
    """The paper's accuracy of `mode` minus softmax's, in percentage points."""
    return paper[MODES.index(mode)] - paper[0]


# The reading the paper tier's language models train by: the one the calibration holds to the paper's number (its
# softmax at T = 12 is the lm-T12 softmax arm, so the calibration lines judge exactly the runs compared)
LM_READING = "+ untied head, 200 passes"


def suite(tier: str = "default") -> Suite:
    paper = tier == "paper"
    bracket_T = [16, 12] if paper else [12, 16]  # the paper tier runs its costliest, headline length first
    lm = lm_experiments(paper)
    experiments = [lm[0], couplings(lm[0]), lm[1], *bracket_experiments(paper, bracket_T)]  # the couplings are
    # measured as soon as their models exist
    if not paper:  # the short protocol leaves J too small to be engaged: a labelled sensitivity run beside it
        experiments.append(fast_couplings(lm[0]))
    return Suite(
        NAME,
        "Boltzmann attention" + (": the paper's protocol" if paper else " in miniature"),
        [calibration(), *(bracket_calibration(T) for T in (12, 16)), *(epoch_calibration(T) for T in (12, 16)),
         *experiments, *second_anchor()] if paper
        else [*experiments, annealing()],
        QUICK,
        description(paper),
        seeds=10 if paper else 3,
        tier=tier,
        claims=claims(bracket_T if paper else [12], dqa=not paper, calibrated=paper),
        anchors=h_only_anchors() if paper else [],
    )


def lm_experiments(paper: bool) -> list[Experiment]:
    """The four-way ablation on the language model at T = 12 (the headline) and T = 8."""
    lm_protocol = READINGS[LM_READING] | WHOLE_SPLIT if paper else UNCHANGED
    # The paper tier's runs take 20-40 minutes each on one core: the headline (softmax and h+J at T = 12) gets the
    # paper's 10 seeds, the secondary arms and lengths 3, which keeps the whole language model near 12 hours on 2
    # cores (the run times measured are in the report)
    secondary = {"h-only": 3, "j-only": 3} if paper else None
    return [
        ablation(f"lm-T{T}", f"Tiny Shakespeare's first 100K characters, T = {T}: validation perplexity"
                 if paper else f"Shakespeare 100K characters, T = {T}: validation perplexity", "val_ppl",
                 "boltzmann-char", T, PAPER_LM[T], "", lm_protocol, seeds=3 if paper and T == 8 else None,
                 arm_seeds=secondary)
        for T in (12, 8)  # the headline length first
    ]


def short_brackets(T: int) -> Changes:
    """The default tier's bracket runs: a fixed number of steps of 32 sequences."""
    return Changes.train(steps=1000 if T > 12 else 1500, batch_size=32)


def bracket_experiments(paper: bool, bracket_T: list[int]) -> list[Experiment]:
    """The ablation on bracket matching, with and without the feed-forward block (the default tier: without it at
    T = 12 only)."""
    # A bracket model at T = 16 costs about 3x one at T = 12 per step and the paper tier trains up to 40,000
    # steps of 64 sequences: its bracket experiments get 5 seeds (the LM, the headline claim, gets 10)
    return [
        ablation(f"brackets{tag}-T{T}", f"Bracket matching{title}, T = {T}: test accuracy", "accuracy", "brackets", T,
                 table[T], "%", ffn | (BRACKET_PROTOCOL if paper else short_brackets(T)),
                 seeds=5 if paper else None)
        for T in bracket_T
        for tag, title, table, ffn in [("", "", PAPER_BRACKETS, UNCHANGED),
                                       ("-noffn", " without the feed-forward block", PAPER_BRACKETS_NO_FFN,
                                        NO_FFN)]
        if paper or tag == "" or T == 12
    ]


# The paper tier's second anchor: its softmax arms match the paper, and these ask why the other arms do not.
# h-only at T = 12 lands at 5.62 against the paper's 6.03 under the spec's reading of sigmoid attention
# (sum-normalised sigma(2h)); the spec's alternative leaves the marginals unnormalised. The bracket gains without
# the FFN rest on softmax models stopped after 20 evaluations without a gain and on h+J models of which two
# stopped near 10,000 steps at T = 16: both arms again, with patience long enough for late transitions.
H_ONLY_READINGS = {"sum-normalised sigma(2h)": UNCHANGED,
                   "unnormalised sigma(2h)": Changes.options("boltzmann", normalise=False)}
H_ONLY_NOTE = ("*Sum-normalised* is the spec's reading of the paper's h-only (sigmoid attention): o_i = sum_j "
               "alpha_ij v_j / sum_k alpha_ik with alpha = sigma(2h), the lm-T12 h-only arm's models measured again; "
               "*unnormalised* weighs each value by sigma(2h) itself. Both train by the tier's language-model "
               "protocol.")
PATIENCE = 100  # evaluations without a lower validation loss (20,000 steps of 200) before a bracket run stops


def second_anchor() -> list[Experiment]:
    lm_protocol = READINGS[LM_READING] | WHOLE_SPLIT
    readings = {label: lm_protocol | reading for label, reading in H_ONLY_READINGS.items()}
    return [
        survey("h-only-readings", "Second anchor: h-only at T = 12 under each reading of sigmoid attention",
               "val_ppl", "boltzmann-char", 12, readings, f"{PAPER_LM[12][MODES.index('h-only')]:g}", H_ONLY_NOTE,
               seeds=3, mode="h-only"),
        *(ablation(f"brackets-noffn-T{T}-patient", f"Bracket matching without the feed-forward block, T = {T}, "
                   f"stopped after {PATIENCE} evaluations without a gain: test accuracy", "accuracy", "brackets", T,
                   PAPER_BRACKETS_NO_FFN[T], "%", NO_FFN | BRACKET_PROTOCOL | Changes.train(patience=PATIENCE),
                   modes=["softmax", "h+J"], seeds=5)
          for T in (12, 16)),
    ]


def h_only_anchors() -> list[Anchor]:
    """The paper's h-only at T = 12 (6.030 ± 0.124) that each reading of sigmoid attention is checked against."""
    sd = PAPER_H_ONLY_SD
    return [Anchor("h-only-readings", label, "val_ppl", PAPER_LM[12][MODES.index("h-only")], TOLERANCE_SDS * sd,
                   basis=f"{TOLERANCE_SDS:g} of the paper's standard deviations of {sd:g}")
            for label in H_ONLY_READINGS]


def couplings(lm: Experiment) -> Experiment:
    """The learned couplings of h+J at T = 12 (its model trained once, measured again)."""
    hj = lm.arms[MODES.index("h+J")]
    return Experiment(
        "couplings",
        "Learned couplings of h+J at T = 12: mean J by distance |j - k|",
        "couplings",
        [Arm("h+J", hj.preset, hj.changes)],
        "h+J",
        {"h+J": "positive at distances 2–4, negative at 6 and beyond, the same in every seed (figure 2: its axis "
                "spans about −0.6 to +0.4)"},
        component=True,
    )


def description(paper: bool) -> str:
    """The claims, and for the paper tier its protocol and the readings of what the paper leaves unstated."""
    return (
        "Claims: h+J beats softmax and the gap grows with T; h-only is no better than softmax; J-only is "
        "worst (and, as specified, attends uniformly); the gap is larger without the feed-forward block; "
        + ("" if paper else "simulated annealing trains to near exact quality; ")
        + "learned J is positive at short distances and negative at long ones."
        + ("" if paper else f" Beside the protocol, a labelled sensitivity run raises LR_J to {SENSITIVITY_J_LR:g}: "
           "in this tier's 1,500 steps the paper's rate leaves J too small to be engaged.")
        + (f" The protocol, as the paper states it and, where it is silent, the reading the calibration holds to "
           f"the paper's number ({LM_READING!r}): the speeches of Coriolanus in Tiny Shakespeare's layout, "
           "the paper's block (a two-layer GELU feed-forward block, LayerNorm, an untied head), dropout 0.1, the "
           f"paper's learning rates, an epoch of one pass over the training windows ({EPOCH_STEPS:,} steps of 64), "
           "early stopping after 20 epochs without a lower validation loss on the whole split, at most 200 epochs; "
           "brackets evaluate every 200 steps on every validation example, stop after 20 evaluations without a "
           "gain, at most 200 (40,000 steps); "
           "10 seeds for the language model, 5 for brackets."
           if paper else "")
    )


# About 30x the paper's LR_J = 3e-5: Adam moves a parameter by at most about its rate per step, so at the paper's
# rate 1,500 steps leave |J| under 0.05, where zeroing J moves perplexity by under 0.1%
SENSITIVITY_J_LR = 1e-3


def fast_couplings(lm: Experiment) -> Experiment:
    """The T = 12 language model's softmax and h+J with J's learning rate raised."""
    return sensitivity("lm-T12-fast-J", f"Sensitivity, not the paper's protocol: LR_J = {SENSITIVITY_J_LR:g}, T = 12",
                       lm, "h+J", Changes.options("boltzmann", j_lr=SENSITIVITY_J_LR))


def annealing() -> Experiment:
    """Simulated quantum annealing against exact marginals at T = 6. Annealing costs about 50x exact
    enumeration per step, so both train a short run side by side."""
    short = window(6) | Changes.train(steps=200)
    return Experiment(
        "dqa",
        "Simulated quantum annealing vs exact marginals, T = 6",
        "val_ppl",
        [
            Arm("exact", "boltzmann-char", window(6)),
            Arm("exact, 200 steps", "boltzmann-char", short),
            Arm("dqa, 200 steps", "boltzmann-char", short | Changes.options("boltzmann", inference="dqa")),
        ],
        "exact, 200 steps",
        {"exact": f"{PAPER_DQA['exact']} (T = 6)", "dqa, 200 steps": f"{PAPER_DQA['dqa']} (trained to convergence)"},
    )


# The standard deviation over the paper's 10 seeds of its softmax numbers (tables 2, 3 and 5), by T
PAPER_H_ONLY_SD = 0.124  # table 2, h-only at T = 12
PAPER_SOFTMAX_SD = {"lm": {8: 0.027, 12: 0.019}, "brackets": {12: 0.72, 16: 1.17},
                    "brackets-noffn": {12: 0.59, 16: 0.49}}
# How far the paper tier's softmax may sit from the paper's own number before nothing is compared: two of the
# paper's standard deviations, and at most half the gain of h+J that the comparison guards (at T = 12: 0.038 and
# 0.031 perplexity; at T = 8 two standard deviations, 0.054, would exceed the whole gain of 0.048)
TOLERANCE_SDS, GUARDED_FRACTION = 2.0, 0.5


def claims(no_ffn_T: list[int], dqa: bool, calibrated: bool = False) -> list[Claim]:
    """The paper's claims; calibrated: each comparison first needs its softmax arm at the paper's number.
    The h+J claims on the LM check that zeroing J at evaluation moves perplexity at least as much."""
    anchors = Anchors(calibrated)
    couplings = [
        Claim("learned J is positive at distance 3 (figure 2: positive at 2–4)", "couplings", "J@3", "h+J", None,
              "higher"),
        Claim("learned J is negative at distance 8 (figure 2: negative from 6 on)", "couplings", "J@8", "h+J", None,
              "lower"),
    ]
    annealing = [
        Claim("annealing trains as well as exact marginals (within 2%)", "dqa", "val_ppl", "dqa, 200 steps",
              "exact, 200 steps", "equal", relative(PAPER_DQA["dqa"], PAPER_DQA["exact"]), relative=True, margin=2.0),
    ] if dqa else []
    sensitivity = [
        Claim(f"sensitivity, LR_J = {SENSITIVITY_J_LR:g} (not the paper's): h+J beats softmax on the LM at T = 12",
              "lm-T12-fast-J", "val_ppl", "h+J", "softmax", "lower", relative_gain(PAPER_LM[12], "h+J"), relative=True,
              ablation=ABLATED),
    ] if not calibrated else []
    return lm_claims(anchors) + bracket_claims(anchors, no_ffn_T) + annealing + couplings + sensitivity


class Anchors:
    """The calibration a claim needs first (calibrated tiers only): its softmax arm at the paper's number."""

    def __init__(self, calibrated: bool):
        self.calibrated = calibrated

    def of(self, experiment: str, metric: str, table: dict, sd: float, scale: float = 1.0) -> tuple:
        """The anchor of softmax on the experiment: the paper's number (table[T] by mode) within TOLERANCE_SDS of
        its sd, and within GUARDED_FRACTION of h+J's gain over it there (in the metric's units)."""
        if not self.calibrated:
            return ()
        paper, gain = table[0], abs(table[MODES.index("h+J")] - table[0])
        tolerance = min(TOLERANCE_SDS * sd, GUARDED_FRACTION * gain)
        basis = (f"{TOLERANCE_SDS:g} of the paper's standard deviations of {sd:g}" if tolerance == TOLERANCE_SDS * sd
                 else f"{GUARDED_FRACTION:g} of h+J's gain of {gain:.3g} it guards, under {TOLERANCE_SDS:g} of the "
                      f"paper's standard deviations of {sd:g}")
        return (Anchor(experiment, "softmax", metric, paper, tolerance, scale, basis),)

    def lm(self, T: int) -> tuple:
        return self.of(f"lm-T{T}", "val_ppl", PAPER_LM[T], PAPER_SOFTMAX_SD["lm"][T])

    def brackets(self, tag: str, T: int, table: dict) -> tuple:
        return self.of(f"brackets{tag}-T{T}", "accuracy", table[T], PAPER_SOFTMAX_SD[f"brackets{tag}"][T], 100)


def lm_claims(anchors: Anchors) -> list[Claim]:
    return [
        Claim(f"h+J beats softmax on the LM at T = {T}", f"lm-T{T}", "val_ppl", "h+J", "softmax", "lower",
              relative_gain(PAPER_LM[T], "h+J"), relative=True, headline=T == 12, ablation=ABLATED,
              calibration=anchors.lm(T))
        for T in (8, 12)
    ] + [
        Claim("the LM gain of h+J grows from T = 8 to T = 12", "lm-T12", "val_ppl", "h+J", "softmax", "lower",
              relative_gain(PAPER_LM[12], "h+J") - relative_gain(PAPER_LM[8], "h+J"), relative=True,
              contrast="lm-T8", ablation=ABLATED, calibration=anchors.lm(12) + anchors.lm(8)),
        Claim("h-only is worse than softmax on the LM at T = 12", "lm-T12", "val_ppl", "h-only", "softmax", "higher",
              relative_gain(PAPER_LM[12], "h-only"), relative=True, calibration=anchors.lm(12)),
        Claim("J-only is worse than softmax on the LM at T = 12 (the paper: the worst of the four)", "lm-T12",
              "val_ppl", "j-only", "softmax", "higher", relative_gain(PAPER_LM[12], "j-only"), relative=True,
              calibration=anchors.lm(12), control_arm=UNIFORM),
    ]


def bracket_claims(anchors: Anchors, no_ffn_T: list[int]) -> list[Claim]:
    brackets = [
        Claim(f"h+J beats softmax on brackets at T = {T}", f"brackets-T{T}", "accuracy", "h+J", "softmax", "higher",
              points(PAPER_BRACKETS[T], "h+J"), scale=100, ablation=ablated("accuracy"),
              calibration=anchors.brackets("", T, PAPER_BRACKETS))
        for T in (12, 16)
    ] + [
        Claim("h-only is below softmax on brackets at T = 16", "brackets-T16", "accuracy", "h-only", "softmax",
              "lower", points(PAPER_BRACKETS[16], "h-only"), scale=100,
              calibration=anchors.brackets("", 16, PAPER_BRACKETS)),
    ]
    for T in no_ffn_T:
        gain, with_ffn = points(PAPER_BRACKETS_NO_FFN[T], "h+J"), points(PAPER_BRACKETS[T], "h+J")
        no_ffn = anchors.brackets("-noffn", T, PAPER_BRACKETS_NO_FFN)
        patient = f"brackets-noffn-T{T}-patient" if anchors.calibrated else None  # the second anchor's reruns
        brackets += [
            Claim(f"h+J beats softmax on brackets without the FFN at T = {T}", f"brackets-noffn-T{T}", "accuracy",
                  "h+J", "softmax", "higher", gain, scale=100, ablation=ablated("accuracy"), calibration=no_ffn,
                  rerun=patient),
            Claim(f"the bracket gain is larger without the FFN at T = {T}", f"brackets-noffn-T{T}", "accuracy",
                  "h+J", "softmax", "higher", gain - with_ffn, scale=100, contrast=f"brackets-T{T}",
                  ablation=ablated("accuracy"), calibration=no_ffn + anchors.brackets("", T, PAPER_BRACKETS)),
        ]
    return brackets


PAPER = register_paper(Paper(NAME, TIERS, suite, PROVENANCE, ABLATION, presets=presets.PRESETS, metrics=(COUPLINGS,),
                             commands=(couplings_command,), bench_cases=(bench.CASE,), variants=bench.VARIANTS,
                             speed_goals=bench.SPEED_GOALS, demo_arms=bench.DEMO_ARMS))
