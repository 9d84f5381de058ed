"""Interdomain attention's readout of the S4D state: four forms, three readout conventions."""

import math

import pytest
import torch

from attnlab.ops import interdomain as ops
from attnlab.ops.s4d import discretize, s4d_inv_imag
from helpers import assert_same

f64 = torch.float64


def inputs(B=2, H=3, T=37, R=4, D=5, M=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g, dtype=f64)  # noqa: E731
    xi_q = torch.nn.functional.normalize(rand(B, H, T, R), dim=-1).requires_grad_()
    z = rand(B, H, T, R + D).requires_grad_()
    A = torch.complex(-0.5 * torch.ones(H, M, dtype=f64), s4d_inv_imag(M).expand(H, M))
    log_dt = torch.empty(H, dtype=f64).uniform_(math.log(1e-3), math.log(1e-1), generator=g).requires_grad_()
    C = torch.complex(rand(H, M, M), rand(H, M, M)) / math.sqrt(M)
    C_real = torch.view_as_real(C).clone().requires_grad_()
    X0 = torch.view_as_real(torch.complex(rand(B, H, M, R + D), rand(B, H, M, R + D))).clone().requires_grad_()
    return [xi_q, z, log_dt, C_real, X0], A


def run(form, readout, A, **options):
    def go(xi_q, z, log_dt, C_real, X0):
        lam, B_bar = discretize(log_dt, A)
        o, X = form(xi_q, z, lam, B_bar, torch.view_as_complex(C_real), readout, torch.view_as_complex(X0), **options)
        return o, torch.view_as_real(X)

    return go


def compare(form, readout, atol=1e-10, **options):
    from helpers import grads_of

    leaves, A = inputs()
    expected = grads_of(run(ops.interdomain_reference, readout, A), leaves)
    assert_same(grads_of(run(form, readout, A, **options), leaves), expected, atol=atol)


@pytest.mark.parametrize("readout", ops.READOUTS)
def test_fft_matches_reference(readout):
    compare(ops.interdomain_fft, readout)


@pytest.mark.parametrize("readout", ops.READOUTS)
@pytest.mark.parametrize("chunk", [1, 7, 64, 37])
def test_chunk_matches_reference(readout, chunk):
    compare(ops.interdomain_chunk, readout, chunk_size=chunk)


@pytest.mark.parametrize("readout", ops.READOUTS)
def test_cheap_decode_step_matches_reference(readout):
    def stepped(xi_q, z, lam, B_bar, C, readout, X):
        outputs = []
        for t in range(z.shape[2]):
            o, X = ops.interdomain_step(xi_q[:, :, t], z[:, :, t], lam, B_bar, C, X, readout)
            outputs.append(o)
        return torch.stack(outputs, dim=2), X

    compare(stepped, readout)


@pytest.mark.parametrize("fft", [False, True])
def test_a_read_of_one_token_runs_from_a_state_or_from_none(fft):
    """The step continues a state; one token from none (a rank's last document, one token long) is the loop's."""
    leaves, A = inputs(T=1)
    xi_q, z, log_dt, C_real, X0 = (t.detach() for t in leaves)
    lam, B_bar = discretize(log_dt, A)
    C, X0 = torch.view_as_complex(C_real), torch.view_as_complex(X0)
    for start in (None, X0):
        got = ops.interdomain_read(xi_q, z, lam, B_bar, C, initial_state=start, fft=fft)
        expected = ops.interdomain_reference(xi_q, z, lam, B_bar, C, initial_state=start)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_hermitian_readout_is_a_real_basis_of_twice_the_size():
    """Re(xi^T U^H Gamma) = xi^T (Re U^T Re Gamma + Im U^T Im Gamma): 2M real basis functions."""
    (xi_q, z, log_dt, C_real, X0), A = inputs(T=9)
    lam, B_bar = discretize(log_dt, A)
    C = torch.view_as_complex(C_real)
    o, X = ops.interdomain_reference(xi_q, z, lam, B_bar, C, "hermitian", torch.view_as_complex(X0))
    U, Gamma = C @ X[..., :4], C @ X[..., 4:]
    stacked_U, stacked_G = torch.cat((U.real, U.imag), dim=-2), torch.cat((Gamma.real, Gamma.imag), dim=-2)
    expected = (stacked_G.transpose(-1, -2) @ (stacked_U @ xi_q[:, :, -1, :, None])).squeeze(-1)
    torch.testing.assert_close(o[:, :, -1], expected)


def test_two_segments_with_a_carried_state_equal_one_pass():
    (xi_q, z, log_dt, C_real, X0), A = inputs(T=50)
    lam, B_bar = discretize(log_dt.detach(), A)
    C, X0 = torch.view_as_complex(C_real.detach()), torch.view_as_complex(X0.detach())
    xi_q, z = xi_q.detach(), z.detach()
    full, X_full = ops.interdomain_chunk(xi_q, z, lam, B_bar, C, initial_state=X0, chunk_size=16)
    a, X_mid = ops.interdomain_chunk(xi_q[:, :, :21], z[:, :, :21], lam, B_bar, C, initial_state=X0, chunk_size=16)
    b, X_end = ops.interdomain_chunk(xi_q[:, :, 21:], z[:, :, 21:], lam, B_bar, C, initial_state=X_mid, chunk_size=16)
    torch.testing.assert_close(torch.cat((a, b), 2), full, rtol=0, atol=1e-12)
    torch.testing.assert_close(X_end, X_full, rtol=0, atol=1e-12)


@pytest.mark.parametrize("readout", ops.READOUTS)
def test_packed_sequences_read_each_from_a_zero_state(readout):
    """cu_seqlens (one row of sequences of 1 to 3 chunks of 8): every sequence's outputs are those it has alone,
    from a zero state; no state is returned."""
    cu_seqlens = torch.tensor([0, 8, 30, 45, 47])
    (xi_q, z, log_dt, C_real, _), A = inputs(B=1, T=47)
    lam, B_bar = discretize(log_dt, A)
    C = torch.view_as_complex(C_real)
    o, state = ops.interdomain_chunk(xi_q, z, lam, B_bar, C, readout, chunk_size=8, cu_seqlens=cu_seqlens)
    assert state is None
    for a, b in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True):
        alone, _ = ops.interdomain_chunk(xi_q[:, :, a:b], z[:, :, a:b], lam, B_bar, C, readout, chunk_size=8)
        torch.testing.assert_close(o[:, :, a:b], alone, rtol=0, atol=1e-10)
