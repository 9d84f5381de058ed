"""`attnlab doctor` without a GPU: it says so, checks the mixers on the CPU against fp64, trains briefly
and writes doctor.json; a mixer that computes the wrong thing is reported as outside the limits."""

import json

import pytest
import torch

import attnlab.papers  # noqa: F401  (the papers: their variants and speed goals)
from attnlab.cli import main
from attnlab.lab import doctor, doctor_readme

SOME = [("softmax", "softmax", {}), ("gla", "gla", {})]


@pytest.fixture
def two_mixers(monkeypatch):
    monkeypatch.setattr(doctor, "contenders", lambda: SOME)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_without_a_gpu_it_says_so_and_checks_on_the_cpu(two_mixers, tmp_path, capsys):
    assert main(["doctor", "--out", str(tmp_path), "--train-steps", "2"]) == 0
    printed = capsys.readouterr().out
    assert "no CUDA GPU found" in printed
    report = json.loads((tmp_path / "doctor.json").read_text())
    assert report["environment"]["cuda"] is False and "speed" not in report and "fused" not in report
    assert set(report["mixers"]) == {"softmax", "gla"} and report["failed"] == []
    for row in report["mixers"].values():
        assert row["fp32"]["forward"] < 1e-5 and row["bf16"]["ok"]
    assert report["train"]["steps"] == 2 and report["train"]["val_loss"] > 0
    assert "backend=auto takes on a Hopper GPU (H100/H200)" in printed
    assert report["backends"]["softmax"] == {"backends": ["torch"], "auto": "torch", "why": "its only form"}
    assert report["backends"]["gla"]["backends"] == ["torch", "fla"]  # every registered mixer is listed
    assert set(report["backends"]) >= {"gdn", "ccq-gdn", "interdomain", "boltzmann"}
    assert report["goals"] and {goal["verdict"] for goal in report["goals"]} == {"not measured"}  # no GPU timings


FACTS = {"cuda": True, "hopper": True, "fla": "0.6.0", "triton": "3.6.0", "tilelang": False}


@pytest.mark.parametrize("facts, scalar_gates, uses_fla, why", [
    ({"cuda": False}, False, False, "no CUDA GPU"),
    ({"fla": None}, False, False, "flash-linear-attention is not installed (pip install 'attnlab[fla]')"),
    ({}, False, True, "fla 0.6.0's Triton kernels (Triton 3.6.0)"),  # gla's kernels have no such bug
    ({}, True, False, "Triton 3.6.0 miscompiles fla's scalar-gated backward on Hopper GPUs"),
    ({"tilelang": True}, True, True, "the scalar-gated backward on fla's TileLang backend"),
    ({"triton": "3.7.1"}, True, True, "Triton >= 3.7.1 compiles their scalar-gated backward correctly"),
    ({"triton": "3.8.0+git1234"}, True, True, "Triton >= 3.7.1"),
    ({"triton": "3.3.1"}, True, True, "fla 0.6.0's Triton kernels (Triton 3.3.1)"),  # before the regression
    ({"hopper": False}, True, True, "fla 0.6.0's Triton kernels (Triton 3.6.0)"),  # an A100: no such bug
    ({"fla": "0.5.1", "triton": "3.8.0"}, False, False, "removed the block pointers fla 0.5.1's kernels use"),
    ({"fla": "0.5.2", "triton": "3.8.0"}, False, True, "fla 0.5.2's Triton kernels (Triton 3.8.0)"),
    ({"fla": "0.5.1", "triton": "3.7.1"}, False, True, "fla 0.5.1's Triton kernels"),  # block pointers still there
])
def test_auto_takes_fla_where_its_kernels_train_correctly_and_says_why(facts, scalar_gates, uses_fla, why):
    from attnlab.mixers.backends import auto_route

    taken, reason = auto_route(scalar_gates, **{**FACTS, **facts})
    assert taken is uses_fla and why in reason


def test_tilelang_is_no_route_without_nvcc(monkeypatch, tmp_path):
    from attnlab.ops import fla

    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert fla.nvcc() is None
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert fla.nvcc() == str(tmp_path / "bin" / "nvcc")
    monkeypatch.setattr(fla, "nvcc", lambda: None)
    monkeypatch.setattr(fla.importlib.util, "find_spec", lambda name: object())  # as if tilelang were installed
    assert fla.installed()["tilelang"] is False


@pytest.mark.parametrize("wanted, found, says", [
    ("3.6.0", "3.6.0", "(the one this torch was built for)"),
    ("3.6.0", "3.7.1", "NOT the Triton 3.6.0 this torch was built for (pip install triton==3.6.0)"),
    ("3.6.0", None, "-> Triton not installed: NOT the Triton 3.6.0"),
    (None, "3.9.0", "(this torch pins no Triton)"),
])
def test_the_doctor_prints_which_triton_torch_was_built_for(wanted, found, says):
    line = doctor.pairing({"torch": "2.11.0+cu130", "triton": found, "triton_for_torch": wanted})
    assert line.startswith("torch 2.11.0+cu130 -> Triton") and says in line


def test_the_triton_torch_pins_is_read_from_its_requirements(monkeypatch):
    from importlib import metadata

    monkeypatch.setattr(metadata, "requires", lambda name: ['numpy; extra == "x"',
                                                            'triton==3.6.0; platform_system == "Linux"'])
    assert doctor.triton_for_torch() == "3.6.0"
    monkeypatch.setattr(metadata, "requires", lambda name: ["filelock", "sympy>=1.13.3"])
    assert doctor.triton_for_torch() is None


def test_the_scalar_gated_mixers_ask_for_the_scalar_gated_route():
    from attnlab.mixers import build_mixer

    routes = [build_mixer(name, d_model=16, n_heads=2, **options).route(torch.zeros(1), FACTS)[0]
              for name, options in [("gla", {}), ("gdn", {}), ("ccq-gla", {}), ("ccq-gla", {"ccq_decay": True}),
                                    ("ccq-gdn", {}), ("linear", {}), ("interdomain", {}),
                                    ("interdomain", {"form": "fft"}), ("s4d", {})]]
    assert routes == ["fla", "torch", "fla", "torch", "torch", "fla", "fla", "torch", "torch"]


def test_the_routing_table_is_what_each_mixers_route_says(monkeypatch):
    """The doctor's table holds each built mixer's own route on the facts it states (without a GPU, a Hopper one with
    what is installed here), and nothing else: a route said otherwise is the table's."""
    from attnlab.mixers import build_mixer, list_mixers, mixer_class
    from attnlab.ops import fla

    hopper = {**fla.machine(), "cuda": True, "hopper": True}
    table = doctor.backend_routes(torch.device("cpu"), log=lambda *a: None)
    assert set(table) == set(list_mixers())
    for name in list_mixers():
        mixer = build_mixer(name, d_model=64, n_heads=4)
        form, why = mixer.route(torch.zeros(1, 2, 64), hopper)
        assert table[name] == {"backends": list(mixer.backends), "auto": form, "why": why}
    for name in list_mixers():
        monkeypatch.setattr(mixer_class(name), "route", lambda self, x, machine=None: (f"{self.name}'s", "asked"))
    table = doctor.backend_routes(torch.device("cpu"), log=lambda *a: None)
    assert {name: row["auto"] for name, row in table.items()} == {name: f"{name}'s" for name in list_mixers()}


def test_a_wrong_mixer_is_outside_the_limits(two_mixers, tmp_path, monkeypatch):
    from attnlab.mixers.softmax import SoftmaxAttention

    forward = SoftmaxAttention.forward

    def off_on_fp32(self, x, state=None):  # right in fp64 (the reference), off by 1% in fp32
        y, state = forward(self, x, state)
        return (y * 1.01 if x.dtype == torch.float32 else y), state

    monkeypatch.setattr(SoftmaxAttention, "forward", off_on_fp32)
    report = doctor.run_doctor(tmp_path, train_steps=0, log=lambda *a: None)
    assert report["failed"] == ["softmax"] and report["mixers"]["softmax"]["fp32"]["forward"] > 5e-3


def test_train_steps_must_not_be_negative(capsys):
    assert main(["doctor", "--train-steps", "-1"]) == 2
    assert "--train-steps" in capsys.readouterr().err


def test_the_readme_section_is_generated_from_a_doctor_run(tmp_path):
    from pathlib import Path

    committed = json.loads((Path(__file__).parents[1] / "results" / "doctor" / "doctor.json").read_text())
    text = doctor_readme.readme_section(committed)
    within = len(committed["mixers"]) - len(committed["failed"])
    assert f"{within} of {len(committed['mixers'])} mixers within the limits" in text
    assert all(f"| {label} | {row['ms']:.2f} |" in text for label, row in committed["speed"]["2048"].items())
    legacy = {key: value for key, value in committed.items() if key not in ("fused", "goals")}
    legacy["speed"] = {"softmax": {"ms": 3.64, "x_softmax": 1.0}}  # written before timings were kept per length
    old = doctor_readme.readme_section(legacy)
    assert "| T 2048 ms |" in old and "| softmax | 3.64 | 1.00 |" in old
    assert "no timings of them" in old and "none judged" in old  # a run whose fla section did not finish
    row = {"fp32": {"forward": 1e-7, "gradient": 2e-7, "decode": 3e-7}, "bf16": {"forward": 4e-3, "gradient": 5e-3,
                                                                                 "decode": 6e-3}}
    report = {"environment": {"device": "cuda", "gpu": "NVIDIA H100", "torch": "2.11.0+cu130", "cuda_version": "13.0",
                              "triton": "3.7.1", "fla": "0.6.0"},
              "mixers": {"softmax": row, "gla": row}, "failed": [],
              "speed": {"2048": {"softmax": {"ms": 2.0, "x_softmax": 1.0}, "gla": {"ms": 3.0, "x_softmax": 1.5}},
                        "8192": {"softmax": {"ms": 20.0, "x_softmax": 1.0}}},
              "fused": {"2048": {"gla, fla": {"difference": 1e-3, "torch_ms": 9.0, "fused_ms": 3.0, "speedup": 3.0}}}}
    report["goals"] = doctor.doctor_goals(report)
    new = doctor_readme.readme_section(report)
    assert "| mixer (fwd+bwd, bf16, batch 8, d_model 512) | T 2048 ms | × softmax | T 8192 ms | × softmax |" in new
    assert "| gla | 3.00 | 1.50 | – | – |" in new and "| gla, fla | 2048 | 0.001 | 9.00 | 3.00 |" in new
    assert "Goals: 2 met, 9 not measured." in new  # gla at T 2048 (1.5x) and fla's agreement
    del report["fused"]
    assert "The fused backends' section did not finish in this run" in doctor_readme.readme_section(report)
    assert "- gla / softmax fwd+bwd at T=8192 (x): - (< 1), not measured" in new
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- doctor: start -->\nold\n<!-- doctor: end -->\nb\n")
    from attnlab.lab.report import update_readme

    update_readme(readme, new, section="doctor")
    assert readme.read_text() == f"a\n<!-- doctor: start -->\n{new}\n<!-- doctor: end -->\nb\n"


def test_a_run_cut_short_keeps_every_mixer_it_checked(two_mixers, tmp_path, monkeypatch):
    check = doctor.check_mixer

    def interrupted_at_gla(name, options, device):
        if name == "gla":  # as a kernel that compiles for minutes and is stopped
            raise KeyboardInterrupt
        return check(name, options, device)

    monkeypatch.setattr(doctor, "check_mixer", interrupted_at_gla)
    with pytest.raises(KeyboardInterrupt):
        doctor.run_doctor(tmp_path, train_steps=0, log=lambda *a: None)
    saved = json.loads((tmp_path / "doctor.json").read_text())
    assert list(saved["mixers"]) == ["softmax"] and saved["mixers"]["softmax"]["fp32"]["ok"]


def test_the_readme_says_when_fla_was_not_there_to_measure():
    row = {p: {"forward": 1e-7, "gradient": 1e-7, "decode": 1e-7, "ok": True} for p in ("fp32", "bf16")}
    report = {"environment": {"device": "cuda", "gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda_version": "13.0",
                              "triton": "3.6.0", "fla": None}, "mixers": {"softmax": row}, "failed": []}
    assert "fla was not installed in this run" in doctor_readme.readme_section(report)
    report["environment"]["fla"] = "0.6.0"
    assert "fla was not installed" not in doctor_readme.readme_section(report)


def test_packing_trains_the_demo_model_in_several_processes_at_once_and_sums_their_throughput(two_mixers):
    packed = doctor.pack_demo(torch.device("cpu"), (1, 2), steps=6, log=lambda *a: None)
    assert set(packed) == {"1", "2"} and packed["1"]["x_one"] == 1.0
    assert all(row["tokens_per_s"] > 0 for row in packed.values())
    assert packed["2"]["x_one"] == pytest.approx(packed["2"]["tokens_per_s"] / packed["1"]["tokens_per_s"])
    report = {"environment": {"device": "cuda", "gpu": "NVIDIA H200", "torch": "2.11.0", "cuda_version": "13.0",
                              "triton": "3.6.0", "fla": "0.6.0"}, "failed": [], "packing": packed,
              "mixers": {"softmax": {p: {"forward": 1e-7, "gradient": 1e-7, "decode": 1e-7} for p in ("fp32", "bf16")}}}
    assert f"2 at once {packed['2']['tokens_per_s'] / 1e3:.0f}K tokens/s in all" in doctor_readme.readme_section(report)


def test_a_copy_that_fails_ends_the_packing_section_at_once_with_its_error(two_mixers):
    with pytest.raises(RuntimeError, match="train.device=meta is not one of"):
        doctor.pack_demo(torch.device("meta"), (2,), steps=4, log=lambda *a: None)


def test_compile_warm_up_is_the_compiled_runs_time_besides_its_steps_beyond_the_eager_runs():
    step_tokens = 16 * 128  # the demo's batch of 16 x 128 characters
    eager = {"steps": 200, "seconds": 2.5, "tokens_per_s": step_tokens / 0.01}  # 2 s of steps, 0.5 s besides
    compiled = {"steps": 200, "seconds": 40.0, "tokens_per_s": step_tokens / 0.005}  # 1 s of steps, 39 s besides
    assert doctor.warmup_seconds(eager, compiled) == pytest.approx(38.5)
    assert doctor.warmup_seconds(eager, {**compiled, "seconds": 1.2}) == 0  # compiling cost nothing to see


def test_on_a_gpu_the_doctor_compiles_the_demo_and_packs_it_and_a_failure_is_the_finding(monkeypatch, tmp_path):
    """The GPU's training sections on the CPU, their training replaced: the compile section's record and warm-up,
    then packing; a compile that fails is written as its error, and packing still runs."""
    def fake_train(device, steps, log=print, compile=False):
        return {"steps": steps, "seconds": 30.0 if compile else 2.0, "tokens_per_s": 16 * 128 / 0.005, "val_loss": 2.0}

    monkeypatch.setattr(doctor, "train_demo", fake_train)
    monkeypatch.setattr(doctor, "pack_demo", lambda device, copies, steps, log: {"1": {"tokens_per_s": 1.0,
                                                                                      "x_one": 1.0}})
    report, saved = {}, []
    doctor._train_sections(report, torch.device("cpu"), 200, (1, 4, 16), lambda *a: None, lambda: saved.append(1))
    assert report["compile"]["warmup_s"] == pytest.approx(28.0) and report["packing"]["1"]["x_one"] == 1.0
    assert len(saved) == 3  # after each section

    def no_compiler(device, steps, log=print, compile=False):
        if compile:
            raise RuntimeError("InductorError: no C++ compiler")
        return fake_train(device, steps)

    monkeypatch.setattr(doctor, "train_demo", no_compiler)
    doctor._train_sections(report, torch.device("cpu"), 200, (1, 4, 16), lambda *a: None, lambda: None)
    assert report["compile"] == {"error": "RuntimeError: InductorError: no C++ compiler"} and "packing" in report
    report.pop("compile")
    doctor._train_sections(report, torch.device("cpu"), 200, (), lambda *a: None, lambda: None)
    assert "compile" not in report  # without a GPU (nor a dry run): the demo model alone


def test_the_readme_says_what_compiling_the_demo_cost():
    row = {p: {"forward": 1e-7, "gradient": 1e-7, "decode": 1e-7} for p in ("fp32", "bf16")}
    report = {"environment": {"device": "cuda", "gpu": "NVIDIA H200", "torch": "2.11.0", "cuda_version": "13.0",
                              "triton": "3.6.0", "fla": "0.6.0"}, "failed": [], "mixers": {"softmax": row},
              "train": {"steps": 200, "seconds": 2.5, "tokens_per_s": 2e5, "val_loss": 2.1},
              "compile": {"steps": 200, "seconds": 40.0, "tokens_per_s": 4e5, "val_loss": 2.1, "warmup_s": 38.5}}
    assert "compiled (train.compile) at 400K tokens/s after 38 s of compile warm-up" in \
        doctor_readme.readme_section(report)
