"""Predicting a plan's time on a GPU from its doctor report, and the GPU science script's plan."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.config import load_config
from attnlab.lab.device_times import DEMO_LAYERS, DeviceTimes, Line, wall_seconds

ROOT = Path(__file__).resolve().parents[2]


def report(tmp_path, packing=None) -> Path:
    """A doctor report: the demo's 100 steps in 1 s; softmax layers 1 ms + 1 us per token, gla 4 ms + 2 us per
    token, gdn superlinear (1 ms at 1000, 8 ms at 4000)."""
    speed = {str(n): {"softmax": {"ms": 1 + 0.001 * n}, "gla": {"ms": 4 + 0.002 * n}, "gdn": {"ms": g}}
             for n, g in ((1000, 1.0), (4000, 8.0))}
    data = {"environment": {"cuda": True, "gpu": "Test GPU"}, "train": {"steps": 100, "seconds": 1.0}, "speed": speed}
    if packing:
        data["packing"] = packing
    path = tmp_path / "doctor.json"
    path.write_text(json.dumps(data))
    return path


def test_a_layer_line_passes_through_both_timings_or_bounds_a_superlinear_one_from_above():
    assert Line.through({1000: 2e-3, 4000: 5e-3}) == pytest.approx(Line(1e-3, 1e-6))
    superlinear = Line.through({1000: 1e-3, 4000: 8e-3})  # a negative intercept: the line through the origin
    assert superlinear == Line(0.0, 1e-6)
    assert superlinear.seconds(4000, 8, 512) < 8e-3  # below the longer timing, above the curve's shorter one


def test_a_step_is_the_demos_rest_plus_each_layers_line_at_the_runs_size(tmp_path):
    device = DeviceTimes.load(report(tmp_path))
    assert device.device == "Test GPU" and device.demo_step == pytest.approx(0.01)
    demo = load_config("demo")  # the doctor's own demo: its step comes back
    assert device.step_seconds(demo) == pytest.approx(0.01)
    gla = load_config("demo", ["model.mixer=gla", "model.n_layers=2", "train.grad_accum=2", "train.batch_size=16"])
    softmax_layer = 1e-3 + 1e-6 * 128 * 16 * 128 / (8 * 512)
    rest = (0.01 - DEMO_LAYERS * softmax_layer) / DEMO_LAYERS
    gla_layer = 4e-3 + 2e-6 * 128 * 8 * 128 / (8 * 512)  # micro-batches of 8
    assert device.step_seconds(gla) == pytest.approx(2 * (2 * gla_layer + 2 * rest))
    assert device.step_seconds(load_config("demo", ["model.mixer=s4d"])) is None  # not timed


def test_runs_at_once_share_the_gpu_as_the_packing_section_measured(tmp_path):
    alone = DeviceTimes.load(report(tmp_path))
    assert alone.slowdown(8) == 1 and "not measured" in alone.assumption()
    packed = DeviceTimes.load(report(tmp_path, {"1": {"x_one": 1.0}, "4": {"x_one": 2.0}, "16": {"x_one": 4.0}}))
    assert packed.slowdown(1) == 1 and packed.slowdown(3) == 2 and packed.slowdown(4) == 2
    assert packed.slowdown(5) == 4 and packed.slowdown(40) == 4


def test_jobs_go_to_the_first_free_worker_in_order():
    assert wall_seconds([10, 10, 10], 3) == 10
    assert wall_seconds([10, 1, 1, 1, 10], 2) == 13
    assert wall_seconds([5, 5], 1) == 10


@pytest.mark.parametrize("argv, says", [
    (["--predict-on", "{report}"], "--predict-on predicts a plan's times without training: give it with --dry-run"),
    (["--dry-run", "--predict-on", "{missing}"], "not a readable doctor.json"),
    (["--dry-run", "--predict-on", "{cpu}"], "give a doctor.json written on a GPU"),
])
def test_predicting_without_a_dry_run_or_a_gpus_report_is_one_line(argv, says, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("attnlab.lab.job.train", lambda *a, **k: pytest.fail("nothing trains"))
    (tmp_path / "cpu.json").write_text(json.dumps({"environment": {"cuda": False}, "train": None, "speed": {}}))
    files = {"report": report(tmp_path), "missing": tmp_path / "absent.json", "cpu": tmp_path / "cpu.json"}
    argv = [a.format(**files) for a in argv]
    assert main(["reproduce", "coupled-qk", "--quick", "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_a_dry_run_predicts_each_job_and_the_whole_on_the_gpu(tmp_path, capsys):
    assert main(["reproduce", "coupled-qk", "--quick", "--only", "lm", "--arms", "softmax", "--dry-run",
                 "--predict-on", str(report(tmp_path)), "--jobs", "2", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert f"estimated training time on Test GPU, predicted from {tmp_path / 'doctor.json'}" in printed
    per_job = [int(s) for s in re.findall(r"trains\s+(\d+) s$", printed, re.M)]
    assert per_job and "with 2 at once, from start to end" in printed


def test_the_gpu_science_script_plans_every_suite_within_its_deadline_on_a_cpu(tmp_path):
    """The committed H200 doctor report predicts the script's three suites, side by side, within 8 minutes."""
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-science.sh"), "--dry-run", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    walls = [int(s) for s in re.findall(r"from start to end: about [^(]*\((\d+) s;", done.stdout)]
    assert len(walls) == 3 and max(walls) <= 480, walls
    for name in ("cube-patient/interdomain/2", "niah-256/ccq-gla/2", "lm/coupled-euler/9"):
        assert re.search(rf"{re.escape(name)}\s+trains", done.stdout), name
    assert "on NVIDIA H200, predicted from results/doctor/doctor.json" in done.stdout
    assert not list(tmp_path.glob("*/runs"))  # planned, nothing trained
