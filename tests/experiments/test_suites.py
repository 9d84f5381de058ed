"""Every suite runs end to end in a reduced form and writes a report with all its tables and plots."""

import contextlib
import json
import math
import shutil
from pathlib import Path

import pytest

from attnlab import checkpoint
from attnlab.commands.results import results_summary
from attnlab.errors import ConfigError, UserError
from attnlab.evaluate import block_losses, perplexity_by_length, whole_split_loss
from attnlab.inference import load_run
from attnlab.lab import report, verdict_table
from attnlab.lab.claims import Anchor, Claim
from attnlab.lab.configs import Settings
from attnlab.lab.driver import run_suite
from attnlab.lab.job import measure, training_extent
from attnlab.lab.metrics import get_metric, tokens_to_loss
from attnlab.lab.plan import Plan, plan, plan_of
from attnlab.lab.report import update_readme, write_report
from attnlab.lab.spec import (
    ABLATED,
    UNCHANGED,
    Arm,
    Changes,
    Experiment,
    Suite,
    ablated,
)
from attnlab.lab.stats import mean_std, paired_difference
from attnlab.lab.store import Record, Results, RunKey
from attnlab.lab.sweeps import SharedRate, pair_rates, sweep_rates
from attnlab.lab.training_notes import training_table
from attnlab.lab.verdicts import evaluate
from attnlab.papers import SUITES, get_suite
from attnlab.train import train
from helpers import Crash, crash_after_checkpoint, two_arms


def training_lines(suite: Suite, experiment: Experiment, results: Results) -> list[str]:
    """The report's training notes of one experiment, as the report would write them."""
    return training_table(suite, experiment, results, plan_of(suite, results))


def runs_of(results: Results) -> dict[str, dict]:
    """The records by their keys as results.json writes them."""
    return {str(key): record.to_json() for key, record in results.items()}


README_START, README_END = "<!-- results: start -->", "<!-- results: end -->"
TINY = ["train.steps=2", "train.batch_size=2", "train.eval_batches=1", "train.eval_every=2", "train.ckpt_every=2",
        "model.d_model=16", "model.n_layers=1", "data.max_chars=20000", "data.mqar.train_examples=16",
        "data.mqar.test_examples=8", "data.mqar.vocab_size=256", "data.brackets.train_examples=16",
        "data.brackets.test_examples=8", "data.niah.train_examples=4", "data.niah.test_per_depth=1",
        "model.mixer_options.interdomain.modes=4", "model.mixer_options.s4d.modes=4",
        "model.mixer_options.boltzmann.dqa_steps=5", "model.mixer_options.boltzmann.dqa_shots=8",
        "train.compile=false"]  # compilation has its own tests; here it would only cost minutes


@pytest.mark.parametrize("name, tier", [(name, tier) for name in sorted(SUITES) for tier in SUITES[name].tiers])
def test_suite_runs_and_reports(name, tier, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    suite = get_suite(name, tier)
    results = run_suite(suite, tmp_path / "suite", seeds=1, quick=True, extra=TINY, log=lambda *_: None)
    expected = {f"{e.name}/{a.label}/0" for e in suite.experiments for a in e.arms}
    expected |= {str(RunKey(e.name, a.label, lr=lr)) for e in suite.experiments for a in e.arms for lr in e.lrs}
    assert set(runs_of(results)) == expected
    assert json.loads((tmp_path / "suite" / "results.json").read_text()) == results.to_json()
    report = write_report(suite, results, plan_of(suite, results), tmp_path / "suite").read_text()
    assert "1 seed(s), the last run on " in report and "torch " in report
    assert f"**Smoke run: not a result.** Results of the {tier} tier of {name}, a smoke run (--quick)." in report
    if suite.claims:
        assert "## Verdicts" in report and (tmp_path / "suite" / "claims.png").stat().st_size > 1000
        assert all(claim.statement in report for claim in suite.claims)
    if any(claim.ablation for claim in suite.claims):  # the engagement section says what was removed
        assert suite.ablation and f"Removed here: {suite.ablation}." in report
    for experiment in suite.experiments:
        assert f"## {experiment.title}" in report
        if experiment.component:  # a learned component's size opens the report, beside the ablations
            assert report.index("## Is the mechanism used?") < report.index(f"### {experiment.title}")
            assert report.index(f"### {experiment.title}") < report.index("## Verdicts")
        assert (tmp_path / "suite" / f"{experiment.name}.png").stat().st_size > 1000
        for arm in experiment.arms:
            assert f"| {arm.label} |" in report


def test_an_interrupted_suite_resumes_without_rerunning(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    suite = get_suite("demo")
    suite.experiments = suite.experiments[:1]
    suite.experiments[0].arms = suite.experiments[0].arms[:2]
    first = run_suite(suite, tmp_path / "suite", seeds=1, extra=TINY, log=lambda *_: None)
    calls = []
    second = run_suite(suite, tmp_path / "suite", seeds=2, extra=TINY, log=calls.append)
    assert all(runs_of(first)[k] == runs_of(second)[k] for k in runs_of(first))
    assert len(runs_of(second)) == 4 and sum(c.endswith("/1") for c in calls) == 2
    assert not any(c.endswith("/0") for c in calls)
    changed = run_suite(suite, tmp_path / "suite", seeds=2, extra=[*TINY, "train.steps=3"], log=lambda *_: None)
    assert all(runs_of(changed)[k]["config"] != runs_of(second)[k]["config"] for k in runs_of(second))  # trained again


def test_a_run_cut_short_continues_from_its_checkpoint_and_ends_as_if_never_stopped(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    suite = Suite("s", "s", [Experiment("lm", "lm", "val_ppl", [Arm("softmax", "demo")], "softmax")])
    four_steps = [*TINY, "train.steps=4"]
    straight = run_suite(suite, tmp_path / "apart" / "straight", seeds=1, extra=four_steps,
                         log=lambda *_: None)  # not beside the other, whose model it would be
    recover = crash_after_checkpoint(monkeypatch, 2)
    with pytest.raises(Crash):
        run_suite(suite, tmp_path / "suite", seeds=1, extra=four_steps, log=lambda *_: None)
    recover()
    spent = checkpoint.load_state(tmp_path / "suite" / "runs" / "lm-softmax-s0" / "step-00000002" /
                                  "train_state.pt")["train_seconds"]
    calls = []
    resumed = run_suite(suite, tmp_path / "suite", seeds=1, extra=four_steps, log=calls.append)
    record, uninterrupted = runs_of(resumed)["lm/softmax/0"], runs_of(straight)["lm/softmax/0"]
    assert "    continuing from the checkpoint at step 2" in calls and record["resumed_from"] == 2
    assert record["val_ppl"] == uninterrupted["val_ppl"] and record["steps"] == 4
    assert "resumed_from" not in uninterrupted and record["seconds"] > spent > 0  # the earlier attempt counts
    report = write_report(suite, resumed, plan_of(suite, resumed), tmp_path / "suite").read_text()
    assert "- softmax: 4 [resumed at 2]" in report and "resumed_from" not in report


@pytest.mark.parametrize("other", ["config", "version"])
def test_a_checkpoint_left_by_another_config_is_not_continued(other, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    suite = Suite("s", "s", [Experiment("lm", "lm", "val_ppl", [Arm("softmax", "demo")], "softmax")])
    recover = crash_after_checkpoint(monkeypatch, 2)
    with pytest.raises(Crash):
        run_suite(suite, tmp_path / "suite", seeds=1, extra=[*TINY, "train.steps=4"], log=lambda *_: None)
    recover()
    if other == "version":  # the same settings, written by a version that had a field this one lacks
        written, first = checkpoint.load_config, [True]  # the first read is the one the suite judges it by
        monkeypatch.setattr(checkpoint, "load_config",
                            lambda folder: {**written(folder), **({"retired": 1} if first and first.pop() else {})})
    steps = 6 if other == "config" else 4
    calls = []
    record = run_suite(suite, tmp_path / "suite", seeds=1, extra=[*TINY, f"train.steps={steps}"],
                       log=calls.append).get(RunKey("lm", "softmax", seed=0))
    assert not any("continuing" in c for c in calls) and record.resumed_from is None
    assert record.extent["steps"] == steps


def test_statistics():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    diff, half = paired_difference([2.0, 3.0, 4.0], [1.0, 1.5, 2.5])
    assert diff == pytest.approx(4 / 3) and half == pytest.approx(4.303 * (1 / 12) ** 0.5 / 3**0.5, rel=1e-3)


def test_an_arm_shared_by_two_experiments_is_trained_once_and_measured_by_each(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    softmax, sigmoid = Arm("softmax", "demo"), Arm("sigmoid", "demo", Changes.mixer("sigmoid"))
    suite = Suite("s", "s", [
        Experiment("ppl", "perplexity", "val_ppl", [softmax, sigmoid], "softmax"),
        Experiment("speed", "sample efficiency", "tokens_to_loss", [Arm("again", "demo")], "again",
                   target_losses=[100.0, 0.0]),
    ])
    calls = []
    results = run_suite(suite, tmp_path / "suite", seeds=1, extra=TINY, log=calls.append)
    runs = runs_of(results)
    assert runs["speed/again/0"]["run"] == runs["ppl/softmax/0"]["run"] != runs["ppl/sigmoid/0"]["run"]
    assert sum("the same model as" in c for c in calls) == 1
    assert runs["speed/again/0"]["tokens to 100.0"] > 0 and runs["speed/again/0"]["tokens to 0.0"] is None
    report = write_report(suite, results, plan_of(suite, results), tmp_path / "suite").read_text()
    assert "| again | " in report and "never" in report


def test_tokens_to_loss_reads_the_smoothed_training_loss(tmp_path):
    class Train:
        batch_size, seq_len = 2, 8

    log = tmp_path / "metrics.jsonl"
    losses = [5, 4, 3, 2, 1, 1, 1]
    log.write_text("\n".join(json.dumps({"step": 10 * (i + 1), "loss": v}) for i, v in enumerate(losses)))
    # trailing means of up to 3: 5, 4.5, 4, 3, 2 -> the mean first reaches 2 at the 5th log (step 50)
    assert tokens_to_loss(log, 2.0, Train, window=3) == 50 * 16
    assert tokens_to_loss(log, 0.5, Train, window=3) is None


def test_the_readme_results_section_is_generated_from_the_results_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    suite = get_suite("demo")
    suite.experiments = suite.experiments[:1]
    suite.experiments[0].arms = suite.experiments[0].arms[:2]
    run_suite(suite, tmp_path / "results" / "demo", seeds=1, extra=TINY, log=lambda *_: None)
    summary = results_summary(tmp_path / "results")
    assert suite.title in summary and "| softmax | " in summary and "report.md" in summary
    assert "Results of the default tier of demo." in summary and "Smoke run" not in summary
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{README_START}\nold\n{README_END}\nafter\n")
    update_readme(readme, summary)
    text = readme.read_text()
    assert "old" not in text and summary in text and text.endswith(f"{README_END}\nafter\n")


def test_a_learning_rate_sweep_trains_every_seed_at_the_rate_with_the_lowest_validation_loss(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    sweep = Experiment("mqar", "recall", "accuracy", [Arm("softmax", "mqar")], "softmax", lrs=[1e-5, 3e-3], seeds=2)
    results = run_suite(Suite("s", "s", [sweep], seeds=3), tmp_path / "suite", extra=[*TINY, "train.steps=6"],
                        log=lambda *_: None)
    runs = runs_of(results)
    losses = {lr: runs[str(RunKey("mqar", "softmax", lr=lr))]["best_val_loss"] for lr in (1e-5, 3e-3)}
    best = min(losses, key=losses.get)
    assert set(runs) == {"mqar/softmax/lr=1e-05", "mqar/softmax/lr=0.003", "mqar/softmax/0", "mqar/softmax/1"}
    assert runs["mqar/softmax/0"]["run"] == runs[str(RunKey("mqar", "softmax", lr=best))]["run"]  # trained once
    assert f"-lr{best:g}-s1" in runs["mqar/softmax/1"]["run"] and runs["mqar/softmax/1"]["steps"] == 6
    saved = json.loads((tmp_path / "suite" / "results.json").read_text())["shared_rates"]
    assert saved["mqar"]["rates"] == {}  # one arm is compared with no other: its own best, recorded once decided
    one = Suite("s", "s", [sweep])
    report = write_report(one, results, plan_of(one, results), tmp_path / "suite").read_text()
    assert "| softmax |" in report


def test_a_sweep_goes_on_past_an_edge_that_wins_and_says_where_it_stopped_there():
    arms = [Arm("softmax", "demo"), Arm("sigmoid", "demo")]
    sweep = Experiment("lm", "lm", "val_ppl", arms, "softmax", lrs=[1e-3, 2e-3, 4e-3])
    losses = {"softmax": [1.6, 1.5, 1.55], "sigmoid": [1.6, 1.5, 1.4]}  # the middle rate; the largest
    runs = {str(RunKey("lm", label, lr=lr)): {"best_val_loss": loss}
            for label, by_lr in losses.items() for lr, loss in zip(sweep.lrs, by_lr, strict=True)}
    toy = Suite("toy", "Toy", [sweep])
    lines = training_lines(toy, sweep, Results({"suite": "toy", "runs": runs}))
    assert "| sigmoid | 1.6 | 1.5 | **1.4** | – |" in lines and "| softmax | 1.6 | **1.5** | 1.55 | – |" in lines
    assert "The sweep goes on: sigmoid (lr 0.008), not run yet" in "\n".join(lines)
    assert not any("edge:" in line for line in lines)
    runs |= {str(RunKey("lm", "sigmoid", lr=lr)): {"best_val_loss": loss} for lr, loss in [(8e-3, 1.35), (1.6e-2, 1.3)]}
    # two rates added, the last still the best: it stops there
    lines = training_lines(toy, sweep, Results({"suite": "toy", "runs": runs}))
    assert "| sigmoid | 1.6 | 1.5 | 1.4 | 1.35 | **1.3** |" in lines
    assert [line for line in lines if "edge:" in line] == [
        "At the sweep's edge: sigmoid (lr 0.016); a rate beyond it might train better."]
    assert not any("goes on:" in line for line in lines)
    assert "Each arm's seed 0 is its sweep's own run at the chosen rate" in "\n".join(lines)


def test_sweep_rates_extend_the_grid_past_a_winning_edge_and_no_further_than_they_know():
    grid = [1e-3, 2e-3, 4e-3]
    assert sweep_rates(grid, {1e-3: 2.0, 2e-3: 1.0, 4e-3: 2.0}.get) == grid  # the optimum inside: as it is
    assert sweep_rates(grid, {1e-3: 1.0, 2e-3: 2.0, 4e-3: 3.0}.get) == [5e-4, *grid]  # its loss not known yet
    assert sweep_rates(grid, lambda lr: lr) == [2.5e-4, 5e-4, *grid]  # the lowest keeps winning: two at most
    assert sweep_rates([1e-3, 3e-3, 1e-2], lambda lr: -lr) == [1e-3, 3e-3, 1e-2, 0.032, 0.1]  # its own step
    assert sweep_rates([1e-5, 3e-3], lambda lr: lr) == [1e-5, 3e-3]  # two rates have no inside
    assert sweep_rates(grid, lambda lr: lr, extend=False) == grid  # a smoke run's losses choose nothing


def test_the_plan_trains_the_rates_a_sweep_adds_and_chooses_among_all():
    sweep = Experiment("lm", "lm", "val_ppl", [Arm("softmax", "demo")], "softmax", lrs=[1e-3, 2e-3, 4e-3])
    suite, settings = Suite("s", "s", [sweep], seeds=1), Settings(Path("runs"), seeds=1)
    results, trained = Results({"suite": "s", "runs": {}}), []
    while True:  # each sweep point "trained" as the plan asks: the validation loss is least near lr = 0.01
        jobs = [job for job in plan(suite, [sweep], results, settings).jobs if job.status == "train"]
        if not jobs:
            break
        for job in jobs:
            trained.append(str(job.key))
            results.records[job.key] = Record.from_json(dict(best_val_loss=math.log(job.cfg.train.lr / 1e-2) ** 2,
                                                             config=job.fingerprint,
                                                             measured=["val_ppl", [1, 2, 3.5, 5], []]))
    assert trained == [str(RunKey("lm", "softmax", lr=lr)) for lr in (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)]
    seed = plan(suite, [sweep], results, settings).jobs[-1]
    assert (str(seed.key), seed.status, seed.lr) == ("lm/softmax/0", "measure", 8e-3)  # the sweep's model


def test_a_shared_rate_is_one_that_neither_compared_arm_s_sweep_can_tell_from_its_best():
    losses = {"gla": {1e-3: 1.500, 3e-3: 1.503, 1e-2: 1.60}, "gdn": {1e-3: 1.52, 3e-3: 1.50, 1e-2: 1.501}}
    pair = [("gdn", "gla")]
    assert pair_rates(losses, {"gla": 0.005, "gdn": 0.005}, pair) == {"gla": 3e-3, "gdn": 3e-3}  # tied for both
    assert pair_rates(losses, {"gla": 0.001, "gdn": 0.005}, pair) == {}  # gla separates 3e-3 from its best
    assert pair_rates(losses, {"gla": 0.2, "gdn": 0.05}, pair) == {"gla": 3e-3, "gdn": 3e-3}  # the least above
    assert pair_rates(losses, {"gla": 0.2, "gdn": 0.05}, []) == {}  # compared with no arm, an arm keeps its best


def test_rates_are_shared_per_compared_pair_where_the_experiment_wide_intersection_is_empty():
    """CCQ's extrapolation: GLA ties 0.002 and 0.004, CCQ-GLA only 0.002, GDN and CCQ-GDN only 0.004. No rate is
    tied for all four, yet each compared pair has one."""
    losses = {"gla": {0.001: 1.60, 0.002: 1.501, 0.004: 1.500}, "ccq-gla": {0.001: 1.60, 0.002: 1.50, 0.004: 1.55},
              "gdn": {0.001: 1.60, 0.002: 1.55, 0.004: 1.50}, "ccq-gdn": {0.001: 1.60, 0.002: 1.56, 0.004: 1.50}}
    spreads = dict.fromkeys(losses, 0.01)
    pairs = [("ccq-gla", "gla"), ("ccq-gdn", "gdn")]
    assert pair_rates(losses, spreads, pairs) == {"ccq-gla": 0.002, "gla": 0.002, "ccq-gdn": 0.004, "gdn": 0.004}
    together = [("ccq-gla", "gla"), ("gdn", "gla")]  # gla shares 0.002 first; gdn cannot tie it: each its own
    assert pair_rates(losses, spreads, together) == {"ccq-gla": 0.002, "gla": 0.002}
    recorded = SharedRate.from_json({"lr": 0.003, "spreads": spreads, "sweep": {}})  # one rate for every arm
    assert recorded.rates == dict.fromkeys(losses, 0.003)
    assert SharedRate.from_json(SharedRate(recorded.rates, spreads, {}).to_json()) == recorded


def test_a_suite_compares_the_pairs_its_claims_name_and_without_claims_each_arm_with_the_baseline():
    from attnlab.lab.plan import compared_pairs
    from attnlab.papers import get_suite

    ccq = get_suite("ccq", "converged")
    extrapolation = next(e for e in ccq.experiments if e.name == "extrapolation")
    assert compared_pairs(ccq, extrapolation) == [("ccq-gla", "gla"), ("ccq-gdn", "gdn")]
    bare = Suite("s", "s", [extrapolation])
    assert compared_pairs(bare, extrapolation) == [("ccq-gla", "gla"), ("gdn", "gla"), ("ccq-gdn", "gla")]


def test_arms_share_a_rate_where_the_sweep_cannot_separate_rates_and_the_decision_stands_once_made(tmp_path):
    from attnlab.lab.plan import measurement_of

    arms = [Arm("softmax", "demo"), Arm("sigmoid", "demo", Changes.mixer("sigmoid"))]
    sweep = Experiment("lm", "LM", "val_ppl", arms, "softmax", lrs=[1e-3, 2e-3])
    suite, settings = Suite("s", "s", [sweep], seeds=2), Settings(Path("runs"), seeds=2)
    results = Results({"suite": "s", "runs": {}})
    losses = {("softmax", 1e-3): 1.500, ("softmax", 2e-3): 1.501, ("sigmoid", 1e-3): 1.60, ("sigmoid", 2e-3): 1.50}
    seeds = {"softmax": [1.50, 1.51], "sigmoid": [1.50, 1.5001]}  # softmax's spread (0.007) hides 2e-3's +0.001

    def train_as_planned() -> Plan:
        jobs = plan(suite, [sweep], results, settings)
        for job in jobs.jobs:
            if job.runnable:
                loss = losses[job.key.arm, job.key.lr] if job.key.sweep else seeds[job.key.arm][job.key.seed]
                results.records[job.key] = Record.from_json(dict(best_val_loss=loss, config=job.fingerprint,
                                                                 measured=measurement_of(sweep)))
        return jobs

    train_as_planned()  # the sweep
    own = train_as_planned()  # the seeds, each arm at its own best
    assert not own.decided and {job.key.arm: job.lr for job in own.jobs if not job.key.sweep} == {
        "softmax": 1e-3, "sigmoid": 2e-3}
    shared = plan(suite, [sweep], results, settings)
    decision = shared.decided["lm"]
    assert decision.rates == {"sigmoid": 2e-3, "softmax": 2e-3}
    assert decision.spreads == pytest.approx({"softmax": 0.00707, "sigmoid": 7.07e-5}, rel=0.01)
    softmax = [job for job in shared.jobs if job.key.arm == "softmax" and not job.key.sweep]
    assert [(job.lr, job.status) for job in softmax] == [(2e-3, "measure"), (2e-3, "train")]  # seed 0: the sweep's
    assert plan_of(suite, results).superseded == {RunKey("lm", "softmax", seed=0), RunKey("lm", "softmax", seed=1)}
    lines = "\n".join(training_lines(suite, sweep, results))
    assert "softmax: lr 0.001 best, lr 0.002 (+0.001 against a spread of 0.0071)" in lines
    assert "**Shared rates:** sigmoid and softmax at lr 0.002" in lines
    path = tmp_path / "results.json"
    results.save_shared_rates(path, shared.decided)
    assert Results.load(path).shared_rates == shared.decided
    seeds["softmax"] = [1.501, 1.501]  # trained again at the shared rate, with no spread at all
    train_as_planned()
    after = plan(suite, [sweep], results, settings)  # the recorded decision stands: read, not made again
    assert not after.decided and all(job.status == "done" for job in after.jobs)
    assert {job.lr for job in after.jobs if not job.key.sweep} == {2e-3} and not plan_of(suite, results).superseded
    point = RunKey("lm", "sigmoid", lr=1e-3)
    trained_again = {**results.get(point).extent, "best_val_loss": 1.4}  # its sweep trained again
    results.records[point] = results.get(point).replace(extent=trained_again)
    again = plan(suite, [sweep], results, settings)  # decided again, once its seeds at the new best are trained
    assert not again.decided and {job.lr for job in again.jobs if job.key.arm == "sigmoid" and not job.key.sweep
                                  } == {1e-3}
    train_as_planned()  # the seeds at each arm's best of the sweep as it now stands
    redecided = plan(suite, [sweep], results, settings).decided["lm"]  # recorded again, so that it stands in turn
    assert redecided.read["sigmoid"]["0.001"] == 1.4 and redecided != decision


def test_a_job_that_measures_another_experiments_model_trains_it_again_where_the_model_is_not_on_disk():
    from attnlab.lab.plan import measurement_of

    lm = Experiment("lm", "lm", "val_ppl", [Arm("softmax", "demo")], "softmax")
    ext = Experiment("ext", "ext", "extrapolation", [Arm("softmax", "demo")], "softmax", lengths=[1, 2])
    suite, settings = Suite("s", "s", [lm, ext], seeds=1), Settings(Path("runs"), seeds=1)
    results = Results({"suite": "s", "runs": {}})
    [done] = plan(suite, [lm], results, settings).jobs
    results.records[done.key] = Record.from_json(dict(val_ppl=5.0, config=done.fingerprint,
                                                      measured=measurement_of(lm)))

    def status(**where) -> str:
        return plan(suite, [lm, ext], results, settings, **where).jobs[-1].status

    assert status() == "train"  # a results folder without its runs: nothing to measure
    assert status(models=frozenset({done.fingerprint})) == "measure"  # its folder holds the model
    copy = Record.from_json({"ppl@128": 5.0, "ppl@256": 6.0, "config": done.fingerprint,
                             "measured": measurement_of(ext)})
    assert status(beside=(copy,)) == "measure"  # a folder beside holds its record, measured this way


def test_training_extent_reads_where_a_run_stopped_and_which_checkpoint_is_measured(tmp_path):
    log = tmp_path / "metrics.jsonl"
    records = [{"step": 2, "loss": 3.0}, {"step": 2, "val_loss": 2.5}, {"step": 4, "val_loss": 2.0},
               {"step": 6, "val_loss": 2.2}]
    log.write_text("\n".join(map(json.dumps, records)))  # no early stopping: the last checkpoint is measured
    assert training_extent(tmp_path) == {"steps": 6, "stopped_early": False, "best_step": 6, "best_val_loss": 2.2}
    records += [{"step": 8, "val_loss": 1.99}, {"step": 8, "stopped": "patience", "best_step": 4}]
    log.write_text("\n".join(map(json.dumps, records)))  # 1.99 gained less than min_delta: step 4 stays the best
    (tmp_path / "best.json").write_text(json.dumps({"step": 4, "val_loss": 2.0}))
    assert training_extent(tmp_path) == {"steps": 8, "stopped_early": True, "best_step": 4, "best_val_loss": 2.0}


def test_a_suite_measures_what_a_suite_beside_it_trained_with_the_same_config(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    shared = Experiment("lm", "perplexity", "val_ppl", [Arm("softmax", "demo")], "softmax")
    first = run_suite(Suite("a", "a", [shared]), tmp_path / "results" / "a", seeds=1, extra=TINY, log=lambda *_: None)
    calls = []
    second = run_suite(Suite("b", "b", [shared]), tmp_path / "results" / "b", seeds=1, extra=TINY, log=calls.append)
    assert runs_of(second)["lm/softmax/0"]["run"] == "../a/runs/lm-softmax-s0"
    assert runs_of(second)["lm/softmax/0"]["val_ppl"] == runs_of(first)["lm/softmax/0"]["val_ppl"]
    assert any("the same model and measurement as" in c for c in calls)
    shutil.rmtree(tmp_path / "results" / "a" / "runs")  # a later session: the models are gone, the records stay
    (tmp_path / "results" / "b" / "results.json").unlink()
    again = run_suite(Suite("b", "b", [shared]), tmp_path / "results" / "b", seeds=1, extra=TINY, log=calls.append)
    assert runs_of(again)["lm/softmax/0"]["val_ppl"] == runs_of(first)["lm/softmax/0"]["val_ppl"]
    assert not (tmp_path / "results" / "b" / "runs").exists()  # nothing trained again


def test_a_model_is_measured_by_every_experiment_that_uses_it_as_soon_as_it_is_trained(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    softmax, sigmoid = Arm("softmax", "demo"), Arm("sigmoid", "demo", Changes.mixer("sigmoid"))
    suite = Suite("s", "s", [Experiment("ppl", "perplexity", "val_ppl", [softmax, sigmoid], "softmax"),
                             Experiment("long", "extrapolation", "extrapolation", [softmax], "softmax", lengths=[1])])
    calls = []
    run_suite(suite, tmp_path / "suite", seeds=1, extra=TINY, log=calls.append)
    keys = [c.split("] ")[1] for c in calls if c.startswith("[s]")]
    assert keys == ["ppl/softmax/0", "long/softmax/0", "ppl/sigmoid/0"]


@pytest.mark.parametrize("tolerance", [1e9, 0.1], ids=["calibrated", "missed"])
def test_a_baseline_trains_its_seeds_first_and_nothing_is_compared_with_one_that_misses(tolerance, tmp_path,
                                                                                         monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    arms = [Arm("softmax", "demo"), Arm("sigmoid", "demo", Changes.mixer("sigmoid"))]
    anchor = Anchor("lm", "softmax", "val_ppl", 1.0, tolerance)  # a perplexity of 1 is out of reach in 2 steps
    claim = Claim("sigmoid beats softmax", "lm", "val_ppl", "sigmoid", "softmax", "lower", calibration=(anchor,))
    suite = Suite("s", "s", [Experiment("lm", "lm", "val_ppl", arms, "softmax")], claims=[claim])
    calls = []
    results = run_suite(suite, tmp_path / "suite", seeds=2, extra=TINY, log=calls.append)
    keys = [c.split("] ")[1] for c in calls if c.startswith("[s] lm/")]
    report = write_report(suite, results, plan_of(suite, results), tmp_path / "suite").read_text()
    assert "finished" in report  # the arms that are not trained are not runs left to do
    if tolerance > 1:
        assert keys == ["lm/softmax/0", "lm/softmax/1", "lm/sigmoid/0", "lm/sigmoid/1"]
        return
    assert keys == ["lm/softmax/0", "lm/softmax/1"]
    assert any("the baseline is not the paper's" in c and "other arms are not trained" in c for c in calls)
    assert "its other arms are not trained" in report and "**not calibrated**" in report


@pytest.mark.parametrize("old_measured", [["niah", [1], []], None], ids=["old measurement", "no measured field"])
def test_a_record_measured_before_its_metric_changed_meaning_is_measured_again_from_its_model(old_measured, tmp_path,
                                                                                              monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    niah = Experiment("niah", "retrieval", "niah", [Arm("softmax", "demo", Changes.data(source="niah"))], "softmax",
                      lengths=[1])
    lm = Experiment("lm", "perplexity", "val_ppl", [Arm("softmax", "demo")], "softmax")
    suite = Suite("s", "s", [niah, lm])
    first = run_suite(suite, tmp_path / "suite", seeds=1, extra=TINY, log=lambda *_: None)
    assert runs_of(first)["niah/softmax/0"]["measured"] == ["niah", [1], [], get_metric("niah").revision]
    record, model = runs_of(first)["niah/softmax/0"], load_run(tmp_path / "suite" / "runs" / "niah-softmax-s0").model
    (length, by_depth), = record["niah_depths"].items()  # RULER's grid, whose mean is the length's value
    assert list(by_depth) == ["0", "0.25", "0.5", "0.75", "1"]
    assert sum(by_depth.values()) / 5 == pytest.approx(record[f"niah@{length}"])
    assert record["state_bytes"] == 4 * model.state_size(int(length)) > 0  # fp32 keys and values
    stale = {**runs_of(first)["niah/softmax/0"], "measured": old_measured, "niah@136": 0.5}  # the old meaning
    if old_measured is None:
        del stale["measured"]
    old = {**runs_of(first)["lm/softmax/0"]}
    del old["measured"]  # a record from before the field: its metric has no revision, so it stands
    results = {**first.to_json(), "runs": {"niah/softmax/0": stale, "lm/softmax/0": old}}
    (tmp_path / "suite" / "results.json").write_text(json.dumps(results))
    calls = []
    again = run_suite(suite, tmp_path / "suite", seeds=1, extra=TINY, log=calls.append)
    assert calls == ["[s] niah/softmax/0", "    the same model as niah-softmax-s0", calls[2]]  # measured, not trained
    assert runs_of(again)["niah/softmax/0"]["measured"] == runs_of(first)["niah/softmax/0"]["measured"]
    assert "niah@136" not in runs_of(again)["niah/softmax/0"]
    assert runs_of(again)["lm/softmax/0"] == old


def test_a_record_from_before_its_metric_measured_the_model_without_its_component_is_measured_again(tmp_path,
                                                                                                     monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    arms = [Arm("softmax", "demo"), Arm("ccq", "demo", Changes.mixer("ccq-gla"))]
    suite = Suite("s", "s", [Experiment("lm", "lm", "val_ppl", arms, "softmax", lrs=[1e-3, 2e-3])])
    first = run_suite(suite, tmp_path / "suite", seeds=1, extra=TINY, log=lambda *_: None)
    assert ABLATED in runs_of(first)["lm/ccq/0"] and ABLATED not in runs_of(first)["lm/softmax/0"]
    # every ccq record as it was before the metric measured the ablation, with the same measured field
    old = {key: {k: v for k, v in record.items() if k != ABLATED} for key, record in runs_of(first).items()}
    (tmp_path / "suite" / "results.json").write_text(json.dumps({**first.to_json(), "runs": old}))
    calls = []
    again = run_suite(suite, tmp_path / "suite", seeds=1, extra=TINY, log=calls.append)
    # the seed is measured from its model, not trained again; the sweep's points (only their validation loss is
    # read) and softmax (which has no component to remove) stand
    assert calls[0] == "[s] lm/ccq/0" and calls[1].startswith("    the same model as lm-ccq-")
    assert [c for c in calls if c.startswith("[s]")] == ["[s] lm/ccq/0"]
    assert runs_of(again)["lm/ccq/0"][ABLATED] == pytest.approx(runs_of(first)["lm/ccq/0"][ABLATED])
    assert {k: r for k, r in runs_of(again).items() if k != "lm/ccq/0"} == {k: r for k, r in old.items()
                                                                            if k != "lm/ccq/0"}


def test_remeasure_trains_a_run_whose_model_is_gone_again_and_then_only_measures_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    suite = Suite("s", "s", [Experiment("lm", "lm", "val_ppl", [Arm("softmax", "demo")], "softmax")])
    first = run_suite(suite, tmp_path / "suite", seeds=2, extra=TINY, log=lambda *_: None)
    # records from before the metric kept per-block losses, their models deleted since
    old = {key: {k: v for k, v in record.items() if k != "val_ppl"} | {"val_ppl": 9.0}
           for key, record in runs_of(first).items()}
    (tmp_path / "suite" / "results.json").write_text(json.dumps({**first.to_json(), "runs": old}))
    shutil.rmtree(tmp_path / "suite" / "runs")
    calls = []
    again = run_suite(suite, tmp_path / "suite", seeds=2, extra=TINY, log=calls.append, again=("lm/*/1",))
    assert [c for c in calls if c.startswith("[s]")] == ["[s] lm/softmax/1"]  # seed 0 left as it stands
    assert runs_of(again)["lm/softmax/0"] == old["lm/softmax/0"]
    assert runs_of(again)["lm/softmax/1"]["val_ppl"] == pytest.approx(runs_of(first)["lm/softmax/1"]["val_ppl"])
    assert runs_of(again)["lm/softmax/1"]["trained"]
    calls = []  # asked again (a session that stopped part-way starts over): the model is there, so only measured
    run_suite(suite, tmp_path / "suite", seeds=2, extra=TINY, log=calls.append, again=("lm/*/1",))
    assert calls[:2] == ["[s] lm/softmax/1", "    the same model as lm-softmax-s1"]
    with pytest.raises(UserError, match=r"--remeasure lm/x/\* matches no run .* e.g. lm/softmax/0"):
        run_suite(suite, tmp_path / "suite", seeds=2, extra=TINY, log=lambda *_: None, again=("lm/x/*",))


def test_a_runs_fingerprint_is_its_config_apart_from_names_folders_and_compilation():
    from attnlab.config import load_config
    from attnlab.lab.configs import fingerprint

    base = fingerprint(load_config("mqar"))
    assert fingerprint(load_config("mqar", ["name=x", "out_dir=elsewhere", "train.compile=true"])) == base
    assert fingerprint(load_config("mqar", ["train.lr=0.01"])) != base


def test_only_runs_the_experiments_that_match(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    arm = Arm("softmax", "demo")
    suite = Suite("s", "s", [Experiment("lm", "lm", "val_ppl", [arm], "softmax"),
                             Experiment("lm-long", "lm", "val_ppl", [arm], "softmax")])
    results = run_suite(suite, tmp_path / "suite", seeds=1, extra=TINY, log=lambda *_: None, only=["*-long"])
    assert set(runs_of(results)) == {"lm-long/softmax/0"}
    assert results.meta["seeds"] == suite.seeds  # the report counts the suite's runs, not this part's
    with pytest.raises(UserError, match="matches no experiment of s; its experiments: lm, lm-long"):
        run_suite(suite, tmp_path / "suite", seeds=1, extra=TINY, only=["mqar*"])


def test_arms_trains_only_the_arms_that_match(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    arms = [Arm("softmax", "demo"), Arm("wd", "demo", Changes.train(weight_decay=0.2))]
    suite = Suite("s", "s", [Experiment("lm", "lm", "val_ppl", arms, "softmax", lrs=[1e-3, 3e-3])])
    results = run_suite(suite, tmp_path / "suite", seeds=2, extra=TINY, log=lambda *_: None, arms=["w*"])
    assert set(runs_of(results)) == {"lm/wd/lr=0.001", "lm/wd/lr=0.003", "lm/wd/0", "lm/wd/1"}
    with pytest.raises(UserError, match="--arms soft matches no arm of s's experiments; its arms: softmax, wd"):
        run_suite(suite, tmp_path / "suite", seeds=1, extra=TINY, arms=["soft"])


def test_a_record_written_meanwhile_by_another_process_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    suite = Suite("s", "s", [Experiment("lm", "lm", "val_ppl", [Arm("softmax", "demo")], "softmax")])
    path = tmp_path / "suite" / "results.json"
    other = {"val_ppl": 3.0, "seconds": 1.0}

    def another_process_finishes_a_run(line):  # called as the run starts, before its record is written
        if not path.exists():
            path.write_text(json.dumps({"suite": "s", "tier": "default", "quick": False, "scale": 1.0,
                                        "runs": {"lm-long/softmax/0": other}}))

    results = run_suite(suite, tmp_path / "suite", seeds=1, extra=TINY, log=another_process_finishes_a_run)
    assert json.loads(path.read_text())["runs"]["lm-long/softmax/0"] == other
    assert set(runs_of(results)) == {"lm/softmax/0", "lm-long/softmax/0"}


def test_a_run_folder_trained_again_under_another_config_is_not_taken_for_the_old_model(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    ppl = Experiment("lm", "perplexity", "val_ppl", [Arm("softmax", "demo")], "softmax")
    first = run_suite(Suite("s", "s", [ppl]), tmp_path / "suite", seeds=1, extra=TINY, log=lambda *_: None)
    run_suite(Suite("s", "s", [ppl]), tmp_path / "suite", seeds=1, extra=[*TINY, "train.steps=3"],
              log=lambda *_: None)  # the same folder now holds another model
    calls = []
    speed = Experiment("speed", "tokens", "tokens_to_loss", [Arm("softmax", "demo")], "softmax", target_losses=[9.0])
    old = {**runs_of(first)["lm/softmax/0"], "run": "../suite/runs/lm-softmax-s0"}  # a sibling's record of it
    other = {"suite": "t", "runs": {"lm/softmax/0": old}}
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "results.json").write_text(json.dumps(other))
    run_suite(Suite("u", "u", [speed]), tmp_path / "u", seeds=1, extra=TINY, log=calls.append)
    assert not any("the same model as" in c for c in calls)  # trained afresh, not measured from the wrong folder


def test_an_unreadable_results_file_is_one_clear_error(tmp_path):
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(UserError, match="cannot be read as a suite's results"):
        run_suite(Suite("s", "s", [Experiment("lm", "lm", "val_ppl", [Arm("softmax", "demo")], "softmax")]),
                  tmp_path, seeds=1, extra=TINY)


def test_a_results_folder_refuses_runs_of_another_tier_or_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    lm = Experiment("lm", "lm", "val_ppl", [Arm("softmax", "demo")], "softmax")
    run_suite(Suite("s", "s", [lm], quick=Changes.train(steps=1)), tmp_path / "suite", seeds=1, quick=True, extra=TINY,
              log=lambda *_: None)
    before = (tmp_path / "suite" / "results.json").read_text()
    refusal = (r"^\S+suite holds results of the default tier of s, a smoke run \(--quick\), not of the default tier "
               r"of s; give another --out, or move \S+ away")
    with pytest.raises(UserError, match=refusal):
        run_suite(Suite("s", "s", [lm]), tmp_path / "suite", seeds=1, extra=TINY)
    for other in [dict(quick=True, scale=0.5), dict(quick=False, scale=1.0)]:
        with pytest.raises(UserError, match="holds results of"):
            run_suite(Suite("s", "s", [lm], tier="converged"), tmp_path / "suite", seeds=1, extra=TINY, **other)
    assert (tmp_path / "suite" / "results.json").read_text() == before  # nothing overwritten
    calls = []  # the same setting continues where it stopped
    again = run_suite(Suite("s", "s", [lm]), tmp_path / "suite", seeds=1, quick=True, extra=TINY, log=calls.append)
    assert not calls and again.setting == {"suite": "s", "tier": "default", "quick": True, "scale": 1.0}


def test_accuracies_are_shown_in_percent_like_the_papers_quote_them():
    task = Experiment("task", "task", "accuracy", [Arm("softmax", "mqar"), Arm("hJ", "mqar")], "softmax",
                      paper={"softmax": "93.36%"})
    runs = {f"task/{arm}/{seed}": {"accuracy": acc + 0.01 * seed} for arm, acc in [("softmax", 0.9), ("hJ", 0.95)]
            for seed in range(2)}
    softmax, hj = report.experiment_table(task, Results({"runs": runs}))[2:]
    assert softmax.startswith("| softmax | 90.5% ± 0.71 |  | 93.36% |")
    assert hj.startswith("| hJ | 95.5% ± 0.71 | +5 [+5, +5] pp |")  # percentage points


def test_a_language_model_is_scored_on_the_whole_split_and_without_its_mechanism(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("attnlab.lab.metrics.VAL_BLOCKS", 4)  # the tiny split holds a few windows
    # a step of 1 (not 0.1) and 40 training steps: removing the coupling then moves the loss measurably
    coupled = Changes.mixer("coupled-qk", dt_init=1.0)
    arms = [Arm("softmax", "demo", Changes.mixer("softmax")), Arm("coupled", "demo", coupled)]
    suite = Suite("toy", "Toy", [Experiment("lm", "LM", "val_ppl", arms, "softmax")])
    longer = [*TINY, "train.steps=40", "train.eval_every=40", "train.ckpt_every=40", "train.lr=0.01"]
    results = run_suite(suite, tmp_path / "suite", seeds=1, extra=longer, log=lambda *_: None)
    softmax, coupled = runs_of(results)["lm/softmax/0"], runs_of(results)["lm/coupled/0"]
    run = load_run(tmp_path / "suite" / coupled["run"])
    corpus = run.corpus()
    assert coupled["val_tokens"] == len(corpus.split("val")) - 1 == softmax["val_tokens"]
    whole = whole_split_loss(run.model, corpus, "val", run.config.train.seq_len, None)
    assert coupled["val_loss"] == pytest.approx(whole, rel=1e-6)  # fp32, evaluated in other chunks
    assert ABLATED not in softmax  # nothing of its own to remove
    with run.model.ablated():  # the coupling's step at 0: the same windows scored without the mechanism
        without = whole_split_loss(run.model, corpus, "val", run.config.train.seq_len, None)
    assert coupled[ABLATED] == pytest.approx(math.exp(without), rel=1e-6)
    seq_len = run.config.train.seq_len
    blocks = block_losses(run.model, corpus, "val", seq_len, None, 4)
    assert coupled["val_blocks"] == pytest.approx(blocks, abs=1e-6) and len(softmax["val_blocks"]) == 4
    assert abs(without - whole) > 1e-4  # far outside the tolerance above


def test_records_of_a_superseded_config_are_left_out_of_the_report_until_retrained(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    arms = [Arm("softmax", "demo", Changes.mixer("softmax")), Arm("sigmoid", "demo", Changes.mixer("sigmoid"))]
    suite = Suite("toy", "Toy", [Experiment("lm", "LM", "val_ppl", arms, "softmax")])
    results = run_suite(suite, tmp_path / "suite", seeds=1, extra=TINY, log=lambda *_: None)
    assert plan_of(suite, results).superseded == set()
    suite.experiments[0].arms[1] = Arm("sigmoid", "demo", Changes.mixer("sigmoid") | Changes.model(dropout=0.1))
    assert plan_of(suite, results).superseded == {RunKey("lm", "sigmoid", seed=0)}
    text = write_report(suite, results, plan_of(suite, results), tmp_path / "suite").read_text()
    assert "**1 run left out**: trained under an earlier config of lm" in text
    assert "| sigmoid | – |" in text  # its old number is not shown as the new protocol's


def test_an_arm_with_fewer_seeds_trains_only_those(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    arms = [Arm("softmax", "demo", Changes.mixer("softmax")), Arm("sigmoid", "demo", Changes.mixer("sigmoid"), seeds=1)]
    suite = Suite("toy", "Toy", [Experiment("lm", "LM", "val_ppl", arms, "softmax")])
    results = run_suite(suite, tmp_path / "suite", seeds=2, extra=TINY, log=lambda *_: None)
    assert set(runs_of(results)) == {"lm/softmax/0", "lm/softmax/1", "lm/sigmoid/0"}
    assert "partial" not in write_report(suite, results, plan_of(suite, results), tmp_path / "suite").read_text()


def test_a_claim_plans_the_fewest_seeds_of_its_arms_in_its_experiments():
    arms = [Arm("softmax", "demo"), Arm("sigmoid", "demo", seeds=2), Arm("gla", "demo")]
    experiments = [Experiment("lm", "LM", "val_ppl", arms, "softmax"),
                   Experiment("long", "Long", "val_ppl", arms, "softmax", seeds=3)]
    suite = Suite("toy", "Toy", experiments, seeds=5)
    planned = report.planned_seeds(suite, plan_of(suite, Results({"suite": "toy", "runs": {}, "meta": {"seeds": 10}})))
    assert planned(Claim("gla beats softmax", "lm", "val_ppl", "gla", "softmax", "lower")) == 10
    assert planned(Claim("sigmoid beats softmax", "lm", "val_ppl", "sigmoid", "softmax", "lower")) == 2
    assert planned(Claim("the gap grows", "lm", "val_ppl", "gla", "softmax", "lower", contrast="long")) == 3
    assert planned(Claim("gla is good", "elsewhere", "val_ppl", "gla", None, "lower")) is None


def test_a_metric_registered_outside_attnlab_measures_and_reports_like_the_built_in_ones(tmp_path, monkeypatch):
    from attnlab.lab.metrics import METRICS, Curve, Metric, register_metric

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("attnlab.lab.metrics.METRICS", dict(METRICS))  # registered for this test only

    def width(experiment, run_dir):  # a toy curve: the trained model's width times n
        d_model = load_run(run_dir).config.model.d_model
        return {f"width@{n}": float(d_model * n) for n in (1, 2)}

    register_metric(Metric("width", width, curve=Curve("n", "width", log_x=False)))
    suite = Suite("s", "s", [Experiment("w", "widths", "width", [Arm("softmax", "demo")], "softmax")])
    results = run_suite(suite, tmp_path / "suite", seeds=1, extra=TINY, log=lambda *_: None)
    assert runs_of(results)["w/softmax/0"]["width@2"] == 32.0
    report = write_report(suite, results, plan_of(suite, results), tmp_path / "suite").read_text()
    assert "width@1" in report and (tmp_path / "suite" / "w.png").is_file()
    unknown = Suite("s", "s", [Experiment("w", "widths", "widht", [Arm("softmax", "demo")], "softmax")])
    with pytest.raises(ConfigError, match=r"unknown metric 'widht'.*width"):
        run_suite(unknown, tmp_path / "other", seeds=1, extra=TINY, log=lambda *_: None)


# runs with early stopping that end at their cap: under cosine the schedule ends there; under wsd patience would
# have started the decay and ended them sooner
AT_CAP = {"cosine": ("Stopped at the cap", ", where their cosine schedule ends"),
          "wsd": ("Not converged", " before it stopped them")}


@pytest.mark.parametrize("schedule", AT_CAP)
def test_runs_that_stop_early_but_end_at_their_cap_are_flagged_by_their_schedule(schedule):
    title, where = AT_CAP[schedule]
    arms = [Arm("softmax", "demo", Changes.train(steps=300, patience=3, schedule=schedule)),
            Arm("fixed", "demo", Changes.train(steps=300, schedule=schedule))]
    experiment = Experiment("lm", "lm", "val_ppl", arms, "softmax")
    toy = Suite("toy", "Toy", [experiment])
    runs = {"lm/softmax/0": {"steps": 300, "stopped_early": False, "seconds": 1.0},
            "lm/softmax/1": {"steps": 200, "stopped_early": True, "seconds": 1.0},
            "lm/fixed/0": {"steps": 300, "stopped_early": False, "seconds": 1.0}}  # fixed steps: by design

    def flagged(**setting) -> list[str]:
        lines = training_lines(toy, experiment, Results({"suite": "toy", "runs": runs, **setting}))
        return [line for line in lines if "at the cap" in line or "converged:" in line]

    assert len(flagged()) == 1 and flagged()[0].startswith(f"**{title}:** 1 of 2 runs with early stopping reached "
                                                           f"their cap of 300 steps{where}")
    assert flagged(quick=True) == []  # a smoke run's steps say nothing of convergence
    runs["lm/softmax/0"] |= {"steps": 250, "stopped_early": True}
    assert flagged() == []


def test_a_verdict_on_runs_that_ended_at_their_cap_is_marked_by_their_schedule():
    arms = [Arm("softmax", "demo", Changes.train(steps=300, patience=3)),
            Arm("hJ", "demo", Changes.train(steps=300, patience=3))]
    claim = Claim("h+J beats softmax", "lm", "val_ppl", "hJ", "softmax", "lower", paper=-1.0)
    results = two_arms(-1.0, 0.05, n=3)
    for key, record in results.items():
        results.records[key] = record.replace(extent={"steps": 200, "stopped_early": True})

    def row(arms) -> str:
        suite = Suite("toy", "Toy", [Experiment("lm", "lm", "val_ppl", arms, "softmax")])
        caveats = report.caveats(suite, results, plan_of(suite, results))
        return verdict_table.verdict_table(evaluate([claim], results), caveats=caveats)[2]

    assert "**agrees**: " in row(arms)  # every run stopped early
    for label in ("hJ", "softmax"):
        key = RunKey("lm", label, seed=1)
        results.records[key] = results.get(key).replace(extent={"steps": 300, "stopped_early": False})
    assert ("**agrees** (*stopped at the cap*, 2 of 6 runs at their cap of 300 steps, where their cosine schedule "
            "ends): ") in row(arms)
    wsd = Arm("hJ", "demo", Changes.train(steps=300, patience=3, schedule="wsd"))  # the schedule each arm's config has
    assert ("**agrees** (*stopped at the cap*, 1 of 3 runs at their cap of 300 steps, where their cosine schedule "
            "ends) (*not converged*, 1 of 3 runs at their cap of 300 steps): ") in row([arms[0], wsd])


def test_a_sweep_not_run_yet_says_the_seeds_had_the_presets_rate():
    sweep = Experiment("lm", "lm", "val_ppl", [Arm("softmax", "demo")], "softmax", lrs=[1e-3, 2e-3, 4e-3])
    toy = Suite("toy", "Toy", [sweep])
    lines = training_lines(toy, sweep, Results({"suite": "toy", "runs": {"lm/softmax/0": {"val_ppl": 5.0}}}))
    assert lines[0].startswith("Learning-rate sweep (0.001, 0.002, 0.004): not run yet.")
    assert not any(line.startswith("| arm |") for line in lines)  # no table of dashes
    assert "preset's rate" in lines[0]
    empty = Results({"suite": "toy", "runs": {}})
    assert training_lines(toy, sweep, empty)[0].endswith("not run yet.")  # nor any seed


def test_extrapolation_also_scores_the_training_length_without_the_mechanism(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    arms = [Arm("gla", "demo", Changes.mixer("gla")), Arm("ccq-gla", "demo", Changes.mixer("ccq-gla"))]
    suite = Suite("toy", "Toy", [Experiment("extrapolation", "x", "extrapolation", arms, "gla", lengths=[1, 2])])
    results = run_suite(suite, tmp_path / "suite", seeds=1, extra=TINY, log=lambda *_: None)
    gla, ccq = runs_of(results)["extrapolation/gla/0"], runs_of(results)["extrapolation/ccq-gla/0"]
    assert ABLATED not in gla  # nothing of its own to remove
    run = load_run(tmp_path / "suite" / ccq["run"])
    seq_len, val = run.config.train.seq_len, run.corpus().split("val")
    assert ccq["ppl_tokens"] == (len(val) - 1) // seq_len * seq_len  # every window of the validation split
    whole = perplexity_by_length(run.model, run.corpus(), [seq_len, 2 * seq_len], max_tokens=None)
    assert ccq[f"ppl@{seq_len}"] == pytest.approx(whole[seq_len]) and ccq[f"ppl@{2 * seq_len}"] == pytest.approx(
        whole[2 * seq_len])
    with run.model.ablated():
        ablated = perplexity_by_length(run.model, run.corpus(), [seq_len], max_tokens=None)[seq_len]
    assert ccq[ABLATED] == pytest.approx(ablated) and ccq[ABLATED] != ccq[f"ppl@{seq_len}"]
    write_report(suite, results, plan_of(suite, results), tmp_path / "suite")  # the curve leaves the ablation out
    written = (tmp_path / "suite" / "report.md").read_text()
    assert f"({ccq['ppl_tokens']:,} tokens, in windows of each length)" in written


def test_records_scored_on_a_prefix_are_named_in_their_claims_rows_and_scored_again():
    from attnlab.lab.configs import configured, settings_of
    from attnlab.lab.plan import measurement_of, stands

    claim = Claim("ccq beats gla", "extrapolation", "ppl@128", "ccq-gla", "gla", "lower", relative=True)
    experiment = Experiment("extrapolation", "x", "extrapolation", [Arm("gla", "demo"), Arm("ccq-gla", "demo")],
                            "gla", lengths=[1, 5])
    suite = Suite("toy", "Toy", [experiment], claims=[claim])
    results = Results({"suite": "toy", "runs": {}})
    for arm in ("gla", "ccq-gla"):
        for seed in range(3):
            results.records[RunKey("extrapolation", arm, seed=seed)] = Record.from_json(
                {"ppl@128": 5.0 + seed, "ppl@640": 6.0, "seconds": 1.0, "config": "f",
                 "measured": ["extrapolation", [1, 5], []]})  # written before whole-split scoring
    caveats = report.caveats(suite, results, plan_of(suite, results))
    [row] = report.verdict_table(evaluate(suite.claims, results), caveats=caveats)[2:]
    assert "*scored on a sample*: 6 runs on the first 16,384 tokens of the validation split at each length" in row
    assert "6 of 6 runs were scored on the first 16,384 tokens" in report.scoring_lines(experiment, results)[1]
    key = RunKey("extrapolation", "gla", seed=0)
    cfg, _ = configured(experiment, experiment.arms[0], 0, None, settings_of(suite, results))
    assert not stands(results.get(key), key, experiment, cfg, "f")  # reproduce scores it again
    results.records[key] = results.records[key].replace(measured=measurement_of(experiment))
    assert stands(results.get(key), key, experiment, cfg, "f")


@pytest.mark.parametrize("metric, preset, extra", [("accuracy", "mqar", UNCHANGED),
                                                  ("niah", "demo", Changes.data(source="niah"))])
def test_task_metrics_also_score_the_model_without_the_mechanism(tmp_path, monkeypatch, metric, preset, extra):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    arms = [Arm("gla", preset, Changes.mixer("gla") | extra), Arm("ccq-gla", preset, Changes.mixer("ccq-gla") | extra)]
    suite = Suite("toy", "Toy", [Experiment("task", "x", metric, arms, "gla", lengths=[1])])
    results = run_suite(suite, tmp_path / "suite", seeds=1, extra=TINY, log=lambda *_: None)
    gla, ccq = runs_of(results)["task/gla/0"], runs_of(results)["task/ccq-gla/0"]
    key = "accuracy" if metric == "accuracy" else next(k for k in ccq if k.startswith("niah@"))
    assert not any(k.startswith("ablated") for k in gla)  # nothing of its own to remove
    run = load_run(tmp_path / "suite" / ccq["run"])
    calls = []
    monkeypatch.setattr(type(run.model), "ablated", lambda model: calls.append(model) or contextlib.nullcontext())
    remeasured = measure(suite.experiments[0], tmp_path / "suite" / ccq["run"])
    assert calls and remeasured[ablated(key)] == remeasured[key] == ccq[key]  # a no-op ablation changes nothing
    assert ablated(key) in ccq
    write_report(suite, results, plan_of(suite, results), tmp_path / "suite")  # the curve leaves the ablation out


def test_an_experiment_on_anothers_sweep_measures_its_models_as_they_are_trained(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    arms = [Arm("softmax", "mqar"), Arm("sigmoid", "mqar", Changes.mixer("sigmoid"))]
    swept = Experiment("mqar", "recall", "accuracy", arms, "softmax", lrs=[1e-5, 3e-3])
    again = Experiment("again", "the same models", "accuracy", arms, "softmax", sweep_of="mqar")
    suite = Suite("s", "s", [swept, again], seeds=2)
    trained = []
    monkeypatch.setattr("attnlab.lab.job.train", lambda cfg, **kw: trained.append(cfg.name) or train(cfg, **kw))
    logged = []
    results = run_suite(suite, tmp_path / "suite", extra=[*TINY, "train.steps=6"], log=logged.append)
    runs, order = runs_of(results), [line for line in logged if line.startswith("[s] ")]
    assert order.index("[s] again/sigmoid/1") == order.index("[s] mqar/sigmoid/1") + 1  # at once, not later
    assert len(trained) == len(set(trained)) == 6 and all(name.startswith("mqar-") for name in trained)
    assert not any(key.startswith("again/") and "lr=" in key for key in runs)  # no sweep of its own
    for label in ("softmax", "sigmoid"):
        losses = {lr: runs[str(RunKey("mqar", label, lr=lr))]["best_val_loss"] for lr in swept.lrs}
        best = min(losses, key=losses.get)
        for seed in (0, 1):  # the sweep's choice, measured on the model trained once
            assert runs[f"again/{label}/{seed}"]["config"] == runs[f"mqar/{label}/{seed}"]["config"]
            assert f"-lr{best:g}-s{seed}" in runs[f"again/{label}/{seed}"]["run"]
    assert plan_of(suite, results).superseded == set()
    losing = max(swept.lrs, key=lambda lr: runs[str(RunKey("mqar", "softmax", lr=lr))]["best_val_loss"])
    key = RunKey("mqar", "softmax", lr=losing)
    wrong = Results(results.to_json())
    wrong.records[key] = Record.from_json({**runs[str(key)], "best_val_loss": -1.0})  # now the other rate wins
    again_softmax = {RunKey("again", "softmax", seed=0), RunKey("again", "softmax", seed=1)}
    assert again_softmax <= plan_of(suite, wrong).superseded
    # while another arm's sweep is unfinished, an arm whose sweep is done is still checked; the other is not
    old = plan_of(suite, wrong.without({RunKey("mqar", "sigmoid", lr=swept.lrs[0])})).superseded
    assert again_softmax <= old and not any(k.arm == "sigmoid" for k in old)
    lines = write_report(suite, results, plan_of(suite, results), tmp_path / "suite").read_text()
    assert "Learning rates: each arm's as the sweep of mqar chose it" in lines


def test_a_sweep_compares_rates_by_the_whole_split_loss_where_measured_and_says_what_it_cannot_separate():
    from attnlab.lab.sweeps import sweep_loss

    assert sweep_loss(Record.from_json({"best_val_loss": 1.6, "val_loss": 1.5, "val_tokens": 9999})) == 1.5
    whole = {"best_val_loss": 1.6, "ppl@128": math.e, "ppl@256": 9.0, "ppl_tokens": 99}
    assert sweep_loss(Record.from_json(whole)) == 1.0
    prefix = {"best_val_loss": 1.6, "ppl@128": math.e}
    assert sweep_loss(Record.from_json(prefix)) == 1.6  # scored on a prefix: not used
    sweep = Experiment("lm", "LM", "val_ppl", [Arm("gla", "demo"), Arm("gdn", "demo")], "gla", lrs=[1e-3, 2e-3])
    runs = {str(RunKey("lm", "gla", lr=1e-3)): {"best_val_loss": 1.606}, str(RunKey("lm", "gla", lr=2e-3)):
            {"best_val_loss": 1.6059}, str(RunKey("lm", "gdn", lr=1e-3)): {"best_val_loss": 1.5},
            str(RunKey("lm", "gdn", lr=2e-3)): {"best_val_loss": 1.6}}
    for label, losses in (("gla", [1.6059, 1.60, 1.61]), ("gdn", [1.5, 1.501, 1.499])):
        runs |= {str(RunKey("lm", label, seed=s)): {"best_val_loss": v} for s, v in enumerate(losses)}
    lines = "\n".join(training_lines(Suite("toy", "Toy", [sweep]), sweep, Results({"suite": "toy",
                                                                                         "runs": runs})))
    assert "Not separated by the sweep" in lines and "gla: lr 0.002 best, lr 0.001 (+0.0001 against" in lines
    assert "gdn: lr" not in lines  # 0.1 apart against a spread of 0.001: separated


def test_results_writes_the_results_folder_s_readme_with_links_from_it(tmp_path, monkeypatch, capsys):
    from attnlab.cli import main

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    suite = get_suite("demo")
    suite.experiments = suite.experiments[:1]
    suite.experiments[0].arms = suite.experiments[0].arms[:2]
    run_suite(suite, tmp_path / "results" / "demo", seeds=1, extra=TINY, log=lambda *_: None)
    assert main(["results"]) == 0  # no README yet: one is made with the markers
    text = (tmp_path / "results" / "README.md").read_text()
    assert text.startswith(f"# Results\n\n{README_START}\n") and "](demo/report.md" in text
    assert "](results/" not in text  # links lead from the README's own folder
    assert main(["results"]) == 0 and (tmp_path / "results" / "README.md").read_text() == text
    capsys.readouterr()
    assert main(["results", "--print"]) == 0 and "](results/demo/report.md" in capsys.readouterr().out


def test_a_record_at_no_rate_its_arms_unfinished_sweep_could_choose_is_superseded():
    from attnlab.lab.configs import configured

    arm = Arm("softmax", "demo")
    sweep = Experiment("lm", "LM", "val_ppl", [arm], "softmax", lrs=[1e-3, 2e-3, 4e-3])
    suite, settings = Suite("s", "s", [sweep], seeds=2), Settings(Path("runs"), seeds=2)
    before = Arm("softmax", "demo", Changes.train(steps=7))  # the arm's protocol before: fewer steps
    at_before = configured(sweep, before, 0, None, settings)[1]
    at_grid = configured(sweep, arm, 1, 2e-3, settings)[1]  # a rate the sweep may yet choose
    results = Results({"suite": "s", "runs": {}})
    results.records[RunKey("lm", "softmax", seed=0)] = Record.from_json({"val_ppl": 5.0, "config": at_before})
    results.records[RunKey("lm", "softmax", seed=1)] = Record.from_json({"val_ppl": 5.0, "config": at_grid})
    assert plan(suite, [sweep], results, settings).superseded == {RunKey("lm", "softmax", seed=0)}


def test_a_report_reads_a_record_written_by_hand_without_its_seconds(tmp_path):
    lm = Experiment("lm", "LM", "val_ppl", [Arm("softmax", "demo")], "softmax")
    suite = Suite("s", "s", [lm])
    results = Results({"suite": "s", "runs": {"lm/softmax/0": {"val_ppl": 5.0}}})
    report = write_report(suite, results, plan_of(suite, results), tmp_path).read_text()
    assert "0.0 minutes of training and evaluation" in report and "| softmax | 5 |" in report
    results.data["meta"] = {"commit": "abc1234"}  # the code the runs came from, where the driver could tell
    assert "from commit abc1234" in write_report(suite, results, plan_of(suite, results), tmp_path).read_text()
