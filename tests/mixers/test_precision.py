"""bf16 autocast, and parameters in bf16 or fp16: every mixer's output stays close to fp32 and its gradients
stay finite. The numerics policy keeps recurrent states, decay sums, covariance statistics and partition
functions in fp32, so the error is that of low-precision projections (a few parts in a thousand per product),
not of a low-precision recurrence."""

import copy

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


LOW_PRECISION = [torch.bfloat16, torch.float16]


def rounded_mixer_and_reference(name, options, dtype):
    """The mixer with its parameters in dtype, and an fp32 copy of those same rounded parameters: their
    difference is the mixer's arithmetic in dtype, not the rounding of its weights."""
    torch.manual_seed(0)
    mixer = build_mixer(name, d_model=32, n_heads=4, **options).to(dtype)
    return mixer, copy.deepcopy(mixer).float()


def relative_error(got, expected):
    return ((got.float() - expected).norm() / expected.norm()).item()


def low_precision_tolerance(dtype) -> float:
    """4 epsilons of the dtype (bf16: 3.1e-2, fp16: 3.9e-3) relative to the output's norm: what the few
    roundings of the activations to dtype cost (projections, scores, gates, the output projection, each
    eps / 2 at most); the mixer's states, decays, partition functions and complex SSM arithmetic run in
    fp32, and were they in dtype, they would add their rounding at every token on top."""
    return 4 * torch.finfo(dtype).eps


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize(("name", "options"), CASES, ids=CASE_IDS)
def test_low_precision_parameters_give_outputs_in_that_dtype_close_to_fp32(name, options, dtype):
    mixer, reference = rounded_mixer_and_reference(name, options, dtype)
    x = torch.randn(2, 8, 32, dtype=dtype, requires_grad=True)
    y, _ = mixer(x)
    expected, _ = reference(x.detach().float())
    assert y.dtype == dtype and torch.isfinite(y).all()
    error = relative_error(y, expected)
    assert error < low_precision_tolerance(dtype), f"relative error {error:.3g}"
    y.float().square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in mixer.parameters() if p.grad is not None)


@pytest.mark.parametrize(("name", "options"), CASES, ids=CASE_IDS)
@torch.no_grad()
def test_bf16_parameters_prefill_then_decode(name, options):
    mixer, reference = rounded_mixer_and_reference(name, options, torch.bfloat16)
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16)
    expected, _ = reference(x.float())
    y, state = mixer(x[:, :5])
    outputs = [y]
    for t in range(5, x.shape[1]):
        y, state = mixer(x[:, t : t + 1], state)
        outputs.append(y)
    decoded = torch.cat(outputs, dim=1)
    assert decoded.dtype == torch.bfloat16 and torch.isfinite(decoded).all()
    error = relative_error(decoded, expected)
    assert error < low_precision_tolerance(torch.bfloat16), f"relative error {error:.3g}"


def _linear_ops():
    from attnlab.ops.ccq import ccq_chunk
    from attnlab.ops.delta_rule import delta_rule_chunk
    from attnlab.ops.gla import gla_chunk
    from helpers import random_linear_inputs

    q, k, v, g, beta, h0 = (x.detach() for x in random_linear_inputs(T=40, K=16, V=8))
    _, _, _, g_head, _, _ = (x.detach() for x in random_linear_inputs(T=40, K=16, V=8, per_channel_decay=False))
    shared_mean = torch.nn.functional.normalize(k + 3.0, dim=-1)  # keys close together: Sigma q cancels heavily
    lam = torch.full(g_head.shape, 0.5, dtype=torch.float64)
    def ccq_correction(q, k, lam, log_decay=None):  # lambda Sigma q, the part CCQ adds
        return ccq_chunk(q, k, lam, log_decay=log_decay, chunk_size=16)[0] - q

    return {  # op: (function of the inputs, inputs)
        "gla": (lambda *x: gla_chunk(*x, initial_state=h0.to(x[0].dtype), chunk_size=16)[0], (q, k, v, g)),
        "gdn": (lambda *x: delta_rule_chunk(*x, initial_state=h0.to(x[0].dtype), chunk_size=16)[0],
                (q, k, v, g_head, beta)),
        "ccq": (ccq_correction, (q, shared_mean, lam)),
        "ccq-decay": (ccq_correction, (q, shared_mean, lam, g_head)),
    }


@pytest.mark.parametrize("op", ["gla", "gdn", "ccq", "ccq-decay"])
def test_linear_ops_keep_fp32_under_bf16_autocast(op):
    """States, decay sums and CCQ's statistics are not rounded to bf16 by autocast: on the same fp32 inputs
    the op's output under bf16 autocast is as close to fp64 as plain fp32 is (bf16 would give ~1e-2 and
    more). Keys that share a mean make CCQ's covariance cancel heavily, which costs ~1e-4 in fp32 already."""
    fn, inputs = _linear_ops()[op]
    expected = fn(*inputs)

    def error(got):
        return ((got.double() - expected).norm() / expected.norm()).item()

    fp32_error = error(fn(*(x.float() for x in inputs)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = fn(*(x.float() for x in inputs))
    assert got.dtype == torch.float32
    assert error(got) <= max(1e-5, 1.5 * fp32_error), f"relative error {error(got):.3g} (fp32 alone: {fp32_error:.3g})"
