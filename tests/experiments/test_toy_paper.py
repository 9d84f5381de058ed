"""A paper added from outside src/ (tests/experiments/toy_paper.py: a mixer, a metric, a task, a bench case and a
suite with a claim), imported on the command line and reproduced, benched and listed like the built-in ones."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab import plugins
from attnlab.bench import registry as bench_registry
from attnlab.cli import main
from attnlab.data import tasks
from attnlab.lab import metrics, registry
from attnlab.mixers import registry as mixer_registry

TOY = Path(__file__).parent / "toy_paper.py"


@pytest.fixture
def registries_restored():
    """The registries as they were before the test: the toy paper registers into them for this test only (and the
    next test's --import imports it again, into registries without it)."""
    saved = [(table, dict(table)) for table in (registry.SUITES, registry.PAPERS, bench_registry.BENCH_CASES,
                                                 metrics.METRICS, tasks.TASKS, mixer_registry._REGISTRY,
                                                 plugins._files)]
    imported = list(plugins.IMPORTED)
    yield
    for table, before in saved:
        table.clear()
        table.update(before)
    plugins.IMPORTED[:] = imported


def test_a_paper_from_outside_src_is_reproduced_like_a_built_in_one(registries_restored, tmp_path, monkeypatch,
                                                                     capsys):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    assert main(["--import", str(TOY), "reproduce", "toy", "--quick", "--out", str(tmp_path)]) == 0
    folder = tmp_path / "toy-quick"
    report = (folder / "report.md").read_text()
    assert "toy attention is as good as softmax" in report and "heads@2" in report
    assert "toy attention" in report.split("## ")[0]  # its provenance, in the header
    assert (folder / "heads.png").is_file()
    assert "toy" in registry.PAPERS and "toy_heads" in metrics.METRICS and "toy-attention" in mixer_registry._REGISTRY
    # the toy task: trained on, measured by the suite's accuracy metric
    copy = json.loads((folder / "results.json").read_text())["runs"]["copy/toy/0"]
    assert 0 <= copy["accuracy"] <= 1 and "toy-copy" in tasks.TASKS
    assert json.loads((folder / "results.json").read_text())["source"] == str(TOY.resolve())
    assert main(["--import", str(TOY), "list"]) == 0
    assert "toy-attention" in capsys.readouterr().out
    assert main(["--import", str(TOY), "bench", "--toy"]) == 0  # its bench case, a flag of its own
    assert "toy-attention / softmax at T=32" in capsys.readouterr().out

    # a run trained on the toy task records the file that registers it: eval in a new process needs no --import
    done = subprocess.run([sys.executable, "-m", "attnlab.cli", "eval", str(folder / "runs" / "copy-toy-s0"),
                           "--task", "toy-copy"], capture_output=True, text=True,
                          env={**os.environ, "ATTNLAB_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    assert f"toy-copy test accuracy: {100 * copy['accuracy']:.2f}%" in done.stdout


def test_a_paper_from_outside_src_is_reported_from_where_its_results_record_it(registries_restored, tmp_path):
    """results.json names the file its paper came from: report and results import it in a new process (without
    --import), and where the file is gone, say in one line how to import the paper."""
    folder = tmp_path / "toy-quick"
    folder.mkdir()
    runs = {f"copy/{arm}/0": {"accuracy": 0.5, "seconds": 1.0, "params": 10} for arm in ("toy", "softmax")}
    results = {"suite": "toy", "tier": "default", "quick": True, "runs": runs, "source": str(TOY.resolve())}
    (folder / "results.json").write_text(json.dumps(results))
    env = {**os.environ, "ATTNLAB_CACHE": str(tmp_path / "cache")}
    for command in (["report", str(folder)], ["results", "--root", str(tmp_path), "--print"]):
        done = subprocess.run([sys.executable, "-m", "attnlab.cli", *command], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
    assert "toy attention is as good as softmax" in (folder / "report.md").read_text()
    (folder / "results.json").write_text(json.dumps({**results, "source": str(tmp_path / "moved.py")}))
    done = subprocess.run([sys.executable, "-m", "attnlab.cli", "report", str(folder)], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"whose paper it records in {tmp_path / 'moved.py'}, which no longer exists; pass --import" in done.stderr


def test_a_suite_says_each_config_note_once_in_its_run_and_none_in_its_reports(registries_restored, tmp_path,
                                                                             monkeypatch, caplog):
    """The toy's arms take the demo preset's 100 warmup steps into runs of 4: the run says it once; its report and
    `attnlab report`, which make the config of every arm again (those not trained here among them), say none."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING, logger="attnlab.config"):
        assert main(["--import", str(TOY), "reproduce", "toy", "--only", "lm", "--out", str(tmp_path)]) == 0
        assert main(["--import", str(TOY), "report", str(tmp_path / "toy")]) == 0
    notes = [record.getMessage() for record in caplog.records if record.name == "attnlab.config"]
    assert notes == ["note: train.warmup_steps=100 is more than half of train.steps=4; warming up for 2 steps (set "
                     "train.warmup_steps=2 or less to choose)"]
