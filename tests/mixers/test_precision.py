"""bf16 autocast: every mixer's output stays close to fp32 and its gradients stay finite. The numerics
policy keeps recurrent states, decay sums, covariance statistics and partition functions in fp32, so
the error is that of bf16 projections (a few parts in a thousand per product), not of a bf16 recurrence."""

import pytest
import torch

from attnlab.mixers import build_mixer
from helpers import CASE_IDS, CASES

RELATIVE_ERROR = 3e-2  # ||bf16 - fp32|| / ||fp32|| over the whole output


@pytest.mark.parametrize(("name", "options"), CASES, ids=CASE_IDS)
def test_bf16_autocast_stays_close_to_fp32_with_finite_gradients(name, options):
    torch.manual_seed(0)
    mixer = build_mixer(name, d_model=64, n_heads=4, **{"dqa_shots": 0, **options} if name == "boltzmann" else options)
    x = torch.randn(2, 12, 64, requires_grad=True)
    reference, _ = mixer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = mixer(x)
    error = (y.float() - reference).norm() / reference.norm()
    assert error < RELATIVE_ERROR, f"relative error {error:.3g}"
    y.float().square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in mixer.parameters() if p.grad is not None)
