"""`attnlab doctor` without a GPU: it says so, checks the mixers on the CPU against fp64, trains briefly
and writes doctor.json; a mixer that computes the wrong thing is reported as outside the limits."""

import json

import pytest
import torch

from attnlab import doctor
from attnlab.cli import main

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
    assert report["environment"]["cuda"] is False and "speed" not in report and "fla" not in report
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
])
def test_auto_takes_fla_where_its_kernels_train_correctly_and_says_why(facts, scalar_gates, uses_fla, why):
    from attnlab.ops.fla import auto_route

    taken, reason = auto_route(scalar_gates, **{**FACTS, **facts})
    assert taken is uses_fla and why in reason


def test_the_scalar_gated_mixers_ask_for_the_scalar_gated_route():
    from attnlab.mixers import build_mixer

    routes = [build_mixer(name, d_model=16, n_heads=2, **options).auto_backend(**FACTS)[0]
              for name, options in [("gla", {}), ("gdn", {}), ("ccq-gla", {}), ("ccq-gla", {"ccq_decay": True}),
                                    ("ccq-gdn", {}), ("linear", {})]]
    assert routes == ["fla", "torch", "fla", "torch", "torch", "fla"]


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
