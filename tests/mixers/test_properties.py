"""Property-based tests over every registered mixer (the registry is enumerated, so a new mixer is
covered without an edit): for random batch sizes, lengths (1 and non-multiples of the chunk size
included), chunk sizes, split points and seeds, outputs and gradients are finite, no output depends on a
later token, and a prefill followed by token-by-token decoding equals the full forward pass."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.mixers import build_mixer, list_mixers
from attnlab.mixers.registry import mixer_fields

D_MODEL, N_HEADS = 16, 2


@st.composite
def cases(draw, name):
    length = draw(st.integers(1, 12))
    options = {"chunk_size": draw(st.integers(1, 7))} if "chunk_size" in mixer_fields(name) else {}
    if "modes" in mixer_fields(name):
        options["modes"] = 4
    return {"batch": draw(st.integers(1, 3)), "length": length, "split": draw(st.integers(0, length - 1)),
            "seed": draw(st.integers(0, 2**16)), "options": options}


@pytest.mark.parametrize("name", list_mixers())
def test_mixer_properties(name):
    @settings(max_examples=8, deadline=None, derandomize=True)
    @given(case=cases(name))
    def check(case):
        torch.manual_seed(case["seed"])
        mixer = build_mixer(name, d_model=D_MODEL, n_heads=N_HEADS, **case["options"]).double()
        x = torch.randn(case["batch"], case["length"], D_MODEL, dtype=torch.float64, requires_grad=True)
        full, _ = mixer(x)
        full.square().sum().backward()
        assert torch.isfinite(full).all() and torch.isfinite(x.grad).all()
        assert all(torch.isfinite(p.grad).all() for p in mixer.parameters() if p.grad is not None)

        with torch.no_grad():
            split = case["split"]
            changed = x.detach().clone()
            changed[:, split + 1 :] = torch.randn_like(changed[:, split + 1 :])
            torch.testing.assert_close(mixer(changed)[0][:, : split + 1], full[:, : split + 1], rtol=0, atol=1e-10)

            y, state = mixer(x[:, : split + 1]) if split + 1 < x.shape[1] else (full, None)
            outputs = [y]
            for t in range(split + 1, x.shape[1]):
                y, state = mixer(x[:, t : t + 1], state)
                outputs.append(y)
            torch.testing.assert_close(torch.cat(outputs, 1), full, rtol=0, atol=1e-9)

    check()
