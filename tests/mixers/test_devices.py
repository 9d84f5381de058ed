"""Every mixer runs on a device other than the CPU, without a GPU.

Tensors on the `meta` device carry shapes and dtypes but no data, and any operation that mixes them with
a CPU tensor fails. A mixer that builds an index or a mask on the CPU, or reads a value back to the host
(`.item()`, `if tensor:`), fails here exactly as it would on a GPU (where the second is a sync per call).
"""

import pytest
import torch

from attnlab.mixers import build_mixer
from helpers import CASE_IDS, CASES

META = torch.device("meta")


@pytest.mark.parametrize(("name", "options"), CASES, ids=CASE_IDS)
def test_forward_backward_and_decode_on_another_device(name, options):
    mixer = build_mixer(name, d_model=32, n_heads=4, **options).to(META)
    x = torch.randn(2, 10, 32, device=META, requires_grad=True)
    y, state = mixer(x)
    assert y.shape == x.shape and y.device == META
    y.sum().backward()
    assert x.grad is not None and x.grad.device == META
    step, _ = mixer(torch.randn(2, 1, 32, device=META), state)
    assert step.shape == (2, 1, 32) and step.device == META
    fresh, _ = mixer(torch.randn(2, 1, 32, device=META), mixer.init_state(2, META))
    assert fresh.device == META
