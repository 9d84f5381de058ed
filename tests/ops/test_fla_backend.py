"""The fla backend (flash-linear-attention's Triton kernels) against our torch forms, and its config.

The comparisons run in tests/triton_worker.py, in a process of its own: Triton's interpreter, which runs the
kernels on a CPU, must be switched on (TRITON_INTERPRET=1) before triton and fla are imported, and must stay
off for the rest of the session. One worker run serves all the checks; each is reported as its own test.
"""

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.mixers import build_mixer
from attnlab.ops import fla as fla_ops
from attnlab.ops.gla import gla_chunk
from helpers import triton_worker_results

# fp32 outputs, final states and every gradient of gla, linear, the delta rule, CCQ (plain, decayed) and
# interdomain's query read; bf16 inputs; each mixer with backend=fla against backend=torch (prefill + decode
# too); packed rows through fla's cu_seqlens against each sequence alone; and the doctor's dry run
CHECKS = ["gla", "linear", "delta_rule", "ccq", "ccq_decay", "interdomain", "bf16", "mixers", "packed",
          "doctor_dry_run"]


@pytest.fixture(scope="module")
def worker_results():
    return triton_worker_results(CHECKS)


@pytest.mark.parametrize("check", CHECKS)
def test_fla_form_matches_torch_form(worker_results, check):
    error = worker_results[check]
    assert error is None, error


def test_unknown_backend_is_a_one_line_error():
    with pytest.raises(ConfigError) as error:
        build_mixer("gla", backend="cuda")
    message = str(error.value)
    assert "backend='cuda'" in message and "torch, fla, auto" in message and "\n" not in message


def test_fla_backend_without_fla_names_the_fix(monkeypatch):
    monkeypatch.setattr(fla_ops, "available", lambda: False)
    with pytest.raises(ConfigError, match=r"backend=fla .*pip install 'attnlab\[fla\]'") as error:
        build_mixer("gdn", backend="fla")
    assert "\n" not in str(error.value)


def test_auto_backend_runs_torch_off_cuda_with_the_same_parameters():
    torch_mixer = build_mixer("ccq-gdn", d_model=32, n_heads=2, backend="torch")
    auto_mixer = build_mixer("ccq-gdn", d_model=32, n_heads=2, backend="auto")
    assert auto_mixer.chunk_form(gla_chunk, fla_ops.gla_fla, torch.zeros(1)) is gla_chunk
    shapes = {name: p.shape for name, p in torch_mixer.state_dict().items()}
    assert {name: p.shape for name, p in auto_mixer.state_dict().items()} == shapes


def test_auto_backend_on_cuda_keeps_torch_where_fla_cannot_train_scalar_gates(monkeypatch, caplog):
    """On a GPU (an object that says it is on CUDA stands in for one; the machine's facts are set) auto takes
    fla, except for scalar-gated kernels where fla refuses their backward (Hopper with Triton 3.4.0 to 3.7.0
    and no TileLang), and says once which route it took."""
    from types import SimpleNamespace

    on_cuda = SimpleNamespace(is_cuda=True)
    mixer = build_mixer("gdn", d_model=32, n_heads=2, backend="auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *device: (9, 0))
    for triton, works in (("3.7.1", True), ("3.6.0", False)):
        monkeypatch.setattr(fla_ops, "installed", lambda triton=triton: {"fla": "0.6.0", "triton": triton,
                                                                         "tilelang": False})
        fla_ops.route.cache_clear()
        caplog.clear()
        assert mixer.chunk_form(gla_chunk, fla_ops.gla_fla, on_cuda) is fla_ops.gla_fla
        chosen = mixer.chunk_form(gla_chunk, fla_ops.delta_rule_fla, on_cuda, scalar_gates=True)
        mixer.chunk_form(gla_chunk, fla_ops.delta_rule_fla, on_cuda, scalar_gates=True)
        assert chosen is (fla_ops.delta_rule_fla if works else gla_chunk)
        notes = [r.getMessage() for r in caplog.records if "backend=auto" in r.getMessage()]
        assert len(notes) == 2 and ("the torch forms" in notes[1]) is not works  # once per kind of kernel
    fla_ops.route.cache_clear()
