"""RULER's grid and accuracy against state size in a report, from the fields the niah and accuracy metrics record."""

import pytest

from attnlab.data import Floor
from attnlab.lab.plan import plan_of
from attnlab.lab.report import write_report
from attnlab.lab.spec import Arm, Experiment, Suite
from attnlab.lab.state_size import accuracy_key, ruler_grid, state_section, unlearned
from attnlab.lab.store import Record, Results, RunKey
from attnlab.lab.verdicts import no_floors


def suite_with_records(tmp_path):
    niah = Experiment("niah", "S-NIAH", "niah", [Arm("softmax", "demo"), Arm("gla", "demo")], "softmax")
    parity = Experiment("parity", "parity", "accuracy", [Arm("softmax", "demo"), Arm("gla", "demo")], "softmax")
    results = Results({"suite": "s", "runs": {}})
    for seed in range(2):
        for label, size, hit in (("softmax", 65536, 1.0), ("gla", 4096, 0.5 + 0.25 * seed)):
            results.records[RunKey("niah", label, seed=seed)] = Record.from_json(
                {"niah@128": hit, "niah@256": hit / 2, "niah_depths": {"128": {"0": hit, "1": 1.0},
                                                                        "256": {"0": hit / 2, "1": 0.0}},
                 "state_bytes": size, "seconds": 1.0})
            accuracy = 0.9 if label == "gla" else 0.6
            results.records[RunKey("parity", label, seed=seed)] = Record.from_json(
                {"accuracy": accuracy, "state_bytes": size, "seconds": 1.0})
    return Suite("s", "s", [niah, parity]), results


def test_the_ruler_grid_is_each_arms_mean_by_depth_and_length(tmp_path):
    suite, results = suite_with_records(tmp_path)
    grid = ruler_grid(suite.experiments[0], results)
    assert "| arm | depth | 128 tokens | 256 tokens |" in grid
    assert "| gla | 0 | 62 | 31 |" in grid and "| gla | 1 | 100 | 0 |" in grid  # (50 + 75) / 2 at depth 0
    assert "| softmax | 0 | 100 | 50 |" in grid
    assert ruler_grid(suite.experiments[1], results) == []  # no grid recorded


def test_accuracy_against_state_size_reads_each_experiments_accuracy_at_the_training_length(tmp_path):
    suite, results = suite_with_records(tmp_path)
    assert [accuracy_key(e, results) for e in suite.experiments] == ["niah@128", "accuracy"]
    lines = state_section(suite, results, tmp_path, no_floors)
    assert "| niah | 100.0% at 64 KiB | 62.5% at 4 KiB |" in lines
    assert "| parity | 60.0% at 64 KiB | 90.0% at 4 KiB |" in lines
    assert (tmp_path / "state.png").stat().st_size > 0
    # an arm at or under its task's chance floor shows no accuracy: it did not learn the task
    coin = Floor(0.6, "a coin")
    floored = state_section(suite, results, tmp_path, lambda e, key: coin if e == "parity" else None)
    assert "| parity | not learned, at 64 KiB | 90.0% at 4 KiB |" in floored
    assert unlearned(suite.experiments[1], results, lambda e, key: coin) == {"softmax": coin}
    (tmp_path / "report").mkdir()
    report = write_report(suite, results, plan_of(suite, results), tmp_path / "report").read_text()
    assert "## Accuracy against state size" in report and "By depth of the needle" in report
    for key, record in results.items():  # records from before the state was recorded: no section
        results.records[key] = record.replace(details={})
    assert state_section(suite, results, tmp_path, no_floors) == []


def test_a_plan_reads_each_experiments_chance_floor_from_its_task_and_the_table_shows_no_accuracy_under_it(tmp_path):
    from attnlab.lab.report import experiment_table
    from attnlab.papers import get_suite

    suite = get_suite("yardsticks")
    plan = plan_of(suite, Results({"suite": "yardsticks", "runs": {}}))
    assert plan.floor("mqar-matched", "accuracy").value == pytest.approx(3 / 7)  # pairs 1, 2 and 4 pooled
    assert plan.floor("parity", "acc@64").value == 0.5 and plan.floor("nothing", "accuracy") is None
    matched = suite.experiments[1]
    results = Results({"suite": "yardsticks", "runs": {}})
    for seed in range(3):
        for label, accuracy in (("softmax", 0.9), ("gla", 0.02)):
            results.records[RunKey("mqar-matched", label, seed=seed)] = Record.from_json(
                {"accuracy": accuracy + seed / 100, "seconds": 1.0})
    floored = unlearned(matched, results, plan.floor)
    assert list(floored) == ["gla"]
    table = "\n".join(experiment_table(matched, results, floored=floored))
    assert "| gla | *not learned*: at or under the chance floor, 42.9% (copying a value from the context) |" in table
    assert "2.0" not in table and "| softmax | 91% ± 1 |" in table
