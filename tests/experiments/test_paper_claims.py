"""The papers' claims as data: every claim refers to an experiment, arms and result keys that its suite
produces; each paper marks one headline claim; made-up results with the claimed effect are judged to agree (and
the opposite effect to disagree). The GPU-hour estimate against a count by hand. Nothing here trains."""

from functools import cache

import pytest

from attnlab.config import load_config
from attnlab.lab.claims import Claim, Ratio
from attnlab.lab.estimate import describe_estimate, estimate
from attnlab.lab.spec import Arm, Changes, Experiment, Suite
from attnlab.lab.store import Results
from attnlab.lab.verdicts import evaluate
from attnlab.mixers.boltzmann import BoltzmannConfig
from attnlab.papers import SUITES, get_suite

TIERS = [(name, tier) for name in sorted(SUITES) for tier in SUITES[name].tiers]
PAPERS = ["boltzmann", "ccq", "coupled-qk", "interdomain"]
OUR_TIERS = [(name, tier) for name, tier in TIERS if name in PAPERS]


@cache
def config(preset: str, changes: Changes):
    return load_config(preset, changes)


def metric_keys(experiment: Experiment, arm: Arm) -> set[str]:
    """The result keys that job.measure records for this experiment's metric with this arm's config."""
    cfg = config(arm.preset, arm.changes)
    T = cfg.train.seq_len
    if experiment.metric == "accuracy":  # MQAR adds one slice per number of test pairs
        pairs = cfg.data.task_config().test_pairs if cfg.data.source == "mqar" else []
        return {"accuracy", *(f"pairs={p}" for p in pairs)}
    if experiment.metric == "tracking":  # a word problem at the training length and each longer test length
        return {f"acc@{T * k}" for k in [1, *cfg.data.task_config().test_lengths]}
    if experiment.metric == "niah":
        return {f"niah@{int(T * f)}" for f in experiment.lengths}
    if experiment.metric == "extrapolation":
        return {f"ppl@{int(T * f)}" for f in experiment.lengths}
    if experiment.metric == "tokens_to_loss":
        return {f"tokens to {target}" for target in experiment.target_losses}
    if experiment.metric == "couplings":
        window = cfg.model.mixer_options.get("boltzmann", {}).get("window", BoltzmannConfig.window)
        return {f"J@{d}" for d in range(1, window)}
    return {"val_loss", "val_ppl"}


def experiments_of(claim: Claim) -> list[str]:
    return [claim.experiment, *([claim.contrast] if claim.contrast else [])]


def arms_of(claim: Claim) -> list[str]:
    return [claim.arm, *([claim.baseline] if claim.baseline else [])]


def keys_of(metric: str | Ratio) -> tuple[str, ...]:
    """The results keys a claim's metric reads: one, or a Ratio's two."""
    return (metric.numerator, metric.denominator) if isinstance(metric, Ratio) else (metric,)


@pytest.mark.parametrize("name, tier", TIERS)
def test_every_claim_refers_to_what_its_suite_measures(name, tier):
    suite = get_suite(name, tier)
    experiments = {e.name: e for e in suite.experiments}
    for claim in suite.claims:
        for experiment in experiments_of(claim):
            assert experiment in experiments, f"{claim.statement!r}: no experiment {experiment!r}"
            arms = {a.label: a for a in experiments[experiment].arms}
            for label in arms_of(claim):
                assert label in arms, f"{claim.statement!r}: no arm {label!r} in {experiment}"
                keys = metric_keys(experiments[experiment], arms[label])
                assert set(keys_of(claim.metric)) <= keys, f"{claim.statement!r}: {claim.metric} not in {keys}"
    statements = [claim.statement for claim in suite.claims]
    assert len(statements) == len(set(statements)), "two claims of a suite read alike in its report"


@pytest.mark.parametrize("name, tier", OUR_TIERS)
def test_each_paper_marks_one_headline_claim(name, tier):
    assert sum(claim.headline for claim in get_suite(name, tier).claims) == 1


def test_the_demo_claims_nothing():
    assert get_suite("demo").claims == []


# synthetic results: every run of a claim's experiment(s) at BASE in every key, the claim's arm moved by the
# effect, plus per-seed noise far below any effect or margin

BASE = 10.0
CLEAR = 10.0  # an effect in the claimed direction, in the claim's units, where the paper gives none
NOISE = [-2, -1, 0, 1, 2]  # five seeds, mean 0


def effect_of(claim: Claim) -> float:
    """The paper's effect (for an equal claim, inside the margin: the paper's own result agrees), else a clear one."""
    if claim.target is not None:
        return claim.target  # in the run's units
    return {"lower": -CLEAR, "higher": CLEAR, "equal": 0.0}[claim.direction]


def base_of(claim: Claim, experiment: str) -> float:
    """The baseline's value in an experiment: the paper's own where the claim is calibrated against it there, else
    BASE."""
    anchor = next((a for a in claim.calibration if a.experiment == experiment), None)
    return anchor.paper / anchor.scale if anchor else BASE


def moved(claim: Claim, delta: float) -> float:
    """The arm's value of the claim's quantity that gives Δ = delta against the baseline."""
    if claim.baseline is None:
        return (delta + claim.reference) / claim.scale
    base = base_of(claim, claim.experiment)
    return base * (1 + delta / 100) if claim.relative else base + delta / claim.scale


def without_component(claim: Claim, value: float) -> float:
    """The arm's value with its component removed: worse by twice the paper's effect (an equal claim: its margin),
    in the claim's units, so that the mechanism is engaged."""
    bar = 2 * abs(claim.margin if claim.direction == "equal" else claim.target or CLEAR)
    if claim.relative:
        return value * (1 + bar / 100)
    return value - bar / claim.scale if claim.scale == 100 else value + bar / claim.scale


def synthetic_results(suite: Suite, claim: Claim, delta: float) -> Results:
    numerator, *denominator = keys_of(claim.metric)  # a ratio's denominator stays at 1: its numerator moves
    spread = 1e-3 * (abs(delta) or claim.margin or 1.0)
    runs = {}
    for experiment in (e for e in suite.experiments if e.name in experiments_of(claim)):
        for arm in experiment.arms:
            base = base_of(claim, experiment.name)
            for seed, noise in enumerate(NOISE):
                values = {key: 1.0 if key in denominator else base for key in metric_keys(experiment, arm)}
                if (experiment.name, arm.label) == (claim.experiment, claim.arm):  # the contrast stays at Δ = 0
                    values[numerator] = moved(claim, delta + spread * noise)
                    if claim.ablation is not None:  # the arm uses its component: removing it costs twice the bar
                        values[claim.ablation] = without_component(claim, values[numerator])
                runs[f"{experiment.name}/{arm.label}/{seed}"] = {"seconds": 1.0, **values}
    return Results({"runs": runs})


def verdict(suite: Suite, claim: Claim, delta: float) -> str:
    [(_, judged)] = evaluate([claim], synthetic_results(suite, claim, delta))
    assert judged.n == len(NOISE)
    return judged.verdict


@pytest.mark.parametrize("name, tier", OUR_TIERS)
def test_results_with_the_claimed_effects_agree(name, tier):
    suite = get_suite(name, tier)
    verdicts = {claim.statement: verdict(suite, claim, effect_of(claim)) for claim in suite.claims}
    assert set(verdicts.values()) == {"agrees"}, verdicts


@pytest.mark.parametrize("name", PAPERS)
def test_the_opposite_effect_is_opposite_to_the_headline(name):
    suite = get_suite(name)
    [headline] = [claim for claim in suite.claims if claim.headline]
    assert verdict(suite, headline, -effect_of(headline)) == "opposite"


# the GPU-hour estimate


def test_the_gpu_estimate_is_six_n_d_plus_attention_context_over_the_throughput():
    d, layers, ffn, vocab = 128, 4, 352, 100  # the demo preset's softmax model (SwiGLU: 8/3 d up to a multiple of 32)
    # weights that multiply activations: per block q, k, v, out (4d²), two norms, the SwiGLU; the final norm and
    # the output head. An untied input embedding is a lookup and does not count; a tied one is the head.
    n = layers * (4 * d * d + 2 * d + 3 * d * ffn) + d + vocab * d
    context = layers * 32 * d  # causal attention: 2 · layers · T · d FLOPs a token forward, 3x that to train

    def flops(steps):
        tokens = steps * 4 * 32
        return 6 * (n + context) * tokens

    run = Changes.model(vocab_size=100) | Changes.train(steps=10, batch_size=4, seq_len=32)
    suite = Suite("s", "s", [
        Experiment("a", "a", "val_ppl", [Arm("tied", "demo", run),
                                         Arm("untied", "demo", run | Changes.model(tie_embeddings=False))], "tied"),
        Experiment("again", "the same model again", "val_ppl", [Arm("same", "demo", run)], "same", seeds=1),
        Experiment("sweep", "a sweep", "val_ppl", [Arm("long", "demo", run | Changes.train(steps=20))], "long",
                   lrs=[1e-3, 3e-3]),
    ], seeds=2)
    tflops = 1e-6
    hours = dict(estimate(suite, tflops))
    assert hours["a"] == pytest.approx(4 * flops(10) / (tflops * 1e12 * 3600))  # 2 arms x 2 seeds
    assert hours["again"] == 0  # measured again, not trained again
    assert hours["sweep"] == pytest.approx(3 * flops(20) / (tflops * 1e12 * 3600))  # 2 rates, then seed 1
    assert dict(estimate(suite, 2 * tflops))["a"] == pytest.approx(hours["a"] / 2)
    assert dict(estimate(suite, tflops, seeds=1))["a"] == pytest.approx(hours["a"] / 2)
    line = describe_estimate(suite, tflops)
    assert "GPU-hours" in line and "sweep" in line and "2 seed(s)" in line


def test_every_calibration_tolerance_is_two_of_the_papers_sds_or_half_the_gain_it_guards():
    from attnlab.papers import boltzmann

    anchors = {a for claim in get_suite("boltzmann", "paper").claims for a in claim.calibration}
    assert len(anchors) == 6
    for anchor in anchors:
        table, T = anchor.experiment.rsplit("-T", 1)
        sd = boltzmann.PAPER_SOFTMAX_SD[table][int(T)]
        numbers = {"lm": boltzmann.PAPER_LM, "brackets": boltzmann.PAPER_BRACKETS,
                   "brackets-noffn": boltzmann.PAPER_BRACKETS_NO_FFN}[table][int(T)]
        gain = abs(numbers[1] - numbers[0])  # h+J against softmax
        assert anchor.tolerance == pytest.approx(min(2 * sd, gain / 2)) and anchor.tolerance < gain
        assert f"standard deviations of {sd:g}" in anchor.basis
