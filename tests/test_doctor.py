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
