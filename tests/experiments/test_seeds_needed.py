import dataclasses

from attnlab.lab import estimate
from attnlab.lab.plan import plan_of
from attnlab.lab.seeds_needed import settle_lines
from attnlab.lab.spec import Arm, Changes, Experiment, Suite
from attnlab.lab.stats import MAX_SEEDS
from attnlab.lab.store import Results
from attnlab.lab.verdicts import evaluate
from attnlab.papers import coupled_qk
from helpers import add_runs, change, lower, toy_results, two_arms

ARMS = [Arm("softmax", "demo", Changes.train(steps=300, patience=3)), Arm("hJ", "demo", Changes.train(steps=500))]


def toy_suite(claim, name: str = "toy", experiment: str = "lm", arms=ARMS) -> Suite:
    return Suite(name, "a toy suite", [Experiment(experiment, "LM", "val_ppl", arms, "softmax")], claims=[claim])


def settle(suite: Suite, results: Results) -> list[str]:
    """The report's lines on what would settle the suite's inconclusive headlines."""
    return settle_lines(suite, evaluate(suite.claims, results), results, plan_of(suite, results))


def open_claim(n: int = 3, seconds: float = 90.0) -> tuple:
    """An inconclusive headline claim (Δ half the paper's, at a spread that needs more than 3 seeds)."""
    claim, results = lower(paper=-0.6, headline=True), two_arms(-0.3, 0.5, n=n)
    for key, _ in results.items():
        change(results, key, seconds=seconds)
    (_, verdict), = evaluate([claim], results)
    return claim, results, verdict


def test_an_inconclusive_headline_claim_gets_the_seeds_and_hours_its_spread_asks_for():
    claim, results, verdict = open_claim()
    assert verdict.verdict == "inconclusive" and verdict.seeds_needed > 3
    more_runs = 2 * (verdict.seeds_needed - 3)
    lines = settle(toy_suite(claim), results)
    assert lines[0].startswith("**What would settle")
    text = lines[2]
    assert f"{verdict.seeds_needed} seeds (this run has 3): {more_runs} more runs of hJ and softmax" in text
    assert "of at most 500 steps," in text and "stopping early" not in text  # one arm has no early stopping
    assert f"about {more_runs * 90 / 3600:.2g} hours on this machine at the 90 s a run took here" in text
    assert "no paper-scale tier" in text
    stopping = [dataclasses.replace(a, changes=a.changes | Changes.train(patience=2)) for a in ARMS]
    assert "500 steps, each stopping early once it stops improving" in settle(toy_suite(claim, arms=stopping),
                                                                              results)[2]


def test_runs_that_measured_an_earlier_model_do_not_count_as_run_time():
    claim, results, _ = open_claim()
    first, _ = next(results.items())
    change(results, first, seconds=2.0, trained=False)  # measured again from a model trained before
    assert "at the 90 s a run took here" in settle(toy_suite(claim), results)[2]


def test_a_run_with_the_seeds_the_paper_needs_is_not_sent_for_more():
    claim, results = lower(paper=-1.0, headline=True), two_arms(-0.5, 1.0, n=12)
    (_, verdict), = evaluate([claim], results)
    assert verdict.verdict == "inconclusive" and verdict.seeds_needed <= 12
    text = settle(toy_suite(claim), results)[2]
    assert f"this run has the {verdict.seeds_needed} seeds that the paper's effect needs" in text
    assert "more runs" not in text


def test_judged_secondary_and_smoke_claims_need_no_settling():
    results = two_arms(-1.0, 0.05, n=5)
    assert settle(toy_suite(lower(paper=-1.0, headline=True)), results) == []  # agrees
    claim, results, _ = open_claim()
    assert settle(toy_suite(lower(paper=-0.6)), results) == []  # inconclusive, not a headline
    smoke = Results({**results.to_json(), "quick": True})
    assert settle(toy_suite(claim), smoke) == []  # a smoke run sizes nothing


def test_without_spread_a_learned_control_or_reach_no_seed_count_is_made_up():
    flat = add_runs(add_runs(toy_results(), "lm", "softmax", [10.0, 10.0, 10.0]), "lm", "hJ", [10.0, 10.0, 10.0])
    text = settle(toy_suite(lower(paper=-0.6, headline=True)), flat)[2]
    assert "spread that sizes a test is unknown" in text and "seeds (" not in text
    control = lower(paper=-0.6, headline=True, control=("softmax", "accuracy", 0.99))
    results = two_arms(-0.3, 0.5, n=3)
    add_runs(results, "lm", "softmax", [0.4, 0.5, 0.6], key="accuracy")
    text = settle(toy_suite(control), results)[2]
    assert "must be learned first: softmax reached 0.5" in text and "seeds (" not in text
    tiny = lower(paper=-1e-4, headline=True)  # an effect far below the spread
    text = settle(toy_suite(tiny), two_arms(-0.3, 0.5, n=3))[2]
    assert f"more than {MAX_SEEDS:,} seeds" in text and "more runs" not in text


def test_the_paper_scale_figure_is_the_paper_tiers_estimate_for_that_many_seeds():
    claim, results, verdict = open_claim()
    hours = dict(estimate.estimate(coupled_qk.suite("paper"), seeds=verdict.seeds_needed))["lm"]
    text = settle(toy_suite(claim, name=coupled_qk.NAME), results)[2]
    assert f"--tier paper --seeds {verdict.seeds_needed}`), about {hours:,.0f} GPU-hours" in text
    niah = dataclasses.replace(claim, experiment="niah")
    renamed = Results({"suite": "toy", "runs": {str(dataclasses.replace(k, experiment="niah")): r.to_json()
                                                for k, r in results.items()}})
    assert "has no niah experiment" in settle(toy_suite(niah, coupled_qk.NAME, "niah"), renamed)[2]


def test_a_cpu_sized_paper_protocol_is_named_not_costed_in_gpu_hours():
    claim, results, verdict = open_claim()
    text = settle(toy_suite(claim, name="boltzmann"), results)[2]
    expected = "The paper's own protocol is CPU-sized: `attnlab reproduce boltzmann --tier paper --seeds "
    assert expected + f"{verdict.seeds_needed}`" in text


def test_two_seeds_size_nothing_the_third_comes_first():
    claim, results, verdict = open_claim(n=2)
    assert verdict.seeds_needed is None  # a spread with one degree of freedom sizes no test
    text = settle(toy_suite(claim), results)[2]
    assert "first the seeds a verdict needs (3; this run has 2)" in text and "more runs" not in text
