"""A paper added from outside src/ (tests/experiments/toy_paper.py: a mixer, a metric, a suite with a claim),
imported on the command line and reproduced like the built-in ones."""

from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.experiments import metrics, registry
from attnlab.mixers import registry as mixer_registry

TOY = Path(__file__).parent / "toy_paper.py"


@pytest.fixture
def registries_restored():
    """The registries as they were before the test: the toy paper registers into them for this test only."""
    saved = [(table, dict(table)) for table in (registry.SUITES, registry.PAPERS, metrics.METRICS,
                                                 mixer_registry._REGISTRY)]
    yield
    for table, before in saved:
        table.clear()
        table.update(before)


def test_a_paper_from_outside_src_is_reproduced_like_a_built_in_one(registries_restored, tmp_path, monkeypatch,
                                                                     capsys):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    assert main(["--import", str(TOY), "reproduce", "toy", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "toy" / "report.md").read_text()
    assert "toy attention is as good as softmax" in report and "heads@2" in report
    assert "toy attention" in report.split("## ")[0]  # its provenance, in the header
    assert (tmp_path / "toy" / "heads.png").is_file()
    assert "toy" in registry.PAPERS and "toy_heads" in metrics.METRICS and "toy-attention" in mixer_registry._REGISTRY
    assert main(["--import", str(TOY), "list"]) == 0
    assert "toy-attention" in capsys.readouterr().out
