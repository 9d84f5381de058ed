"""RULER's grid and accuracy against state size in a report, from the fields the niah and accuracy metrics record."""

from attnlab.lab.plan import plan_of
from attnlab.lab.report import write_report
from attnlab.lab.spec import Arm, Experiment, Suite
from attnlab.lab.state_size import accuracy_key, ruler_grid, state_section
from attnlab.lab.store import Record, Results, RunKey


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
    lines = state_section(suite, results, tmp_path)
    assert "| niah | 100.0% at 64 KiB | 62.5% at 4 KiB |" in lines
    assert "| parity | 60.0% at 64 KiB | 90.0% at 4 KiB |" in lines
    assert (tmp_path / "state.png").stat().st_size > 0
    (tmp_path / "report").mkdir()
    report = write_report(suite, results, plan_of(suite, results), tmp_path / "report").read_text()
    assert "## Accuracy against state size" in report and "By depth of the needle" in report
    for key, record in results.items():  # records from before the state was recorded: no section
        results.records[key] = record.replace(details={})
    assert state_section(suite, results, tmp_path) == []
