"""Banded Ising inference on Triton kernels (`ops.ising_triton`, Boltzmann's backend=triton) against the torch
form, under Triton's interpreter in a process of its own (tests/triton_worker.py), and its configuration."""

import pytest
import torch

from attnlab.cli import main
from attnlab.errors import ConfigError
from attnlab.mixers import build_mixer
from attnlab.ops import ising_triton
from helpers import triton_worker_results

# the log-marginals and the gradients of fields and couplings against the fp64 torch form (bands 1 to 5, strong
# fields, absent spins); the mixer with backend=triton against backend=torch (stream, packed, prefill + decode)
TRITON_CHECKS = ["banded", "boltzmann_triton"]
BANDED = dict(d_model=16, n_heads=2, inference="banded", couplings="distance", band=3, window=6, mode="h+J")


@pytest.fixture(scope="module")
def worker_results():
    return triton_worker_results(TRITON_CHECKS)


@pytest.mark.parametrize("check", TRITON_CHECKS)
def test_triton_form_matches_torch_form(worker_results, check):
    error = worker_results[check]
    assert error is None, error


def test_triton_runs_banded_inference_only(capsys):
    assert main(["train", "demo", "model.mixer=boltzmann", "model.mixer_options.boltzmann.backend=triton"]) == 2
    assert capsys.readouterr().err == ("error: model.mixer_options.boltzmann: backend=triton runs banded inference, "
                                       "not inference=exact: use backend=torch or backend=auto\n")


def test_triton_without_a_gpu_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match=r"^backend=triton runs Triton kernels, which need a CUDA GPU, and this "
                                          r"machine has none; use backend=torch or backend=auto$"):
        build_mixer("boltzmann", backend="triton", **BANDED)


def test_triton_on_cpu_tensors_is_refused_before_any_kernel(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine, and the model on its CPU
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    mixer = build_mixer("boltzmann", backend="triton", **BANDED)
    with pytest.raises(ConfigError, match=r"this model runs on cpu; use backend=torch or backend=auto"):
        mixer(torch.randn(1, 8, 16))


@pytest.mark.parametrize("options, facts, backend", [
    ({}, {}, "triton"),  # banded inference with couplings on a GPU
    ({}, {"cuda": False}, "torch"),
    ({}, {"triton": None}, "torch"),
    ({"mode": "h-only"}, {}, "flex"),  # fields only: FlexAttention
    ({"inference": "mean-field"}, {}, "torch"),
])
def test_auto_takes_triton_for_banded_inference_on_a_gpu(options, facts, backend):
    machine = {"cuda": True, "hopper": True, "fla": "0.6.0", "triton": "3.6.0", "tilelang": False, **facts}
    assert build_mixer("boltzmann", **{**BANDED, **options}).route(torch.zeros(1), machine)[0] == backend
    assert ising_triton.available()  # the dev extras install Triton, so the checks above run the kernels
