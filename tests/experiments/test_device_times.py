"""Predicting a plan's time on a GPU from its doctor report, and the GPU science script's plan: the rows it carries,
its compile warm-up and packing (measured, or named as unmeasured), its deadline and device calls."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.config import load_config
from attnlab.lab import side_by_side
from attnlab.lab.device_times import ASSUMED_WARMUP, DEMO_LAYERS, DeviceTimes, Line, packed_wall
from attnlab.lab.driver import dry_run
from attnlab.papers import get_suite

ROOT = Path(__file__).resolve().parents[2]


def report(tmp_path, packing=None, compile=None, rate=None) -> Path:
    """A doctor report: the demo's 100 steps in 1 s (at `rate` tokens/s where given); softmax layers 1 ms + 1 us per
    token, coupled-qk 2 ms + 1 us, gla 4 ms + 2 us per token, gdn superlinear (1 ms at 1000, 8 ms at 4000)."""
    speed = {str(n): {"softmax": {"ms": 1 + 0.001 * n}, "coupled-qk": {"ms": 2 + 0.001 * n},
                      "gla": {"ms": 4 + 0.002 * n}, "gdn": {"ms": g}} for n, g in ((1000, 1.0), (4000, 8.0))}
    train = {"steps": 100, "seconds": 1.0, **({"tokens_per_s": rate} if rate else {})}
    data = {"environment": {"cuda": True, "gpu": "Test GPU"}, "train": train, "speed": speed}
    for name, section in (("packing", packing), ("compile", compile)):
        if section is not None:
            data[name] = section
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


def test_the_demos_steady_step_leaves_its_start_up_to_be_paid_once_a_run(tmp_path):
    device = DeviceTimes.load(report(tmp_path, rate=16 * 128 / 0.008))  # a steady step of 8 ms
    assert device.demo_step == pytest.approx(0.008) and device.start_up == pytest.approx(1.0 - 100 * 0.008)
    demo = load_config("demo", ["train.steps=1000"])
    assert device.run_parts(demo) == pytest.approx((0.2, 8.0))


def test_a_compiled_run_pays_the_compile_warm_up_the_doctor_measured_or_the_one_assumed(tmp_path):
    compiled = load_config("demo", ["train.steps=100", "train.compile=true"])
    eager = load_config("demo", ["train.steps=100"])
    measured = DeviceTimes.load(report(tmp_path, compile={"warmup_s": 30.0, "tokens_per_s": 1e6}))
    assert measured.run_parts(compiled) == pytest.approx((30.0, 1.0)) and measured.run_parts(eager)[0] == 0
    assert "compile warm-up: 30 s measured" in " ".join(measured.assumptions())
    assumed = DeviceTimes.load(report(tmp_path))
    assert assumed.run_parts(compiled)[0] == ASSUMED_WARMUP
    assert (f"compile warm-up: {ASSUMED_WARMUP:.0f} s ASSUMED, unmeasured (the report has no compile section)"
            in " ".join(assumed.assumptions()))
    failed = DeviceTimes.load(report(tmp_path, compile={"error": "BackendCompilerFailed: no compiler"}))
    assert "the doctor's compile section failed: BackendCompilerFailed" in " ".join(failed.assumptions())


def test_runs_at_once_share_the_gpu_as_the_packing_section_measured(tmp_path):
    alone = DeviceTimes.load(report(tmp_path))
    assert "packing UNMEASURED (the report has no packing section)" in " ".join(alone.assumptions())
    packed = DeviceTimes.load(report(tmp_path, {"1": {"x_one": 1.0}, "4": {"x_one": 2.0}, "16": {"x_one": 4.0}}))
    assert packed.slowdown(1) == 1 and packed.slowdown(3) == 2 and packed.slowdown(4) == 2
    assert packed.slowdown(5) == 4 and packed.slowdown(40) == 4
    assert "4 at once each at 0.50" in " ".join(packed.assumptions())
    failed = DeviceTimes.load(report(tmp_path, {"error": "RuntimeError: a copy died"}))
    assert not failed.packing and "the doctor's packing section failed: RuntimeError" in " ".join(failed.assumptions())


def test_jobs_go_to_the_first_free_worker_in_order():
    alone = lambda n: 1.0  # noqa: E731
    assert packed_wall([([(0, 10)] * 3, 3)], alone) == 10
    assert packed_wall([([(0, 10), (0, 1), (0, 1), (0, 1), (0, 10)], 2)], alone) == 13
    assert packed_wall([([(0, 5), (0, 5)], 1)], alone) == 10


def test_runs_sharing_the_gpu_slow_only_their_steps_and_across_groups():
    shared = lambda n: float(n)  # noqa: E731  (the GPU's time split evenly: the steps one after another)
    assert packed_wall([([(0, 10), (0, 10)], 2)], shared) == pytest.approx(20)
    assert packed_wall([([(5, 10), (5, 10)], 2)], shared) == pytest.approx(25)  # both warm up on the CPU at once
    # one steps alone while the other warms up (5 s), they share the GPU (10 s), the second ends alone (5 s)
    assert packed_wall([([(0, 10)], 1), ([(5, 10)], 1)], shared) == pytest.approx(20)
    # a group of one 10 s job beside one of two 4 s jobs: 18 s of steps, shared throughout
    assert packed_wall([([(0, 10)], 1), ([(0, 4), (0, 4)], 1)], shared) == pytest.approx(18)
    assert packed_wall([([(0, 10)], 1), ([(0, 4), (0, 4)], 1)], lambda n: 1.0) == pytest.approx(10)


def test_from_start_to_end_is_a_range_until_packing_is_measured(tmp_path):
    groups = [([(1, 10), (1, 10)], 2)]
    assert DeviceTimes.load(report(tmp_path)).walls(groups) == pytest.approx((11, 21))
    packed = DeviceTimes.load(report(tmp_path, {"1": {"x_one": 1.0}, "2": {"x_one": 1.6}}))
    assert packed.walls(groups) == pytest.approx((1 + 10 / 0.8, 1 + 10 / 0.8))


def test_the_deadline_is_sized_from_the_prediction_and_the_calls_counted():
    assert side_by_side.deadline(100) == 125 and side_by_side.deadline(1000) == side_by_side.MOST == 480
    assert side_by_side.device_calls(400, 480, 60) == 1
    assert side_by_side.device_calls(1000, 480, 60) == 3  # 480 s, then 420 s of steps a call after the warm-up


@pytest.mark.parametrize("argv, says", [
    (["--predict-on", "{report}"], "--predict-on predicts a plan's times without training: give it with --dry-run"),
    (["--dry-run", "--predict-on", "{missing}"], "not a readable doctor.json"),
    (["--dry-run", "--predict-on", "{cpu}"], "give a doctor.json written on a GPU"),
    (["--dry-run", "--predict-on", "{bad_packing}"], "packing['4'] is not a count of runs at once with a positive"),
    (["--dry-run", "--predict-on", "{bad_compile}"], "compile['warmup_s'] is 'soon', not a number of 0 or more"),
])
def test_predicting_without_a_dry_run_or_a_gpus_report_is_one_line(argv, says, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("attnlab.lab.job.train", lambda *a, **k: pytest.fail("nothing trains"))
    (tmp_path / "cpu.json").write_text(json.dumps({"environment": {"cuda": False}, "train": None, "speed": {}}))
    files = {"missing": tmp_path / "absent.json", "cpu": tmp_path / "cpu.json"}
    for name, sections in (("bad_packing", {"packing": {"1": {"x_one": 1.0}, "4": {"x_one": 0}}}),
                           ("bad_compile", {"compile": {"warmup_s": "soon"}})):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(report(tmp_path, **sections).read_text())
    files["report"] = report(tmp_path)
    argv = [a.format(**files) for a in argv]
    assert main(["reproduce", "coupled-qk", "--quick", "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_a_dry_run_predicts_each_job_and_the_whole_on_the_gpu(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # packing runs on the GPU it predicts, not here
    assert main(["reproduce", "coupled-qk", "--quick", "--only", "lm", "--arms", "softmax", "--dry-run",
                 "--predict-on", str(report(tmp_path)), "--jobs", "2", "--runs-per-gpu", "2",
                 "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert f"training time predicted on Test GPU from {tmp_path / 'doctor.json'}" in printed
    per_job = [int(s) for s in re.findall(r"trains\s+(\d+) s$", printed, re.M)]
    assert per_job and re.search(r"with 2 at once, from start to end: \d+ s \(\d+ s\) with every run at its speed "
                                 r"alone to \d+ s \(\d+ s\) with their steps one after another", printed)
    assert "packing UNMEASURED" in printed and "not counted: evaluation every train.eval_every steps" in printed


def test_a_gpu_tiers_dry_run_without_device_times_says_its_time_is_a_flop_bound(tmp_path, capsys):
    assert get_suite("yardsticks", "converged").gpu
    assert main(["reproduce", "yardsticks", "--tier", "converged", "--dry-run", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "a FLOP bound on their training time, not a prediction" in printed
    assert re.search(r"; at least \d+ s of training in all by FLOPs \(a lower bound, not a prediction\)", printed)
    assert re.search(r"trains\s+≥ \d+ s$", printed, re.M) and "about" not in printed.split("jobs;")[1]


def lm_folder(tmp_path, stopped_early=("coupled-euler", 1)) -> Path:
    """coupled-qk's converged records of lm, seeds 0-2 and the sweeps only, all at their 4,000-step cap but one
    (stopped_early: its arm and seed), in tmp_path/coupled-qk-converged."""
    data = json.loads((ROOT / "results" / "coupled-qk-converged" / "results.json").read_text())
    keep = {key: record for key, record in data["runs"].items() if key.startswith("lm/")
            and (key.rsplit("/", 1)[1].startswith("lr=") or int(key.rsplit("/", 1)[1]) <= 2)}
    for key, record in keep.items():
        record.update(steps=4000, stopped_early=key == "lm/{}/{}".format(*stopped_early))
    folder = tmp_path / "coupled-qk-converged"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({**data, "runs": keep}))
    return tmp_path


def test_the_plan_lists_the_rows_its_runs_carry_and_which_are_headlines(tmp_path, capsys):
    out = lm_folder(tmp_path)
    assert main(["reproduce", "coupled-qk", "--tier", "converged", "--only", "lm", "--arms", "softmax",
                 "coupled-euler", "--seeds", "10", "--dry-run", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert ("  lm: 14 runs new (softmax, coupled-euler; seeds 3-9): 14 train; to early stopping or a cap of 4,000 "
            "steps; of its 6 runs so far, 5 ended at their cap (not converged), and the new ones have the same cap"
            in printed)
    assert "    HEADLINE: coupling lowers perplexity vs softmax (7 of its 10 paired seeds new: 3-9)" in printed
    assert "uncoupled" not in printed.split("rows these jobs carry")[1]  # its seeds 0-2 gain no pair
    assert "headline rows of coupled-qk (converged) carried: 1 of 1 (coupling lowers perplexity vs softmax)" in printed


def test_a_plan_of_rows_that_are_not_headlines_says_it_carries_none(tmp_path, capsys):
    assert main(["reproduce", "ccq", "--tier", "converged", "--only", "niah-256", "--arms", "softmax", "gla",
                 "ccq-gla", "--dry-run", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "    not a headline: CCQ-GLA beats GLA on S-NIAH at the training length (trained at 256 tokens)" in printed
    assert "CCQ-GDN" not in printed.split("rows these jobs carry")[1]  # no GDN arm trains
    assert re.search(r"headline rows of ccq \(converged\) carried: none \(its headlines: CCQ improves recall over "
                     r"its backbone .* \(on niah\)\)", printed)


PLAN = "coupled-qk 2 --only lm --arms softmax coupled-euler --seeds 10"


def test_plans_side_by_side_predict_one_time_where_packing_and_compiling_were_measured(tmp_path, capsys):
    doctor = report(tmp_path, {"1": {"x_one": 1.0}, "2": {"x_one": 1.5}}, {"warmup_s": 30.0, "tokens_per_s": 1e6})
    out = lm_folder(tmp_path / "out")
    assert side_by_side.main(["--predict-on", str(doctor), "--out", str(out), PLAN], get_suite) == 0
    printed = capsys.readouterr().out
    assert "compile warm-up: 30 s measured" in printed and "4 at once" not in printed
    wall = int(re.search(r"^side by side on one Test GPU \(workers: coupled-qk 2; 2 runs at once at most\), from "
                         r"start to end: about [^(]*\((\d+) s\)", printed, re.M)[1])
    device = DeviceTimes.load(doctor)
    plan = dry_run(get_suite("coupled-qk", "converged"), out / "coupled-qk-converged", seeds=10, only=["lm"],
                   arms=["softmax", "coupled-euler"])
    parts = [device.run_parts(job.cfg) for job in plan.jobs if job.status == "train"]
    assert len(parts) == 14 and all(part[0] == pytest.approx(30.0) for part in parts)
    # alone while the other compiles, else the two at once, each at 0.75 of its speed alone
    expected = packed_wall([(parts, 2)], lambda n: 1 if n == 1 else 1 / 0.75)
    assert wall == round(expected) and expected > packed_wall([(parts, 2)], lambda n: 1.0)
    limit = min(480, math.ceil(expected * 1.25))
    calls = side_by_side.device_calls(expected, limit, device.start_up + 30.0)
    assert f"deadline: {limit} s a call (the prediction x 1.25, at most 480 s" in printed
    assert re.search(rf"device calls needed: {calls}(;|$)", printed, re.M)


def test_plans_side_by_side_give_a_range_and_a_range_of_calls_until_packing_is_measured(tmp_path, capsys):
    out = lm_folder(tmp_path / "out")
    assert side_by_side.main(["--predict-on", str(report(tmp_path)), "--out", str(out), "--deadline", "100", PLAN],
                             get_suite) == 0
    printed = capsys.readouterr().out
    assert "with their steps one after another" in printed and "packing UNMEASURED" in printed
    assert re.search(r"^deadline: 100 s a call \(given: .*device calls needed: \d+ to \d+ \(packing unmeasured",
                     printed, re.M)


@pytest.mark.parametrize("plan, says", [
    ("coupled-qk none", "plan 'coupled-qk none': argument workers: 'none' is not an integer; a plan is SUITE WORKERS"),
    ("coupled-qk 2 --only nothing-like-it", "--only nothing-like-it matches no experiment of coupled-qk"),
    ("coupled-qk 2 --tier paper", "plan 'coupled-qk 2 --tier paper': unrecognized arguments: --tier paper"),
    ("no-such-suite 2", "no-such-suite"),
])
def test_a_wrong_plan_is_one_line(plan, says, tmp_path, capsys):
    assert side_by_side.main(["--predict-on", str(report(tmp_path)), "--out", str(tmp_path), plan], get_suite) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_the_gpu_science_script_plans_its_rows_time_and_calls_on_a_cpu(tmp_path):
    """The committed H200 doctor report predicts the script's three plans side by side; the rows they carry are
    listed with whether each is a headline, and the deadline and device calls come from the prediction."""
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    env.pop("DEADLINE", None)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-science.sh"), "--dry-run", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    printed = done.stdout
    for name in ("cube-patient/interdomain/2", "niah-256/ccq-gla/2", "lm/coupled-euler/9"):
        assert re.search(rf"{re.escape(name)}\s+trains", printed), name
    assert printed.count("training time predicted on NVIDIA H200 from results/doctor/doctor.json") == 3
    for line in ("not a headline: IA beats S4D-only (to patience or 10,000 steps)",
                 "headline rows of interdomain (converged) carried: none",
                 "headline rows of ccq (converged) carried: none",
                 "HEADLINE: coupling lowers perplexity vs softmax"):
        assert line in printed, line
    assert re.search(r"^side by side on one NVIDIA H200 \(workers: interdomain 7, ccq 7, coupled-qk 2; 16 runs at "
                     r"once at most\), from start to end: ", printed, re.M)
    assert re.search(r"^deadline: \d+ s a call \(the prediction x 1.25, at most 480 s.*device calls needed: \d+",
                     printed, re.M)
    assert not list(tmp_path.glob("*/runs"))  # planned, nothing trained
    low, high = re.search(r"from start to end: (\d+) min .* to (\d+) min \(\d+ s\) with their steps one after another",
                          printed).groups()
    calls = re.search(r"device calls needed: (\d+ to \d+)", printed)[1]
    docs = " ".join((ROOT / "docs" / "gpus.md").read_text().split())
    assert (f"about {low} minutes with every run at its speed alone to about {high} with their steps one after "
            f"another, with 60 s of compile warm-up a run assumed, which is {calls} device calls") in docs
