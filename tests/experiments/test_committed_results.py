"""Every committed results folder: its results.json reads and writes back unchanged, and its report.md is what
the report writes from it today (the figures are drawn but not rendered: their names are in the text)."""

import json
from pathlib import Path

import pytest

from attnlab.lab import claim_plots, report, state_size
from attnlab.lab.plan import plan_of
from attnlab.lab.store import Results
from attnlab.papers import get_suite

RESULTS = Path(__file__).resolve().parents[2] / "results"
FOLDERS = sorted(path.parent for path in RESULTS.glob("*/results.json"))


def test_every_results_folder_is_checked():
    assert len(FOLDERS) >= 9  # the committed suites: a moved folder must not drop out of the test unseen


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda folder: folder.name)
def test_a_committed_results_file_round_trips_and_regenerates_its_report(folder, tmp_path, monkeypatch):
    text = (folder / "results.json").read_text()
    results = Results.load(folder / "results.json")
    assert json.dumps(results.to_json(), indent=1) == text
    for module in (report, claim_plots, state_size):  # rendering a PNG is most of a report's time
        monkeypatch.setattr(module, "save_figure", _unrendered)
    suite = get_suite(results.suite, results.tier)
    written = report.write_report(suite, results, plan_of(suite, results), tmp_path)
    assert written.read_text() == (folder / "report.md").read_text()


def _unrendered(fig, path, **_) -> Path:
    import matplotlib.pyplot as plt

    plt.close(fig)
    return Path(path)
