"""Every suite runs end to end in a reduced form and writes a report with all its tables and plots."""

import json

import pytest

from attnlab.experiments.report import write_report
from attnlab.experiments.runner import run_suite
from attnlab.experiments.stats import mean_std, paired_difference
from attnlab.experiments.suites import SUITES

TINY = ["train.steps=2", "train.batch_size=2", "train.eval_batches=1", "train.eval_every=2", "train.ckpt_every=2",
        "model.d_model=16", "model.n_layers=1", "data.max_chars=20000", "data.mqar.train_examples=16",
        "data.mqar.test_examples=8", "data.mqar.vocab_size=256", "data.brackets.train_examples=16",
        "data.brackets.test_examples=8", "data.niah.train_examples=4", "data.niah.test_per_depth=1",
        "model.mixer_options.interdomain.modes=4", "model.mixer_options.s4d.modes=4",
        "model.mixer_options.boltzmann.dqa_steps=5", "model.mixer_options.boltzmann.dqa_shots=8"]


@pytest.mark.parametrize("name", sorted(SUITES))
def test_suite_runs_and_reports(name, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    suite = SUITES[name]()
    results = run_suite(suite, tmp_path, seeds=1, quick=True, extra=TINY, log=lambda *_: None)
    expected = {f"{e.name}/{a.label}/0" for e in suite.experiments for a in e.arms}
    assert set(results["runs"]) == expected
    assert json.loads((tmp_path / "results.json").read_text()) == results
    report = write_report(suite, results, tmp_path, seeds=1).read_text()
    for experiment in suite.experiments:
        assert f"## {experiment.title}" in report
        assert (tmp_path / f"{experiment.name}.png").stat().st_size > 1000
        for arm in experiment.arms:
            assert f"| {arm.label} |" in report


def test_an_interrupted_suite_resumes_without_rerunning(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    suite = SUITES["demo"]()
    suite.experiments = suite.experiments[:1]
    suite.experiments[0].arms = suite.experiments[0].arms[:2]
    first = run_suite(suite, tmp_path, seeds=1, extra=TINY, log=lambda *_: None)
    calls = []
    second = run_suite(suite, tmp_path, seeds=2, extra=TINY, log=calls.append)
    assert all(first["runs"][k] == second["runs"][k] for k in first["runs"])
    assert len(second["runs"]) == 4 and sum("seed 1" in c for c in calls) == 2 and not any("seed 0" in c for c in calls)


def test_statistics():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    diff, half = paired_difference([2.0, 3.0, 4.0], [1.0, 1.5, 2.5])
    assert diff == pytest.approx(4 / 3) and half == pytest.approx(4.303 * (1 / 12) ** 0.5 / 3**0.5, rel=1e-3)
