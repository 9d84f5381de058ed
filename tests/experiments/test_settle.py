import dataclasses

from attnlab.experiments import coupled_qk, gpu
from attnlab.experiments.claims import evaluate
from attnlab.experiments.settle import settle_lines
from attnlab.experiments.spec import Arm, Experiment, Suite
from helpers import add_runs, lower, two_arms

ARMS = [Arm("softmax", "demo", ["train.steps=300", "train.patience=3"]), Arm("hJ", "demo", ["train.steps=500"])]


def toy_suite(claim, name: str = "toy", experiment: str = "lm") -> Suite:
    return Suite(name, "a toy suite", [Experiment(experiment, "LM", "val_ppl", ARMS, "softmax")], claims=[claim])


def test_an_inconclusive_headline_claim_gets_the_seeds_and_cpu_hours_its_spread_asks_for():
    claim = lower(paper=-0.6, headline=True)
    results = two_arms(-0.3, 0.5, n=3)
    for record in results["runs"].values():
        record["seconds"] = 90.0
    (_, verdict), = evaluate([claim], results)
    assert verdict.verdict == "inconclusive" and verdict.seeds_needed > 3
    more_runs = 2 * (verdict.seeds_needed - 3)
    lines = settle_lines(toy_suite(claim), results)
    assert lines[0].startswith("**What would settle")
    text = lines[2]
    assert f"{verdict.seeds_needed} seeds (this run has 3) of softmax and hJ" in text
    assert "until it stops improving or reaches 500 steps" in text  # the larger cap of the two arms
    assert f"{more_runs} more runs, about {more_runs * 90 / 3600:.2g} CPU-hours at the 90 s" in text
    assert "no paper-scale tier" in text


def test_judged_or_secondary_claims_need_no_settling():
    results = two_arms(-1.0, 0.05, n=5)
    assert settle_lines(toy_suite(lower(paper=-1.0, headline=True)), results) == []  # agrees
    assert settle_lines(toy_suite(lower(paper=-0.6)), two_arms(-0.3, 0.5, n=3)) == []  # inconclusive, not a headline


def test_without_spread_or_a_learned_control_no_seed_count_is_made_up():
    flat = add_runs(add_runs({}, "lm", "softmax", [10.0, 10.0, 10.0]), "lm", "hJ", [10.0, 10.0, 10.0])
    text = settle_lines(toy_suite(lower(paper=-0.6, headline=True)), flat)[2]
    assert "spread that sizes a test is unknown" in text and "seeds (" not in text
    control = lower(paper=-0.6, headline=True, control=("softmax", "accuracy", 0.99))
    results = two_arms(-0.3, 0.5, n=3)
    add_runs(results, "lm", "softmax", [0.4, 0.5, 0.6], key="accuracy")
    text = settle_lines(toy_suite(control), results)[2]
    assert "must be learned first: softmax reached 0.5" in text and "seeds (" not in text


def test_the_paper_scale_figure_is_the_paper_tiers_estimate_for_that_many_seeds():
    claim = dataclasses.replace(lower(paper=-0.6, headline=True), experiment="lm")
    results = two_arms(-0.3, 0.5, n=3)
    (_, verdict), = evaluate([claim], results)
    hours = dict(gpu.estimate(coupled_qk.suite("paper"), seeds=verdict.seeds_needed))["lm"]
    text = settle_lines(toy_suite(claim, name=coupled_qk.NAME), results)[2]
    assert f"--tier paper --seeds {verdict.seeds_needed}`), its lm experiment is about {hours:,.0f} GPU-hours" in text
    missing = settle_lines(toy_suite(dataclasses.replace(claim, experiment="niah"), coupled_qk.NAME, "niah"),
                           {"runs": {k.replace("lm/", "niah/"): r for k, r in results["runs"].items()}})[2]
    assert "has no niah experiment" in missing


def test_a_cpu_sized_paper_protocol_is_named_not_costed_in_gpu_hours():
    text = settle_lines(toy_suite(lower(paper=-0.6, headline=True), name="boltzmann"), two_arms(-0.3, 0.5, n=3))[2]
    assert "The paper's own protocol is CPU-sized: `attnlab reproduce boltzmann --tier paper`" in text
