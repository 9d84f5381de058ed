"""Boltzmann attention with fields only on FlexAttention against the torch forms: outputs, KV-cache decoding
and gradients, in fp64 on the CPU (FlexAttention's eager reference; torch refuses its backward on a CPU, so
the gradient test lifts that guard to reach the same reference's backward)."""

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.mixers import build_mixer

D_MODEL, N_HEADS, T = 32, 4, 11
CASES = {"exact, whole window": {"window": 16},
         "sliding window of 4": {"inference": "banded", "couplings": "distance", "band": 2, "window": 4},
         "mean-field, sliding window of 5": {"inference": "mean-field", "couplings": "distance", "window": 5}}


def pair(**options):
    torch.manual_seed(0)
    forms = {b: build_mixer("boltzmann", d_model=D_MODEL, n_heads=N_HEADS, mode="h-only", backend=b,
                            **options).double() for b in ("torch", "flex")}
    forms["flex"].load_state_dict(forms["torch"].state_dict())
    return forms["torch"], forms["flex"]


@pytest.mark.parametrize("options", CASES.values(), ids=CASES)
def test_flex_gives_the_torch_forms_outputs_and_decodes_alike(options):
    reference, flex = pair(**options)
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(flex(x)[0], reference(x)[0], rtol=0, atol=1e-12)
        _, state = flex(x[:, :6])  # prefill, then one token at a time against the cache
        for t in range(6, T):
            y, state = flex(x[:, t : t + 1], state)
            torch.testing.assert_close(y, reference(x)[0][:, t : t + 1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("options", CASES.values(), ids=CASES)
def test_flex_gives_the_torch_forms_gradients(options, monkeypatch):
    import torch.nn.attention.flex_attention as flex_attention

    monkeypatch.setattr(flex_attention, "_validate_device", lambda *tensors: None)
    reference, flex = pair(**options)
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    for got, want in zip(torch.autograd.grad((flex(x)[0] * weights).sum(), [x, *flex.parameters()]),
                         torch.autograd.grad((reference(x)[0] * weights).sum(), [x, *reference.parameters()]),
                         strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_training_on_flex_without_a_gpu_is_one_line():
    from attnlab.errors import UserError

    _, flex = pair()
    cannot = r"^backend=flex cannot train on cpu \(FlexAttention does not support backward on CPU.*backend=torch"
    with pytest.raises(UserError, match=cannot):
        flex(torch.randn(1, 4, D_MODEL, dtype=torch.float64, requires_grad=True))


def test_flex_takes_fields_only_and_auto_takes_it_on_a_gpu():
    with pytest.raises(ConfigError, match=r"^backend=flex runs fields only .* mode=h\+J needs Ising inference"):
        build_mixer("boltzmann", d_model=D_MODEL, n_heads=N_HEADS, backend="flex")
    fields = build_mixer("boltzmann", d_model=D_MODEL, n_heads=N_HEADS, mode="h-only")
    coupled = build_mixer("boltzmann", d_model=D_MODEL, n_heads=N_HEADS)
    x = torch.zeros(1)
    assert fields.route(x)[0] != "flex"  # auto on a CPU: the torch form
    assert fields.route(x, {"cuda": True})[0] == "flex" and fields.route(x, {"cuda": False})[0] == "torch"
    assert coupled.route(x, {"cuda": True})[0] == "torch"
