"""The S4D core: discretisation, kernel, convolution and recurrence."""

import math

import pytest
import torch

from attnlab.ops import s4d

f64 = torch.float64


def ssm(H=3, M=5, method="zoh", seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.complex(-0.5 * torch.ones(H, M, dtype=f64), s4d.s4d_inv_imag(M).expand(H, M))
    log_dt = torch.empty(H, dtype=f64).uniform_(math.log(1e-3), math.log(1e-1), generator=g)
    lam, B_bar = s4d.discretize(log_dt, A, method)
    c = torch.complex(torch.randn(H, M, generator=g, dtype=f64), torch.randn(H, M, generator=g, dtype=f64))
    return c, lam, B_bar


@pytest.mark.parametrize("method", ["zoh", "bilinear"])
def test_kernel_is_the_impulse_response_of_the_recurrence(method):
    c, lam, B_bar = ssm(method=method)
    impulse = torch.zeros(1, 3, 20, 1, dtype=f64)
    impulse[:, :, 0] = 1
    y, _ = s4d.s4d_reference(impulse, c, lam, B_bar)
    torch.testing.assert_close(y[0, :, :, 0], s4d.s4d_kernel(c, lam, B_bar, 20), rtol=0, atol=1e-12)


def test_zoh_and_bilinear_agree_for_small_steps():
    A = torch.complex(torch.tensor([[-0.5, -1.0]], dtype=f64), torch.tensor([[3.0, 0.0]], dtype=f64))
    log_dt = torch.tensor([math.log(1e-4)], dtype=f64)
    lam_z, B_z = s4d.discretize(log_dt, A, "zoh")
    lam_b, B_b = s4d.discretize(log_dt, A, "bilinear")
    torch.testing.assert_close(lam_z, lam_b, rtol=0, atol=1e-10)  # they differ at O((dt A)^3)
    torch.testing.assert_close(B_z, B_b, rtol=1e-7, atol=0)


def test_fft_convolution_equals_direct_convolution():
    u, kernel = torch.randn(2, 3, 17, 4), torch.randn(3, 17)
    direct = torch.stack([sum(kernel[:, t - s, None] * u[:, :, s] for s in range(t + 1)) for t in range(17)], dim=2)
    torch.testing.assert_close(s4d.causal_conv(u, kernel), direct, rtol=0, atol=1e-5)


def test_fft_form_and_step_match_the_loop_with_a_carried_state():
    c, lam, B_bar = ssm()
    g = torch.Generator().manual_seed(1)
    u = torch.randn(2, 3, 23, 4, generator=g, dtype=f64, requires_grad=True)
    x0 = torch.complex(torch.randn(2, 3, 5, 4, generator=g, dtype=f64), torch.randn(2, 3, 5, 4, generator=g, dtype=f64))
    y_ref, x_ref = s4d.s4d_reference(u, c, lam, B_bar, x0)
    y_fft, x_fft = s4d.s4d_fft(u, c, lam, B_bar, x0)
    torch.testing.assert_close(y_fft, y_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(x_fft, x_ref, rtol=0, atol=1e-10)
    g_ref, = torch.autograd.grad(y_ref.sum(), u)
    g_fft, = torch.autograd.grad(y_fft.sum(), u)
    torch.testing.assert_close(g_fft, g_ref, rtol=0, atol=1e-10)
    y, x = s4d.s4d_step(u[:, :, 0], c, lam, B_bar, x0)
    torch.testing.assert_close(y, y_ref[:, :, 0])


def test_a_contraction_of_one_token_runs_from_a_state_or_from_none():
    """The step continues a state; one token from none (a rank's last document, one token long) is the loop's."""
    c, lam, B_bar = ssm()
    w, C = torch.randn(3, 5, dtype=f64), torch.diag_embed(torch.ones(3, 5, dtype=torch.complex128))  # C^T w = w
    u = torch.randn(2, 3, 1, 4, dtype=f64)
    y, x = s4d.s4d_contract(u, w, C, lam, B_bar)
    y_ref, x_ref = s4d.s4d_reference(u, w.to(C.dtype), lam, B_bar)
    torch.testing.assert_close((y, x), (y_ref, x_ref), rtol=0, atol=1e-12)
    y, _ = s4d.s4d_contract(u, w, C, lam, B_bar, x_ref)
    torch.testing.assert_close(y, s4d.s4d_reference(u, w.to(C.dtype), lam, B_bar, x_ref)[0], rtol=0, atol=1e-12)


def test_packed_sequences_each_convolve_from_zeros():
    """Sequences laid end to end, batched in groups padded to their longest, give what each gives alone."""
    c, lam, B_bar = ssm()
    spans = [(0, 1), (1, 8), (8, 9), (9, 25), (25, 31)]  # lengths 1, 7, 1, 16, 6
    u = torch.randn(1, 3, 31, 4, generator=torch.Generator().manual_seed(2), dtype=f64, requires_grad=True)
    y = s4d.s4d_fft_sequences(u, c, lam, B_bar, [[spans[3]], [spans[1], spans[4]], [spans[0], spans[2]]])
    alone = torch.cat([s4d.s4d_reference(u[:, :, start:end], c, lam, B_bar)[0] for start, end in spans], dim=2)
    torch.testing.assert_close(y, alone, rtol=0, atol=1e-10)
    weights = torch.randn_like(y)
    grad, = torch.autograd.grad((y * weights).sum(), u)
    grad_alone, = torch.autograd.grad((alone * weights).sum(), u)
    torch.testing.assert_close(grad, grad_alone, rtol=0, atol=1e-10)


def test_inits():
    M = 64
    paper = s4d.s4d_inv_imag(M)
    assert paper[0] == pytest.approx(M / math.pi * (M - 1)) and (paper[M // 2 :] < 0).all()
    assert (s4d.s4d_inv_imag(M, inv_uses_2M=True) > 0).all()
    torch.testing.assert_close(s4d.s4d_lin_imag(3), torch.tensor([0.0, math.pi, 2 * math.pi], dtype=f64))
    _, lam, _ = ssm()
    assert (lam.abs() < 1).all()
