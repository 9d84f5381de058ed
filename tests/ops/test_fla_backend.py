"""The fla backend (flash-linear-attention's Triton kernels) against our torch forms, and its config.

The comparisons run in tests/triton_worker.py, in a process of its own: Triton's interpreter, which runs the
kernels on a CPU, must be switched on (TRITON_INTERPRET=1) before triton and fla are imported, and must stay
off for the rest of the session. One worker run serves all the checks; each is reported as its own test.
"""

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.mixers import backends, build_mixer
from attnlab.ops import fla as fla_ops
from helpers import triton_worker_results

# fp32 outputs, final states and every gradient of gla, linear, the delta rule, CCQ (plain, decayed) and
# interdomain's query read; bf16 inputs; each mixer with backend=fla against backend=torch (prefill + decode
# too); packed rows through fla's cu_seqlens against each sequence alone; a sequence split across two gloo ranks
# (context parallelism) against one process; and the doctor's dry run
TRITON_CHECKS = ["gla", "linear", "delta_rule", "ccq", "ccq_decay", "interdomain", "bf16", "mixers", "packed",
          "context_parallel", "doctor_dry_run"]


@pytest.fixture(scope="module")
def worker_results():
    return triton_worker_results(TRITON_CHECKS)


@pytest.mark.parametrize("check", TRITON_CHECKS)
def test_fla_form_matches_torch_form(worker_results, check):
    error = worker_results[check]
    assert error is None, error


def test_unknown_backend_is_a_one_line_error():
    with pytest.raises(ConfigError) as error:
        build_mixer("gla", backend="cuda")
    message = str(error.value)
    assert "gla.backend 'cuda'" in message and "auto, fla, torch" in message and "\n" not in message


def test_fla_backend_without_fla_names_the_fix(monkeypatch):
    monkeypatch.setattr(fla_ops, "available", lambda: False)
    with pytest.raises(ConfigError, match=r"backend=fla .*pip install 'attnlab\[fla\]'") as error:
        build_mixer("gdn", backend="fla")
    assert "\n" not in str(error.value)


def test_auto_backend_runs_torch_off_cuda_with_the_same_parameters():
    torch_mixer = build_mixer("ccq-gdn", d_model=32, n_heads=2, backend="torch")
    auto_mixer = build_mixer("ccq-gdn", d_model=32, n_heads=2, backend="auto")
    assert auto_mixer.form(torch.zeros(1, 8, 32)) == "torch"
    shapes = {name: p.shape for name, p in torch_mixer.state_dict().items()}
    assert {name: p.shape for name, p in auto_mixer.state_dict().items()} == shapes


def on_a_hopper_gpu(monkeypatch, triton: str) -> None:
    """The machine facts the routing reads set to a Hopper GPU (compute capability 9.0) with fla 0.6.0, this
    Triton and no TileLang, and every tensor taken for one on that GPU; the route said afresh."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *device: (9, 0))
    monkeypatch.setattr(fla_ops, "installed", lambda: {"fla": "0.6.0", "triton": triton, "tilelang": False})
    monkeypatch.setattr(backends, "on_gpu", lambda x: True)
    backends.route.cache_clear()


def test_auto_backend_on_cuda_keeps_torch_where_fla_cannot_train_scalar_gates(monkeypatch, caplog):
    """On a GPU auto takes fla, except for scalar-gated kernels where fla refuses their backward (Hopper with
    Triton 3.4.0 to 3.7.0 and no TileLang), and says once which route it took."""
    gla, gdn = (build_mixer(name, d_model=32, n_heads=2, backend="auto") for name in ("gla", "gdn"))
    x = torch.zeros(1, 8, 32)
    for triton, works in (("3.7.1", True), ("3.6.0", False)):
        on_a_hopper_gpu(monkeypatch, triton)
        caplog.clear()
        assert gla.form(x) == "fla"
        chosen = gdn.form(x)
        gdn.form(x)
        assert chosen == ("fla" if works else "torch")
        notes = [r.getMessage() for r in caplog.records if "backend=auto" in r.getMessage()]
        assert len(notes) == 2 and ("the torch forms" in notes[1]) is not works  # once per kind of kernel
    backends.route.cache_clear()


@pytest.mark.parametrize("name", ["ccq-gla", "ccq-gdn"])
def test_a_packed_decayed_ccq_layer_runs_every_op_where_its_route_goes(name, monkeypatch):
    """data.pack on a Hopper GPU with Triton 3.5 and no TileLang: decayed CCQ statistics are scalar-gated, which
    fla's kernels cannot train there, so the layer's one route is torch, for the read and for the backbone's
    recurrence alike (GLA's own gates alone would take fla, whose kernel has no `starts` for our packed layout).
    Packed, with states and without, each sequence gets what it gets alone."""
    on_a_hopper_gpu(monkeypatch, "3.5.0")
    torch.manual_seed(0)
    mixer = build_mixer(name, d_model=32, n_heads=2, ccq_decay=True, chunk_size=4).double()
    x = torch.randn(1, 12, 32, dtype=torch.float64)
    cu_seqlens = torch.tensor([0, 5, 12])
    assert mixer.form(x, cu_seqlens) == "torch" and mixer.packs == "outputs"
    alone = torch.cat([mixer(x[:, 0:5])[0], mixer(x[:, 5:12])[0]], dim=1)
    for keep_state in (True, False):
        y, _ = mixer(x, cu_seqlens=cu_seqlens, keep_state=keep_state)
        torch.testing.assert_close(y, alone, rtol=0, atol=1e-10)
    backends.route.cache_clear()
