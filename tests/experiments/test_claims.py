import math
import re
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import t

from attnlab.lab.claim_plots import COLOURS, plot_claims
from attnlab.lab.claims import (
    VERDICTS,
    Anchor,
    Claim,
    Ratio,
    Verdict,
    anchors_of,
    failed_calibrations,
    judge,
    paired_deltas,
    transferred,
)
from attnlab.lab.stats import (
    MAX_SEEDS,
    detectable_effect,
    holm,
    mean_interval,
    paired_difference,
    seeds_needed,
    t_quantile,
    t_test_p,
)
from attnlab.lab.store import Results, RunKey
from attnlab.lab.verdict_table import verdict_table
from attnlab.lab.verdicts import calibration_lines, engagement_lines, evaluate, token_interval
from helpers import add_runs, centred_noise, change, lower, toy_results, two_arms


def table(claims: list[Claim], results: Results, *args) -> list[str]:
    """The verdict table of these claims judged on these results."""
    return verdict_table(evaluate(claims, results), *args)


def equal(margin: float = 0.5) -> Claim:
    return Claim("h+J matches softmax", "lm", "val_ppl", "hJ", "softmax", "equal", margin=margin)


# verdicts for "lower" / "higher" claims


def test_a_clear_effect_in_the_claimed_direction_agrees():
    v = judge(paired_deltas(lower(paper=-1.0), two_arms(-1.0, 0.05)), lower(paper=-1.0))
    assert v.verdict == "agrees" and v.n == 5 and v.delta == pytest.approx(-1.0) and v.high < 0


@pytest.mark.parametrize("paper, delta, word, says", [
    (-1.0, -3.0, "agrees in sign; larger than the paper's", "above the paper's -1 in size"),
    (-1.0, -0.4, "agrees in sign; smaller than the paper's", "below the paper's -1 in size"),
    (-1.0, -1.0, "agrees", "contains the paper's effect"),
    (None, -3.0, "agrees", "the interval lies on the claimed side of 0"),  # no effect of the paper's to size by
])
def test_an_effect_on_the_claimed_side_is_sized_against_the_papers(paper, delta, word, says):
    for direction, sign in (("lower", 1), ("higher", -1)):  # a higher claim: the same sizes, mirrored
        claim = lower(paper=None if paper is None else sign * paper, direction=direction)
        v = judge(paired_deltas(claim, two_arms(sign * delta, 0.05)), claim)
        assert v.verdict == word and says.replace("-1", f"{sign * -1:+g}") in v.reason
        if paper is not None and word != "agrees":  # the interval excludes the paper's effect, on the claimed side
            assert not v.low <= claim.target <= v.high and sign * v.high < 0


def test_a_clear_effect_in_the_opposite_direction_is_opposite():
    claim = lower(paper=-1.0)
    v = judge(paired_deltas(claim, two_arms(+1.0, 0.05)), claim)
    assert v.verdict == "opposite" and v.low > 0 and "other side" in v.reason
    higher = Claim("softmax is worse", "lm", "val_ppl", "hJ", "softmax", "higher")
    assert judge(paired_deltas(higher, two_arms(-1.0, 0.05)), higher).verdict == "opposite"


def test_a_tight_interval_around_zero_that_excludes_the_papers_effect_is_smaller_than_the_papers():
    claim = lower(paper=-1.0)
    v = judge(paired_deltas(claim, two_arms(0.0, 0.02)), claim)
    assert v.low < 0 < v.high and v.verdict == "smaller than the paper's" and "excludes the paper's effect" in v.reason
    assert judge(paired_deltas(lower(), two_arms(0.0, 0.02)), lower()).verdict == "inconclusive"  # no paper effect


def test_a_noisy_small_effect_is_inconclusive():
    claim = lower(paper=-0.2)
    v = judge(paired_deltas(claim, two_arms(-0.1, 1.0)), claim)
    assert v.low < -0.2 and v.high > 0 and v.verdict == "inconclusive"


# "equal" claims


@pytest.mark.parametrize("delta, sd, verdict", [
    (0.1, 0.05, "agrees"),  # interval inside ±0.5
    (2.0, 0.05, "opposite"),  # wholly above +0.5
    (-2.0, 0.05, "opposite"),  # wholly below -0.5
    (0.4, 0.5, "inconclusive"),  # straddles +0.5
])
def test_equal_claims(delta, sd, verdict):
    v = judge(paired_deltas(equal(), two_arms(delta, sd)), equal())
    assert v.verdict == verdict and v.delta == pytest.approx(delta)


def test_a_claim_is_checked_when_declared():
    with pytest.raises(ValueError, match="margin"):
        Claim("same", "lm", "val_ppl", "hJ", "softmax", "equal")
    with pytest.raises(ValueError, match="not lower"):
        lower(paper=+1.0)
    with pytest.raises(ValueError, match="direction"):
        Claim("same", "lm", "val_ppl", "hJ", "softmax", "smaller")


# how Δ is formed


def test_ratio_metrics_are_formed_per_run():
    results = add_runs(toy_results(), "ext", "softmax", [20.0, 30.0], "ppl@448")
    add_runs(results, "ext", "softmax", [10.0, 10.0], "ppl@128")
    add_runs(results, "ext", "hJ", [11.0, 12.0], "ppl@448")
    add_runs(results, "ext", "hJ", [10.0, 10.0], "ppl@128")
    claim = Claim("h+J extrapolates", "ext", Ratio("ppl@448", "ppl@128"), "hJ", "softmax", "lower")
    assert paired_deltas(claim, results) == pytest.approx([1.1 - 2.0, 1.2 - 3.0])
    upside_down = replace(claim, metric=Ratio("ppl@128", "ppl@448"))
    assert paired_deltas(upside_down, results) == pytest.approx([10 / 11 - 10 / 20, 10 / 12 - 10 / 30])
    assert "Δ = hJ − softmax in ppl@448/ppl@128 on ext" in table([claim], results)[2]
    # a growth claim's second transfer reads our loss at the training length: the ratio's denominator
    growth = replace(claim, paper=-0.5, chars_per_token=4.0, paper_ppl=math.exp(3), paper_growths=(1.5, 2.0))
    assert growth.exponent("the same fraction of the loss", results) == pytest.approx(math.log(10) / 3)


def test_a_ratio_is_declared_as_one_with_both_keys():
    with pytest.raises(ValueError, match=re.escape("Ratio('ppl@448', 'ppl@128'), not 'ppl@448/ppl@128'")):
        Claim("h+J extrapolates", "ext", "ppl@448/ppl@128", "hJ", "softmax", "lower")
    with pytest.raises(ValueError, match="Ratio"):
        Anchor("ext", "softmax", "ppl@448/ppl@128", paper=2.0, tolerance=0.1)
    with pytest.raises(ValueError, match="two results keys"):
        Ratio("ppl@448", "")


def test_relative_deltas_are_in_percent_of_the_baseline():
    results = add_runs(add_runs(toy_results(), "lm", "softmax", [10.0, 20.0, 40.0]), "lm", "hJ", [9.5, 19.0, 38.4])
    claim = lower(paper=-3.0, relative=True)
    assert paired_deltas(claim, results) == pytest.approx([-5.0, -5.0, -4.0])
    with pytest.raises(ValueError, match="relative"):
        Claim("x", "lm", "val_ppl", "hJ", None, "lower", relative=True)


def test_scale_puts_accuracies_in_percentage_points():
    results = add_runs(toy_results(), "task", "softmax", [0.90, 0.92], "accuracy")
    add_runs(results, "task", "hJ", [0.93, 0.94], "accuracy")
    claim = Claim("h+J is more accurate", "task", "accuracy", "hJ", "softmax", "higher", paper=2.0, scale=100)
    assert paired_deltas(claim, results) == pytest.approx([3.0, 2.0])


def test_a_contrast_is_the_difference_of_the_gaps_in_two_experiments():
    results = two_arms(-0.1, 0.05, experiment="small")
    results.records.update(two_arms(-0.5, 0.05, seed=7, experiment="large").records)
    claim = Claim("the gap grows with scale", "large", "val_ppl", "hJ", "softmax", "lower", contrast="small")
    deltas = paired_deltas(claim, results)
    assert len(deltas) == 5 and sum(deltas) / 5 == pytest.approx(-0.4)

    def ppl(experiment: str, arm: str) -> float:
        return results.get(RunKey(experiment, arm, seed=2)).values["val_ppl"]

    assert deltas[2] == pytest.approx(ppl("large", "hJ") - ppl("large", "softmax") - ppl("small", "hJ")
                                      + ppl("small", "softmax"))
    assert judge(deltas, claim).verdict == "agrees"


def test_without_a_baseline_the_arms_value_is_compared_with_zero():
    results = add_runs(toy_results(), "couplings", "hJ", [0.3 + x for x in centred_noise(1, 4, 0.02)], "J@3")
    claim = Claim("J is positive at distance 3", "couplings", "J@3", "hJ", None, "higher")
    v = judge(paired_deltas(claim, results), claim)
    assert v.n == 4 and v.delta == pytest.approx(0.3) and v.verdict == "agrees"


def test_seeds_with_a_missing_value_are_left_out():
    results = two_arms(-1.0, 0.05, n=5)
    key = RunKey("lm", "hJ", seed=1)
    change(results, key, values={**results.get(key).values, "val_ppl": None})  # never reached
    results = results.without({RunKey("lm", "softmax", seed=3)})  # never run
    arm, base = results.by_seed("lm", "hJ", "val_ppl"), results.by_seed("lm", "softmax", "val_ppl")
    assert sorted(base) == [0, 1, 2, 4]
    assert paired_deltas(lower(), results) == pytest.approx([arm[s] - base[s] for s in (0, 2, 4)])


def test_one_seed_is_inconclusive():
    claim = lower(paper=-1.0)
    v = judge(paired_deltas(claim, two_arms(-1.0, 0.05, n=1)), claim)
    assert v.verdict == "inconclusive" and v.n == 1 and math.isnan(v.low) and v.seeds_needed is None
    assert judge([], claim).verdict == "inconclusive"


# power


def test_detectable_effect_has_80_percent_power():
    for n in (2, 3, 10):  # simulated paired t-tests at that effect reject about 80% of the time
        d = detectable_effect(2.0, n)
        draws = np.random.default_rng(n).normal(d, 2.0, size=(40_000, n))
        statistic = draws.mean(1) / (draws.std(1, ddof=1) / math.sqrt(n))
        assert np.mean(np.abs(statistic) > t.ppf(0.975, n - 1)) == pytest.approx(0.8, abs=0.01)


def test_equivalence_detectable_margin_holds_the_interval_inside_it_80_percent_of_the_time():
    n, sd = 8, 1.0
    m = detectable_effect(sd, n, equivalence=True)
    draws = np.random.default_rng(0).normal(0.0, sd, size=(20_000, n))  # true Δ = 0
    mean, half = draws.mean(1), t.ppf(0.975, n - 1) * draws.std(1, ddof=1) / math.sqrt(n)
    assert np.mean((mean - half >= -m) & (mean + half <= m)) == pytest.approx(0.8, abs=0.02)


def test_judge_reports_power_from_the_observed_spread():
    claim = lower(paper=-0.3)
    deltas = [-0.1 + x for x in centred_noise(3, 3, 0.4)]
    v = judge(deltas, claim)
    sd = float(np.std(deltas, ddof=1))
    assert v.detectable == pytest.approx(detectable_effect(sd, 3))
    needed = v.seeds_needed
    assert needed > 3 and detectable_effect(sd, needed) <= 0.3 < detectable_effect(sd, needed - 1)


def test_seeds_needed_edge_cases():
    assert seeds_needed(1.0, 1e-4) == MAX_SEEDS + 1  # more than the search covers
    assert seeds_needed(0.0, 1.0) is None and seeds_needed(float("nan"), 1.0) is None
    assert seeds_needed(1.0, 100.0) == 2
    assert judge([0.1, 0.2, 0.3], lower()).seeds_needed is None  # the paper gives no effect


def test_t_quantiles_replace_the_table():
    assert t_quantile(0.975, 1) == pytest.approx(12.706, abs=1e-3)
    assert t_quantile(0.975, 10) == pytest.approx(2.228, abs=1e-3)
    values = [0.1 * i for i in range(15)]  # 14 degrees of freedom, beyond the old table
    mean, half = mean_interval(values)
    assert half == pytest.approx(2.145 * np.std(values, ddof=1) / math.sqrt(15), rel=1e-3)
    assert paired_difference([2.0, 3.0], [1.0, 1.0]) == pytest.approx((1.5, 12.706 * 0.5**0.5 / 2**0.5), rel=1e-4)


# the table and the figure


def suite_claims_and_results() -> tuple[list[Claim], Results]:
    results = two_arms(-1.0, 0.05, n=3)
    add_runs(results, "task", "softmax", [0.90, 0.92, 0.91], "accuracy")
    add_runs(results, "task", "hJ", [0.905, 0.921, 0.915], "accuracy")
    claims = [
        Claim("h+J beats softmax", "lm", "val_ppl", "hJ", "softmax", "lower", paper=-8.0, relative=True, headline=True),
        Claim("h+J is as accurate", "task", "accuracy", "hJ", "softmax", "equal", margin=1.0, scale=100),
        Claim("h+J is more accurate", "task", "accuracy", "hJ", "softmax", "higher", paper=0.002, scale=100),
    ]
    return claims, results


def test_verdict_table_rows_hold_the_computed_numbers():
    claims, results = suite_claims_and_results()
    lines = table(claims, results)
    assert lines[0].startswith("| claim | paper |") and len(lines) == 2 + len(claims)
    for line, (claim, v) in zip(lines[2:], evaluate(claims, results), strict=True):
        unit = "%" if claim.relative else ""
        ours = line.split(" | ")[2]  # "Δ [low, high]", rounded to two significant digits of the half-width
        shown = [float(x) for x in re.findall(r"[-+][\d.]+", ours)]
        assert shown == pytest.approx([v.delta, v.low, v.high], abs=0.1 * (v.high - v.low) / 2)
        assert ours.count("%") == (3 if claim.relative else 0)
        assert f"**{v.verdict}**" in line and f"detects ≥ {v.detectable:.2g}{unit} (n = {v.n})" in line
    assert lines[2].startswith("| **h+J beats softmax**") and "-8%" in lines[2]
    assert "within ±1" in lines[3] and "the margin needs" in lines[3]
    assert f"the paper's effect needs more than {MAX_SEEDS:,} seeds" in lines[4]
    one_seed = Claim("J is positive", "couplings", "J@3", "hJ", None, "higher")
    row = table([one_seed], add_runs(toy_results(), "couplings", "hJ", [1.0], "J@3"))[2]
    assert row.endswith("| – | +1 (1 seed) | **inconclusive**: 1 seed(s) with values: no interval | – |")


def test_a_verdict_from_fewer_seeds_than_planned_is_interim():
    claim = lower(paper=-1.0)
    results = two_arms(-1.0, 0.05, n=4)
    assert "**agrees** (*interim*, 4 of 10 planned seeds):" in table([claim], results, lambda c: 10)[2]
    for planned in (lambda c: 4, lambda c: None):  # every planned seed in, or no plan known
        assert "**agrees**: " in table([claim], results, planned)[2]


def test_plot_claims_writes_a_png(tmp_path):
    claims, results = suite_claims_and_results()
    path = plot_claims(evaluate(claims, results), tmp_path / "claims.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_a_claim_whose_control_arm_did_not_learn_the_task_is_inconclusive():
    runs = {f"mqar/{arm}/{seed}": {"accuracy": acc + 0.01 * seed * (2 if arm == "ccq-gla" else 1)}
            for arm, acc in [("softmax", 0.40), ("gla", 0.10), ("ccq-gla", 0.30)] for seed in range(3)}
    claim = Claim("CCQ-GLA beats GLA", "mqar", "accuracy", "ccq-gla", "gla", "higher", scale=100,
                  control=("softmax", "accuracy", 0.99))
    [(_, v)] = evaluate([claim], Results({"runs": runs}))
    assert v.verdict == "inconclusive" and "softmax reached 0.41" in v.reason and v.delta == pytest.approx(21)
    for seed in range(3):
        runs[f"mqar/softmax/{seed}"]["accuracy"] = 0.995
    assert evaluate([claim], Results({"runs": runs}))[0][1].verdict == "agrees"


def test_arms_that_score_alike_in_every_seed_are_inconclusive_not_a_disagreement():
    runs = {f"niah/{arm}/{seed}": {"niah@256": 0.5} for arm in ("gla", "ccq-gla") for seed in range(3)}
    claim = Claim("CCQ helps", "niah", "niah@256", "ccq-gla", "gla", "higher", 29.6, scale=100)
    [(_, v)] = evaluate([claim], Results({"runs": runs}))
    assert v.verdict == "inconclusive" and "no spread" in v.reason
    row = table([claim], Results({"runs": runs}))[2]
    assert row.endswith("| unknown: no spread (n = 3) |")  # not "detects ≥ 0": no spread sizes nothing


def test_power_beyond_what_an_accuracy_can_show_says_so():
    runs = {"niah/gla/0": {"niah@128": 0.98}, "niah/gla/1": {"niah@128": 0.0}, "niah/gla/2": {"niah@128": 0.5},
            "niah/ccq-gla/0": {"niah@128": 1.0}, "niah/ccq-gla/1": {"niah@128": 0.68},
            "niah/ccq-gla/2": {"niah@128": 0.45}}  # Δ = +2, +68 and -5 points
    claim = Claim("CCQ helps", "niah", "niah@128", "ccq-gla", "gla", "higher", 49, scale=100)
    row = table([claim], Results({"runs": runs}))[2]
    assert re.search(r"\| no effect the metric can show \(≥ [\d.e+]+ needed, n = 3\); the paper's effect needs", row)
    wider = [{**r, "niah@128": r["niah@128"] / 10} for r in runs.values()]  # a tenth of the spread: sizable
    row = table([claim], Results({"runs": dict(zip(runs, wider, strict=True))}))[2]
    assert re.search(r"\| detects ≥ [\d.]+ \(n = 3\)", row)


# the checks before judging, and every verdict word


def test_two_seeds_give_an_interval_but_no_verdict_and_no_power():
    claim = lower(paper=-1.0)
    v = judge(paired_deltas(claim, two_arms(-1.0, 0.05, n=2)), claim)
    assert v.verdict == "inconclusive" and "2 seeds: a verdict needs 3" in v.reason and v.low < v.high < 0
    assert "unknown: 2 seeds" in table([claim], two_arms(-1.0, 0.05, n=2))[2]


def test_a_per_token_effect_is_judged_per_character():
    assert 100 * (transferred(1 - 0.0675, 1 / 4.0) - 1) == pytest.approx(100 * (0.9325 ** 0.25 - 1))  # about -1.73%
    claim = lower(paper=-6.75, relative=True, chars_per_token=4.0)
    assert claim.target == pytest.approx(-1.731, abs=1e-3)
    # Δ = -1.6% ± a little: short of the paper's -6.75% per token, but the paper's effect per character
    results = two_arms(-0.16, 0.02)  # baseline about 10: -0.16 is -1.6%
    v = evaluate([claim], results)[0][1]
    assert v.verdict == "agrees"
    assert evaluate([lower(paper=-1.6, relative=True)], two_arms(0.0, 0.002))[0][1].verdict == \
        "smaller than the paper's"
    assert "-6.75% per token → **-1.73% per character**" in table([claim], results)[2]
    with pytest.raises(ValueError, match="relative perplexity or a growth factor"):
        lower(paper=-1.0, chars_per_token=4.0)


def test_an_equal_claims_per_token_margin_is_converted_by_the_same_function():
    claim = Claim("h+J matches softmax", "lm", "val_ppl", "hJ", "softmax", "equal", margin=1.0, relative=True,
                  chars_per_token=4.0)
    assert claim.threshold == pytest.approx(100 * (1.01**0.25 - 1))
    results = two_arms(0.05, 0.01)  # +0.5%: inside ±1% per token, outside ±0.249% per character
    v = evaluate([claim], results)[0][1]
    assert v.verdict == "opposite" and "outside ±0.249%" in v.reason
    assert "within ±1% per token → **±0.249% per character**" in table([claim], results)[2]
    growth = Claim("flat", "x", Ratio("ppl@4", "ppl@1"), "ia", "softmax", "equal", 0.0, margin=0.04,
                   chars_per_token=4.0, paper_growths=(1.2, 1.2))
    assert growth.threshold == pytest.approx(1.04**0.25 - 1)
    assert growth.in_our_units(0.5).margin == pytest.approx(1.04**0.5 - 1)


def test_a_per_token_claim_is_judged_under_both_transfer_assumptions():
    # the paper's baseline at perplexity e^3 per token (3 nats), ours about 10 per character (2.3 nats): under the
    # same fraction of the loss e = ln 10 / 3 = 0.77, so -6.75% per token is -5.2% per character, not -1.73%
    claim = lower(paper=-6.75, relative=True, chars_per_token=4.0, paper_ppl=math.exp(3))
    results = two_arms(-0.17, 0.02)  # -1.7%: the first assumption's effect, well short of the second's
    assert claim.exponent("the same fraction of the loss", results) == pytest.approx(math.log(10) / 3, abs=1e-3)
    v = evaluate([claim], results)[0][1]
    assert v.verdict == "agrees" and v.other[0] == "agrees in sign; smaller than the paper's"
    assert v.other[1] == pytest.approx(100 * (0.9325 ** (math.log(10) / 3) - 1), abs=0.01)
    row = table([claim], results)[2]
    assert "*the transfer assumptions differ*: under the same fraction of the loss, **agrees in sign; smaller" in row
    assert f"{v.other[1]:+.3g}% (the same fraction of the loss)" in row and f"{v.other[1]:+.2g}" == "-5.2"
    same = table([claim], two_arms(0.3, 0.02))[2]  # +3%: the other side under both
    assert "**opposite** (the same under both transfer assumptions)" in same
    unknown = replace(claim, paper_ppl=None)  # the paper gives no perplexity: the first assumption alone
    assert evaluate([unknown], results)[0][1].other is None
    assert "transfer" not in table([unknown], results)[2].split("|")[4]


@pytest.mark.parametrize("direction, paper, margin, arm, base, untestable", [
    ("higher", 30.0, None, 0.099, 0.098, "floor"),  # both at chance: neither learned what separates them
    ("higher", 30.0, None, 0.0, 0.0, "floor"),  # both at 0%
    ("higher", 30.0, None, 0.5, 0.098, None),  # the arm learned: 40 points above the floor
    ("equal", None, 5.0, 1.0, 0.999, "ceiling"),  # both at 100% under an equal claim: they agree whatever they are
    ("equal", None, 5.0, 0.9, 0.999, None),  # 10 points below the ceiling: parity is testable
    ("equal", None, 5.0, 0.02, 0.03, "floor"),
])
def test_arms_that_both_sit_at_a_bound_of_the_metric_are_untestable_here(direction, paper, margin, arm, base,
                                                                        untestable):
    results = add_runs(toy_results(), "t", "softmax", [base + d for d in (-1e-3, 0.0, 1e-3)], "accuracy")
    add_runs(results, "t", "ccq", [arm + d for d in (1e-3, -1e-3, 2e-3)], "accuracy")
    claim = Claim("ccq recalls as softmax", "t", "accuracy", "ccq", "softmax", direction, paper, margin=margin,
                  scale=100)
    v = evaluate([claim], results)[0][1]
    if untestable is None:
        assert v.verdict != "untestable here"
    else:
        assert v.verdict == "untestable here" and f"of the metric's {untestable}" in v.reason


def test_an_accuracy_gain_past_the_ceiling_is_untestable_here():
    results = add_runs(add_runs(toy_results(), "b", "softmax", [0.995, 0.994, 0.996]), "b", "hJ", [0.996, 0.993, 0.997],
                       "accuracy")
    add_runs(results, "b", "softmax", [0.995, 0.994, 0.996], "accuracy")
    claim = Claim("h+J beats softmax", "b", "accuracy", "hJ", "softmax", "higher", 1.55, scale=100)
    v = evaluate([claim], results)[0][1]
    assert v.verdict == "untestable here" and "softmax scores 99.5" in v.reason and "stops at 100" in v.reason
    room = Claim("h+J beats softmax", "b", "accuracy", "hJ", "softmax", "higher", 0.3, scale=100)
    assert evaluate([room], results)[0][1].verdict != "untestable here"  # 0.5 points of room for 0.3
    ratio = Claim("IA stays flat", "b", "accuracy", "hJ", "softmax", "lower", -0.5, bounds=(0.99, 2.0))
    assert evaluate([ratio], results)[0][1].verdict == "untestable here"  # cannot fall 0.5 below the floor


def test_a_baseline_off_the_papers_number_is_not_calibrated():
    results = two_arms(-1.0, 0.05)  # softmax around 10
    held = lower(paper=-1.0, calibration=(Anchor("lm", "softmax", "val_ppl", 10.0, 0.2),))
    missed = lower(paper=-1.0, calibration=(Anchor("lm", "softmax", "val_ppl", 9.0, 0.2),))
    (_, v_held), (_, v_missed) = evaluate([held, missed], results)
    assert v_held.verdict == "agrees"
    assert v_missed.verdict == "not calibrated" and "the paper 9: off by +1" in v_missed.reason
    assert Anchor("lm", "nobody", "val_ppl", 9.0, 0.2).check(results) == (None, "nobody on lm: no run yet (the "
                                                                              "paper: 9)")


def test_a_missed_calibration_decides_whatever_the_claims_seeds():
    results = add_runs(toy_results(), "lm", "softmax", [10.0, 10.1, 9.9])  # the baseline is in; the arm has no run
    missed = lower(paper=-1.0, calibration=(Anchor("lm", "softmax", "val_ppl", 9.0, 0.2),))
    v = evaluate([missed], results)[0][1]
    assert v.n == 0 and v.verdict == "not calibrated" and "off by +1" in v.reason
    held = lower(paper=-1.0, calibration=(Anchor("lm", "softmax", "val_ppl", 10.0, 0.2),))
    assert evaluate([held], results)[0][1].verdict == "inconclusive"  # no values, nothing known against the paper
    [line] = engagement_lines([replace(missed, ablation="ablated_ppl")], results)
    assert line == "- hJ on lm: not trained: the baseline is not calibrated"
    add_runs(results, "lm", "hJ", [9.5])  # one seed of the arm: not an interim verdict, the baseline decided it
    [row] = table([missed], results, lambda claim: 3)[2:]
    assert "**not calibrated**:" in row and "interim" not in row


def test_a_gap_claim_needs_both_experiments_calibrated():
    results = two_arms(-1.0, 0.05)
    add_runs(results, "short", "softmax", [12.0] * 5)
    add_runs(results, "short", "hJ", [12.0] * 5)
    here, there = Anchor("lm", "softmax", "val_ppl", 10.0, 0.2), Anchor("short", "softmax", "val_ppl", 11.0, 0.2)
    gap = lower(paper=-1.0, contrast="short", calibration=(here, there))
    v = evaluate([gap], results)[0][1]
    assert v.verdict == "not calibrated" and "softmax on short" in v.reason and "softmax on lm" not in v.reason
    assert evaluate([replace(gap, calibration=(here,))], results)[0][1].verdict != "not calibrated"
    assert [a.experiment for a in anchors_of([gap, gap])] == ["lm", "short"]


def test_a_calibration_fails_for_training_only_once_the_baseline_has_its_planned_seeds():
    results = add_runs(toy_results(), "lm", "softmax", [12.0, 12.1])
    anchor = Anchor("lm", "softmax", "val_ppl", 10.0, 0.2)
    assert failed_calibrations([anchor], results, lambda experiment, arm: 3) == {}  # a third seed may still come
    add_runs(results, "lm", "softmax", [12.0, 12.1, 11.9])
    failed = failed_calibrations([anchor], results, lambda experiment, arm: 3)
    assert list(failed) == ["lm"] and "outside the tolerance" in failed["lm"]
    [line] = calibration_lines([lower(calibration=(anchor,))], results, lambda experiment, arm: 3)
    assert line.endswith("its other arms are not trained")
    add_runs(results, "lm", "hJ", [11.0])
    [line] = calibration_lines([lower(calibration=(anchor,))], results, lambda experiment, arm: 3)
    assert line.endswith("the other arms trained before are shown, not judged")


def test_a_mechanism_whose_ablation_moves_less_than_the_effect_is_not_engaged():
    results = two_arms(-0.1, 0.01)  # hJ about 1% below softmax
    ablated = [v * 1.0002 for v in results.by_seed("lm", "hJ", "val_ppl").values()]
    add_runs(results, "lm", "hJ", ablated, "ablated_ppl")
    claim = lower(paper=-1.0, relative=True, ablation="ablated_ppl")
    v = evaluate([claim], results)[0][1]
    assert v.verdict == "mechanism not engaged" and "moves val_ppl by +0.02%" in v.reason
    engaged = [v * 1.6 for v in results.by_seed("lm", "hJ", "val_ppl").values()]
    add_runs(results, "lm", "hJ", engaged, "ablated_ppl")  # zeroing costs +60%: the model uses it
    assert evaluate([claim], results)[0][1].verdict == "agrees"


def test_an_arm_ablated_on_two_metrics_of_one_experiment_has_a_line_for_each():
    results = add_runs(toy_results(), "niah", "ccq", [0.9, 0.8, 0.85], "niah@128")
    add_runs(results, "niah", "ccq", [0.5, 0.4, 0.45], "ablated_niah@128")
    at = {length: Claim(f"ccq recalls at {length}", "niah", f"niah@{length}", "ccq", "gla", "higher", scale=100,
                        ablation=f"ablated_niah@{length}") for length in (128, 256)}
    lines = engagement_lines([at[128], at[128], at[256]], results)
    assert lines == ["- ccq on niah (niah@128): removing its own component at evaluation moves niah@128 by -40 "
                     "(seed 0), -40 (seed 1), -40 (seed 2)", "- ccq on niah (niah@256): not measured yet"]
    assert engagement_lines([at[128]], results)[0].startswith("- ccq on niah: ")


def test_an_arm_at_the_floor_of_its_metric_cannot_show_whether_it_uses_its_component():
    results = add_runs(toy_results(), "niah", "gla", [0.0, 0.0, 0.0], "niah@256")
    add_runs(results, "niah", "ccq", [0.0, 0.0, 0.0], "niah@256")
    add_runs(results, "niah", "ccq", [0.0, 0.0, 0.0], "ablated_niah@256")  # nothing below 0 to fall to
    claim = Claim("ccq recalls more", "niah", "niah@256", "ccq", "gla", "higher", paper=29.6, scale=100,
                  ablation="ablated_niah@256")
    v = evaluate([claim], results)[0][1]
    assert v.verdict == "untestable here" and "both score within 29.6 of the metric's floor" in v.reason
    [line] = engagement_lines([claim], results)
    assert line.endswith("(it scores 0, too near 0 to fall by 29.6: this cannot show whether it uses the component)")
    add_runs(results, "niah", "ccq", [0.6, 0.5, 0.7], "niah@256")  # learned: removing it could cost 60 points
    add_runs(results, "niah", "ccq", [0.6, 0.5, 0.69], "ablated_niah@256")
    assert evaluate([claim], results)[0][1].verdict == "mechanism not engaged"
    assert "too near 0" not in engagement_lines([claim], results)[0]


def test_parity_with_a_component_that_moves_less_than_the_margin_says_nothing_about_it():
    results = two_arms(0.0, 0.01)  # hJ at parity with softmax
    intact = list(results.by_seed("lm", "hJ", "val_ppl").values())
    add_runs(results, "lm", "hJ", [v * 1.005 for v in intact], "ablated_ppl")  # removing it costs 0.5%
    claim = Claim("h+J matches softmax", "lm", "val_ppl", "hJ", "softmax", "equal", paper=0.1, margin=1.0,
                  relative=True, ablation="ablated_ppl")
    v = evaluate([claim], results)[0][1]
    assert v.verdict == "mechanism not engaged" and "less than the margin ±1%" in v.reason
    add_runs(results, "lm", "hJ", [v * 1.05 for v in intact], "ablated_ppl")  # 5%: more than the paper's 0.1%
    assert evaluate([claim], results)[0][1].verdict == "agrees"


def test_every_verdict_word_is_produced_and_drawn(tmp_path):
    produced = set()
    for delta, sd in [(-1.0, 0.05), (1.0, 0.05), (0.0, 0.02), (-0.5, 2.0), (-0.4, 0.05), (-3.0, 0.05)]:
        produced.add(judge(paired_deltas(lower(paper=-1.0), two_arms(delta, sd)), lower(paper=-1.0)).verdict)
    produced |= {"untestable here", "not calibrated", "mechanism not engaged"}  # each shown above
    produced.add(evaluate([lower(paper=-1.0)], toy_results())[0][1].verdict)
    assert produced == set(VERDICTS) == set(COLOURS)


def test_engagement_and_calibration_lines_give_every_seed_and_every_anchor():
    results = two_arms(-0.1, 0.01, n=3)
    add_runs(results, "lm", "hJ", [v * 1.5 for v in results.by_seed("lm", "hJ", "val_ppl").values()], "ablated_ppl")
    claim = lower(paper=-1.0, relative=True, ablation="ablated_ppl",
                  calibration=(Anchor("lm", "softmax", "val_ppl", 10.0, 0.5),))
    [line] = engagement_lines([claim, claim], results)  # one line per arm, however many claims check it
    assert line.startswith("- hJ on lm: removing its own component") and line.count("+50% (seed") == 3
    assert "(seed 2)" in line
    [calibrated] = calibration_lines([claim, claim], results)
    assert calibrated.startswith("- calibrated: softmax on lm: ours 10") and "within the tolerance ±0.5" in calibrated


def test_a_claim_whose_calibration_has_no_run_yet_is_inconclusive():
    claim = lower(paper=-1.0, calibration=(Anchor("calibration", "softmax", "val_ppl", 10.0, 0.2),))
    v = evaluate([claim], two_arms(-1.0, 0.05))[0][1]
    assert v.verdict == "inconclusive" and "the calibration is not measured yet" in v.reason


def test_engagement_is_decided_by_the_median_seed_not_the_mean():
    results = two_arms(-1.0, 0.05, n=3)
    intact = list(results.by_seed("lm", "hJ", "val_ppl").values())
    # one seed's removal costs 50%, the other two 0.05% and 0.3%: the mean (+17%) would call it engaged
    add_runs(results, "lm", "hJ", [v * f for v, f in zip(intact, (1.5, 1.0005, 1.003), strict=True)], "ablated_ppl")
    claim = lower(paper=-10.0, relative=True, ablation="ablated_ppl")
    v = evaluate([claim], results)[0][1]
    assert v.verdict == "mechanism not engaged"
    assert "by +50%, +0.05%, +0.3% (3 seeds): the median seed's 0.3% is less than the paper's -10%" in v.reason
    add_runs(results, "lm", "hJ", [v * f for v, f in zip(intact, (1.5, 1.2, 1.003), strict=True)], "ablated_ppl")
    assert evaluate([claim], results)[0][1].verdict != "mechanism not engaged"  # two seeds of three move 20% or more


def test_a_missing_ablation_blocks_every_word_but_untestable():
    claim = lower(paper=-1.0, ablation="ablated_ppl")
    v = evaluate([claim], two_arms(-1.0, 0.05))[0][1]  # would agree; nothing says it uses its mechanism
    assert v.verdict == "inconclusive" and "has not been measured with its own component removed" in v.reason
    at_ceiling = Claim("ccq matches gdn", "mqar", "accuracy", "ccq", "gdn", "equal", margin=1.0, scale=100,
                       ablation="ablated_accuracy")
    results = add_runs(toy_results(), "mqar", "gdn", [1.0, 1.0, 0.999], "accuracy")
    add_runs(results, "mqar", "ccq", [1.0, 0.999, 1.0], "accuracy")
    assert evaluate([at_ceiling], results)[0][1].verdict == "untestable here"


def test_an_arm_without_a_component_of_its_own_is_named_a_control():
    claim = lower(paper=-1.0, control_arm="as specified, it attends uniformly")
    [row] = table([claim], two_arms(-1.0, 0.05))[2:]
    assert "**agrees** (hJ is a control: as specified, it attends uniformly, so it has no component" in row
    assert "no result of the mechanism's can fail this claim" in row


def test_holm_multiplies_the_ith_smallest_p_value_by_the_hypotheses_left():
    assert holm([0.01, 0.04, 0.02]) == pytest.approx([0.03, 0.04, 0.04])
    assert holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert holm([0.4, 0.3]) == pytest.approx([0.6, 0.6])  # never below the adjusted p-value before it
    assert holm([0.9, 0.8]) == [1.0, 1.0]  # capped at 1


def test_the_p_value_matches_the_interval_on_both_kinds_of_claim():
    for delta, sd in [(-1.0, 0.5), (-0.3, 0.5), (0.1, 0.2)]:
        results = two_arms(delta, sd)
        for claim in (lower(paper=-1.0), equal(0.5)):
            v = judge(paired_deltas(claim, results), claim)
            inside = -0.5 <= v.low and v.high <= 0.5
            assert (v.p < 0.05) == (inside if claim.direction == "equal" else v.low * v.high > 0)
    x = [-1.2, -0.9, -1.1, -0.8]
    mean, sd = np.mean(x), np.std(x, ddof=1)
    assert t_test_p(mean, sd, 4) == pytest.approx(2 * t.sf(abs(mean) / (sd / 2), 3))


def test_a_claim_shows_its_holm_corrected_p_value_over_the_suites_tested_claims_and_fails_it_where_they_do():
    results = two_arms(-1.0, 0.6, n=5)  # alone it clears 0 at 5% (p = 0.019)
    results.records.update(two_arms(-1.0, 0.05, experiment="other").records)  # p far below 0.01
    weak = lower(paper=-1.0, headline=True)
    strong = replace(weak, statement="h+J beats softmax elsewhere", experiment="other")
    judged = evaluate([weak, strong], results)
    assert judged[0][1].verdict == "agrees" and 0.01 < judged[0][1].p < 0.025
    rows = table([weak, strong], results)[2:]
    assert f"p = {judged[0][1].p:.2g}, Holm over 2 tested claims: {judged[0][1].p:.2g}" in rows[0]  # the larger: x 1
    assert "not significant after Holm" not in rows[0]
    # 3 x 0.019 > 0.05: headlines or not, every tested claim of the suite is in the family
    three = [weak, replace(weak, statement="again", headline=False), replace(weak, statement="and again")]
    rows = table(three, results)[2:]
    assert all("*not significant after Holm's correction* over the 3 tested claims: adjusted p = 0.057" in row
               for row in rows)
    assert "Holm over 1 tested claim: " in table([replace(weak, headline=False)], results)[2]
    untested = table([weak, replace(weak, statement="no seeds", experiment="none")], results)[2:]
    assert "Holm over 1 tested claim: " in untested[0] and "Holm" not in untested[1]


def test_an_interval_that_barely_clears_zero_is_fragile():
    fragile_results = two_arms(-1.0, 0.8, n=5)
    v = judge(paired_deltas(lower(paper=-1.0), fragile_results), lower(paper=-1.0))
    assert v.high < 0 and abs(v.high) < 0.2 * (v.high - v.low) / 2 and v.fragile
    [row] = table([lower(paper=-1.0)], fragile_results)[2:]
    assert "*fragile*: the interval clears 0 by" in row
    [row] = table([lower(paper=-1.0)], two_arms(-1.0, 0.05))[2:]
    assert "fragile" not in row


def test_engagement_on_a_per_character_claim_is_judged_against_the_converted_effect():
    # the paper's -6.75% per token is -1.73% per character: removing a component that costs 3% engages it there,
    # though 3% is under the per-token number
    claim = lower(paper=-6.75, relative=True, chars_per_token=4.0, ablation="ablated_ppl")
    results = two_arms(-0.17, 0.02)
    intact = list(results.by_seed("lm", "hJ", "val_ppl").values())
    add_runs(results, "lm", "hJ", [v * 1.03 for v in intact], "ablated_ppl")
    assert evaluate([claim], results)[0][1].verdict == "agrees"
    add_runs(results, "lm", "hJ", [v * 1.01 for v in intact], "ablated_ppl")  # 1%: under the converted 1.73%
    v = evaluate([claim], results)[0][1]
    assert v.verdict == "mechanism not engaged" and "less than the paper's -1.73%" in v.reason


@pytest.mark.parametrize("direction, paper, margin, arm, base", [
    ("equal", None, 5.0, 1.0, 0.5),  # the arm at the ceiling, its baseline halfway: the metric can tell them apart
    ("higher", 30.0, None, 0.9, 0.05),  # the baseline at the floor, the arm far above it
    ("lower", -30.0, None, 0.05, 0.9),  # the arm at the floor, the baseline far above it
])
def test_arms_far_apart_are_testable_even_where_one_sits_at_a_bound(direction, paper, margin, arm, base):
    claim = Claim("ccq vs gla", "task", "accuracy", "ccq", "gla", direction, paper, margin=margin, scale=100)
    results = add_runs(toy_results(), "task", "gla", [base - 0.01, base, base + 0.01], "accuracy")
    add_runs(results, "task", "ccq", [arm - 0.01, arm, min(arm + 0.01, 1.0)], "accuracy")
    assert evaluate([claim], results)[0][1].verdict != "untestable here"


def test_a_paired_token_bootstrap_gives_the_validation_samples_share_of_the_uncertainty():
    claim = lower(paper=-1.0, relative=True, headline=True)
    results = two_arms(-0.1, 0.02)
    rng = np.random.default_rng(1)
    for seed in range(5):
        base = rng.normal(2.0, 0.3, size=40)  # block losses that vary along the split
        arm, base_ppl = (results.by_seed("lm", label, "val_ppl")[seed] for label in ("hJ", "softmax"))
        shift = math.log(arm / base_ppl)
        change(results, RunKey("lm", "softmax", seed=seed), details={"val_blocks": list(base)})
        # the arm: the same blocks shifted by its seed's gap, plus block noise of its own
        blocks = base + shift + rng.normal(0, 0.001, 40)
        change(results, RunKey("lm", "hJ", seed=seed), details={"val_blocks": list(blocks)})
    tokens = token_interval(claim, results)
    (low, high), v = tokens.interval, evaluate([claim], results)[0][1]
    assert tokens.blocks == 40 and low < v.delta < high and high - low < 0.1  # paired: the block variation cancels
    assert f"the validation tokens alone (a paired bootstrap of 40 blocks): [{low:+.3g}%, {high:+.3g}%]" in \
        table([claim], results)[2]
    # seeds retrained to keep their blocks (reproduce --remeasure) are enough from MIN_SEEDS on, and say so
    change(results, RunKey("lm", "hJ", seed=0), details={})
    tokens = token_interval(claim, results)
    assert (tokens.seeds, tokens.paired) == (4, 5) and tokens.interval != (low, high)
    assert "a paired bootstrap of 40 blocks over the 4 of 5 seeds that keep them" in table([claim], results)[2]
    for seed in (1, 2):
        change(results, RunKey("lm", "softmax", seed=seed), details={})
    assert token_interval(claim, results).interval is None
    assert "the validation tokens alone: not measured (2 of 5 seeds keep them, 3 needed)" in \
        table([claim], results)[2]


# chance floors that the tasks declare


def test_each_task_declares_the_accuracy_a_model_reaches_without_learning_it():
    from attnlab.data import TASKS
    from attnlab.data.mqar import MQARConfig
    from attnlab.data.niah import NIAHConfig
    from attnlab.data.state_tracking import ParityConfig, S5Config

    pooled = MQARConfig(pairs=4, test_pairs=[1, 2, 4])  # one query of 1 pair, two of 2, four of 4: 3 right of 7
    assert TASKS["mqar"].floor(pooled, "accuracy").value == pytest.approx(3 / 7)
    assert TASKS["mqar"].floor(pooled, "pairs=2").value == 0.5
    assert TASKS["mqar"].floor(MQARConfig(pairs=16), "accuracy").value == 1 / 16
    assert TASKS["parity"].floor(ParityConfig(), "acc@64").value == 0.5
    assert TASKS["s5"].floor(S5Config(), "accuracy").value == 1 / 120
    assert TASKS["niah"].floor(NIAHConfig(kind="multikey", keys=4), "niah@512").value == 0.25
    assert TASKS["niah"].floor(NIAHConfig(), "niah@512") is None  # one needle: guessing its digits, ~0


def kv16(gla: list[float], ccq: list[float]) -> Results:
    return add_runs(add_runs(toy_results(), "kv16", "gla", gla, "accuracy"), "kv16", "ccq-gla", ccq, "accuracy")


def test_arms_near_a_chance_floor_above_zero_are_untestable_here():
    from attnlab.data import TASKS
    from attnlab.data.mqar import MQARConfig

    copying = TASKS["mqar"].floor(MQARConfig(pairs=16), "accuracy")  # 6.25%
    floors = lambda experiment, key: copying  # noqa: E731
    claim = Claim("CCQ-GLA beats GLA on MQAR", "kv16", "accuracy", "ccq-gla", "gla", "higher", scale=100)
    results = kv16([0.066, 0.068, 0.070], [0.064, 0.070, 0.069])  # a point above copying: Δ undetectable
    (_, blind), = evaluate([claim], results)
    (_, seen), = evaluate([claim], results, floors)
    assert blind.verdict == "inconclusive"  # 0 is the only floor a metric knows: 6.8% is far from it
    assert seen.verdict == "untestable here" and "6.25% (copying a value from the context)" in seen.reason
    assert f"(≥ {blind.detectable:.3g})" in seen.reason  # no paper effect: the bar is what these seeds detect
    under = evaluate([claim], kv16([0.03, 0.02, 0.025], [0.02, 0.035, 0.03]), floors)[0][1]
    assert under.verdict == "untestable here" and "at or under the task's chance floor" in under.reason
    learned = evaluate([claim], kv16([0.30, 0.32, 0.31], [0.40, 0.43, 0.41]), floors)[0][1]
    assert learned.verdict == "agrees"


def test_an_unmeasured_ablation_blocks_a_claim_without_a_papers_effect():
    claim = Claim("CCQ-GLA beats GLA on MQAR", "kv16", "accuracy", "ccq-gla", "gla", "higher", scale=100,
                  ablation="ablated_accuracy")
    results = kv16([0.50, 0.52, 0.49], [0.80, 0.81, 0.79])
    v = evaluate([claim], results)[0][1]
    assert v.verdict == "inconclusive" and "not been measured with its own component removed" in v.reason
    add_runs(results, "kv16", "ccq-gla", [0.5, 0.5, 0.5], "ablated_accuracy")
    assert evaluate([claim], results)[0][1].verdict == "agrees"


def test_a_claim_whose_experiment_has_not_run_reads_not_run_yet():
    claim = lower(paper=-1.0)
    v = evaluate([claim], toy_results())[0][1]
    assert v.verdict == "not run yet" and v.reason == "no run of hJ or softmax on lm yet"
    assert "**not run yet**: no run of hJ or softmax on lm yet" in table([claim], toy_results())[2]
    started = add_runs(toy_results(), "lm", "softmax", [10.0])  # one arm has run: no values yet, not "not run"
    assert evaluate([claim], started)[0][1].verdict == "inconclusive"


# the correction over a suite's claims and the sign-flip test


def test_a_headline_shows_its_exact_sign_flip_p_and_few_seeds_where_none_could_reach_the_level():
    from attnlab.lab.stats import fewest_seeds, sign_flip_p

    assert sign_flip_p([1.0, 2.0, 3.0]) == 0.25 and sign_flip_p([1.0, -1.0, 0.5]) == 1.0  # 2 of 8; all 8
    assert sign_flip_p([0.5, 1.0, 1.5, 2.0, 0.1, 3.0]) == pytest.approx(2 / 64)  # itself and all flipped
    assert sign_flip_p([0.5, 1.0, 1.5, 2.0, -0.1, 3.0]) == pytest.approx(4 / 64)  # flipping -0.1 goes further
    assert fewest_seeds(0.05) == 6  # 2 / 2^5 = 0.0625, 2 / 2^6 = 0.031
    headline = replace(lower(), headline=True)
    [row] = table([headline], two_arms(-1.0, 0.05, n=3))[2:]
    assert "; sign-flip p = 0.25" in row and "*few seeds*: with 3, the sign-flip test cannot go below p = 0.25" in row
    [row] = table([headline], two_arms(-1.0, 0.05, n=6))[2:]
    assert "; sign-flip p = 0.031" in row and "few seeds" not in row
    [row] = table([lower()], two_arms(-1.0, 0.05, n=3))[2:]
    assert "sign-flip" not in row and "few seeds" not in row  # beside headlines only


# the same claim under another protocol, and readings checked against one number


def test_a_claim_rerun_under_another_protocol_shows_both_and_says_where_the_protocol_decides():
    results = two_arms(-1.0, 0.05)
    results.records.update(two_arms(-3.0, 0.05, experiment="lm-patient").records)
    claim = lower(paper=-1.0, rerun="lm-patient")
    [row] = table([claim], results)[2:]
    assert "**agrees**" in row and "*the protocol decides*: on lm-patient, -3.000 [" in row
    assert "**agrees in sign; larger than the paper's**" in row
    same = two_arms(-1.0, 0.05)
    same.records.update(two_arms(-1.0, 0.05, seed=7, experiment="lm-patient").records)
    [row] = table([claim], same)[2:]
    assert "on lm-patient, -1.0" in row and "protocol decides" not in row
    anchored = replace(claim, calibration=(Anchor("lm", "softmax", "val_ppl", 10.0, 0.3),))
    moved = two_arms(-1.0, 0.05)
    moved.records.update(add_runs(toy_results(), "lm-patient", "softmax", [12.0] * 5).records)
    add_runs(moved, "lm-patient", "hJ", [11.0, 11.1, 10.9, 11.0, 11.05])
    [row] = table([anchored], moved)[2:]  # the anchor moves with the claim: its softmax misses 10 there
    assert "**not calibrated**: the baseline is not the paper's: softmax on lm-patient: ours 12" in row


def test_readings_of_an_experiment_conclude_whether_any_reproduces_the_papers_number():
    from attnlab.lab.verdicts import reading_lines

    anchors = [Anchor("h-only", label, "val_ppl", 6.03, 0.25) for label in ("summed", "unnormalised")]
    results = add_runs(toy_results(), "h-only", "summed", [5.62, 5.6, 5.64])
    assert reading_lines(anchors, results)[-1].startswith("- not yet run: unnormalised")  # no conclusion yet
    add_runs(results, "h-only", "unnormalised", [5.63, 5.64, 5.65])
    assert reading_lines(anchors, results)[-1] == ("- **h-only: no reading reproduces the paper's 6.03**: under "
                                                   "each of the 2 readings tried, ours lies outside the tolerance")
    add_runs(results, "h-only", "unnormalised", [6.0, 6.1, 6.05])
    assert reading_lines(anchors, results)[-1] == ("- **h-only: the paper's 6.03 is reproduced under unnormalised**, "
                                                   "of 2 readings tried")


def test_a_claim_of_an_experiment_only_a_gpu_runs_names_its_plan_until_it_has_runs():
    claim = lower(paper=-1.0)
    v = evaluate([claim], toy_results(), gpu={"lm": "scripts/gpu-science.sh"})[0][1]
    assert v.verdict == "not run yet" and v.reason.endswith(": GPU tier, run by scripts/gpu-science.sh")
    assert evaluate([claim], two_arms(-1.0, 0.05), gpu={"lm": "scripts/gpu-science.sh"})[0][1].verdict == "agrees"


# values that the rules read, each aimed at directly


def test_the_same_fraction_transfer_of_a_growth_claim_reads_the_baselines_loss_at_the_training_length():
    from attnlab.lab.claims import SAME_FRACTION

    claim = Claim("IA stays flat", "x", Ratio("ppl@448", "ppl@128"), "ia", "softmax", "lower", -0.5,
                  chars_per_token=4.0, paper_ppl=math.exp(3.0), paper_growths=(1.2, 1.5))
    results = add_runs(toy_results(), "x", "softmax", [math.exp(1.5)] * 3, "ppl@128")
    add_runs(results, "x", "softmax", [math.exp(2.4)] * 3, "ppl@448")  # the long length: not the loss that counts
    assert claim.exponent(SAME_FRACTION, results) == pytest.approx(1.5 / 3.0)


def test_fragile_measures_the_clearance_against_half_the_intervals_width():
    def verdict(low: float, high: float) -> Verdict:
        return Verdict(3, (low + high) / 2, low, high, "agrees", "", 0.1, None)

    assert not verdict(0.15, 1.15).fragile  # clears 0 by 0.15 of a half-width of 0.5: more than a fifth (0.1)
    assert verdict(0.05, 1.05).fragile and verdict(-1.05, -0.05).fragile
    assert not verdict(-0.5, 0.5).fragile  # an interval across 0 clears nothing


def test_engagement_is_the_median_size_of_the_moves_whatever_their_sign():
    results = two_arms(-1.0, 0.05, n=3)
    intact = list(results.by_seed("lm", "hJ", "val_ppl").values())
    claim = lower(paper=-1.0, relative=True, ablation="ablated_ppl")
    add_runs(results, "lm", "hJ", [v * f for v, f in zip(intact, (0.95, 0.95, 1.01), strict=True)], "ablated_ppl")
    assert evaluate([claim], results)[0][1].verdict != "mechanism not engaged"  # moves of -5%, -5%, +1%: 5% > 1%
    add_runs(results, "lm", "hJ", [v * f for v, f in zip(intact, (0.995, 1.05, 1.001), strict=True)], "ablated_ppl")
    assert evaluate([claim], results)[0][1].verdict == "mechanism not engaged"  # one seed's 5% does not engage it
