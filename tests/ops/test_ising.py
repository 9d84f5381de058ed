"""Ising marginals for Boltzmann attention: enumeration, banded forward-backward, mean field, gradients."""

import itertools
import math

import pytest
import torch

from attnlab.errors import UserError
from attnlab.ops import ising
from attnlab.ops.ising import (
    band_couplings,
    banded_log_marginals,
    causal_log_weights,
    configurations,
    coupling_energy,
    ising_vjp,
    log_marginals,
    mean_field_fields,
    two_spin_magnetisation,
)

f64 = torch.float64


def brute_force_alpha(h, J=None, K=None):
    """P(s_j = +1) by looping over every configuration in plain Python."""
    n = len(h)
    Z, plus = 0.0, [0.0] * n
    for s in itertools.product((-1, 1), repeat=n):
        e = sum(h[j] * s[j] for j in range(n))
        if J is not None:
            e += sum(J[j][k] * s[j] * s[k] for j in range(n) for k in range(j + 1, n))
        if K is not None:
            e += sum(K[j][k][l] * s[j] * s[k] * s[l] for j, k, l in itertools.combinations(range(n), 3))
        p = math.exp(e)
        Z += p
        for j in range(n):
            plus[j] += p * (s[j] > 0)
    return torch.tensor([x / Z for x in plus], dtype=f64)


def exact_alpha(h, J=None, K=None):
    spins = configurations(h.shape[-1], dtype=f64)
    return log_marginals(h, coupling_energy(spins, J, K))[0].exp()


def test_enumeration_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    h, J, K = (torch.randn(*s, generator=g, dtype=f64) for s in [(5,), (5, 5), (5, 5, 5)])
    torch.testing.assert_close(exact_alpha(h, J), brute_force_alpha(h.tolist(), J.tolist()), rtol=0, atol=1e-12)
    torch.testing.assert_close(exact_alpha(h, J, K), brute_force_alpha(h.tolist(), J.tolist(), K.tolist()),
                               rtol=0, atol=1e-12)


def test_independent_spins_give_sigmoid_of_twice_the_field():
    h = torch.randn(4, 6, dtype=f64) * 3
    torch.testing.assert_close(exact_alpha(h), torch.sigmoid(2 * h), rtol=0, atol=1e-12)
    torch.testing.assert_close(exact_alpha(h, torch.zeros(6, 6, dtype=f64)), torch.sigmoid(2 * h), rtol=0, atol=1e-12)


def test_two_spin_closed_form():
    for h1, h2, J in [(0.3, -0.2, 0.7), (1.5, 0.4, -1.1), (-2.0, 2.0, 0.0)]:
        alpha = exact_alpha(torch.tensor([h1, h2], dtype=f64), torch.tensor([[0.0, J], [0.0, 0.0]], dtype=f64))
        assert 2 * alpha[0].item() - 1 == pytest.approx(two_spin_magnetisation(h1, h2, J), abs=1e-12)


def test_causal_weights_are_each_prefix_normalised():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(2, 3, 5, 5, generator=g, dtype=f64)  # B, H, queries, keys
    J = torch.randn(3, 7, 7, generator=g, dtype=f64)  # a window larger than the sequence
    weights = causal_log_weights(h, J).exp()
    for b, head, i in itertools.product(range(2), range(3), range(5)):
        alpha = brute_force_alpha(h[b, head, i, : i + 1].tolist(), J[head, : i + 1, : i + 1].tolist())
        torch.testing.assert_close(weights[b, head, i, : i + 1], alpha / alpha.sum(), rtol=0, atol=1e-12)
        assert (weights[b, head, i, i + 1 :] == 0).all()


def test_decoupled_absent_spins_equal_prefix_enumeration():
    """The other masking: all spins present, the absent ones with no field and no couplings."""
    g = torch.Generator().manual_seed(2)
    h, J = torch.randn(6, generator=g, dtype=f64), torch.randn(6, 6, generator=g, dtype=f64)
    visible = 4
    h_masked, J_masked = h.clone(), J.clone()
    h_masked[visible:] = 0
    J_masked[visible:, :] = 0
    J_masked[:, visible:] = 0
    prefix = exact_alpha(h[:visible], J[:visible, :visible])
    torch.testing.assert_close(exact_alpha(h_masked, J_masked)[:visible], prefix, rtol=0, atol=1e-12)


def oracle_log_weights(h, J=None, K=None):
    """causal_log_weights by a plain log-domain enumeration per query: log P(s_j = +1) as a logsumexp over
    the configurations with s_j = +1, then normalised over the visible keys. Differentiable."""
    B, H, Tq, S = h.shape
    rows = []
    for r in range(Tq):
        n = S - Tq + r + 1
        s = torch.tensor(list(itertools.product((-1.0, 1.0), repeat=n)), dtype=h.dtype)  # [2^n, n]
        log_weight = h[:, :, r, :n] @ s.T  # [B, H, 2^n]
        for j, k in itertools.combinations(range(n), 2) if J is not None else ():
            log_weight = log_weight + J[:, j, k, None] * s[:, j] * s[:, k]
        for j, k, l in itertools.combinations(range(n), 3) if K is not None else ():
            log_weight = log_weight + K[:, j, k, l, None] * s[:, j] * s[:, k] * s[:, l]
        log_plus = torch.stack([torch.logsumexp(log_weight[..., s[:, j] > 0], -1) for j in range(n)], -1)
        row = torch.log_softmax(log_plus - torch.logsumexp(log_weight, -1, keepdim=True), -1)
        rows.append(torch.nn.functional.pad(row, (0, S - n), value=float("-inf")))
    return torch.stack(rows, dim=2)


def random_problem(B, H, Tq, S, field_scale, couplings, dtype=f64, seed=0):
    """h, J [H, S + 1, S + 1] (a window longer than the sequence) and K, or None where not in `couplings`."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, H, Tq, S, generator=g, dtype=dtype) * field_scale
    J = torch.randn(H, S + 1, S + 1, generator=g, dtype=dtype) if "J" in couplings else None
    K = torch.randn(H, S + 1, S + 1, S + 1, generator=g, dtype=dtype) * 0.5 if "K" in couplings else None
    return h, J, K


@pytest.mark.parametrize("couplings", ["", "J", "JK", "K"])
@pytest.mark.parametrize("field_scale", [1.0, 30.0])
@pytest.mark.parametrize("Tq, S, merged, tight", [(7, 7, None, False), (7, 7, 0, False), (7, 7, 2**30, True),
                                                   (3, 6, None, False), (1, 5, None, False), (2, 12, None, False)])
def test_causal_weights_and_their_gradients_equal_the_oracle(couplings, field_scale, Tq, S, merged, tight,
                                                             monkeypatch):
    """merged: MERGED_ROWS (0: every prefix alone, 2^30: all in one table); tight: a memory budget that
    takes one sequence at a time."""
    if merged is not None:
        monkeypatch.setattr(ising, "MERGED_ROWS", merged)
    h, J, K = random_problem(3, 2, Tq, S, field_scale, couplings)
    inputs = [x.requires_grad_() for x in (h, J, K) if x is not None]
    fast = causal_log_weights(h, J, K, **({"memory_budget": 2 * 2**S * 8 * 3} if tight else {}))
    exact = oracle_log_weights(h, J, K)
    torch.testing.assert_close(fast, exact, rtol=0, atol=1e-10)
    visible = torch.isfinite(exact)
    assert visible.sum() == 3 * 2 * sum(range(S - Tq + 1, S + 1))
    upstream = torch.randn(fast.shape, generator=torch.Generator().manual_seed(1), dtype=f64)

    def grads(out):
        return torch.autograd.grad((torch.where(visible, out, 0) * upstream).sum(), inputs)

    for got, want in zip(grads(fast), grads(exact), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-9 * max(1.0, want.abs().max().item()))


@pytest.mark.parametrize("field_scale", [1.0, 30.0])
def test_float32_agrees_with_float64(field_scale):
    h, J, _ = random_problem(4, 2, 10, 10, field_scale, "J", seed=2)
    J = J * 2
    h, J = h.requires_grad_(), J.requires_grad_()
    visible = torch.ones(10, 10, dtype=torch.bool).tril()
    upstream = torch.randn(4, 2, 10, 10, dtype=f64, generator=torch.Generator().manual_seed(3))
    results = []
    for dtype in (f64, torch.float32):
        hd, Jd = h.to(dtype), J.to(dtype)
        out = causal_log_weights(hd, Jd)
        weights = torch.softmax(out, -1)  # as the mixer uses them
        results.append((out, weights, *torch.autograd.grad((weights * upstream.to(dtype)).sum(), (hd, Jd))))
    (out64, w64, gh64, gJ64), (out32, w32, gh32, gJ32) = results
    assert torch.isfinite(out32[..., visible]).all() and (out32[..., ~visible] == float("-inf")).all()
    torch.testing.assert_close(w32.double(), w64, rtol=0, atol=1e-6 * field_scale)
    sizeable = visible & (w64 > 1e-20)  # log-weights of every key that is not negligible
    torch.testing.assert_close(out32.double()[sizeable], out64[sizeable], rtol=0, atol=1e-5 * field_scale)
    torch.testing.assert_close(gh32.double(), gh64, rtol=0, atol=1e-5 * field_scale * gh64.abs().max().item())
    torch.testing.assert_close(gJ32.double(), gJ64, rtol=0, atol=1e-5 * field_scale * gJ64.abs().max().item())


def test_float32_keeps_the_relative_weights_of_keys_that_are_all_unlikely():
    """All fields at -60: every alpha_j ~ e^-120, far below float32's range, yet their ratios are O(1)."""
    h = -60 + torch.randn(2, 1, 6, 6, dtype=f64, generator=torch.Generator().manual_seed(4))
    J = torch.randn(1, 6, 6, dtype=f64, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(causal_log_weights(h.float(), J.float()).double(), oracle_log_weights(h, J),
                               rtol=0, atol=1e-4)


def test_extreme_fields_and_couplings_stay_finite():
    h = torch.tensor([[[[50.0, -50.0, 3.0, -50.0]]]], dtype=f64).expand(1, 1, 4, 4).clone()
    J = torch.full((1, 4, 4), 20.0, dtype=f64)
    for dtype in (f64, torch.float32):
        w = causal_log_weights(h.to(dtype), J.to(dtype))
        assert torch.isfinite(w.exp()).all() and torch.allclose(w.exp().sum(-1), torch.ones(1, dtype=dtype))
    moderate = torch.randn(2, 1, 6, 6, dtype=f64)
    Jm = torch.randn(1, 6, 6, dtype=f64)
    torch.testing.assert_close(causal_log_weights(moderate.float(), Jm.float()).exp(),
                               causal_log_weights(moderate, Jm).exp().float(), rtol=0, atol=1e-5)


def test_exact_inference_refuses_what_does_not_fit_and_names_the_alternatives():
    h = torch.zeros(1, 1, 1, 30)
    with pytest.raises(UserError, match=r"2\^30 configurations .* use inference=banded .* mean-field or dqa"):
        causal_log_weights(h, None, memory_budget=2**30)


def test_jacobian_is_half_the_connected_correlation():
    """d alpha_j / d h_k = (<s_j s_k> - <s_j><s_k>) / 2 (the paper's Proposition 1)."""
    g = torch.Generator().manual_seed(3)
    h, J = torch.randn(5, generator=g, dtype=f64), torch.randn(5, 5, generator=g, dtype=f64)
    spins = configurations(5, dtype=f64)
    p = torch.softmax(h @ spins.T + coupling_energy(spins, J), dim=-1)
    m = p @ spins
    corr = torch.einsum("c,cj,ck->jk", p, spins, spins) - torch.outer(m, m)
    eps = 1e-6
    jac = torch.stack([(exact_alpha(h + eps * e, J) - exact_alpha(h - eps * e, J)) / (2 * eps)
                       for e in torch.eye(5, dtype=f64)], dim=1)
    torch.testing.assert_close(jac, corr / 2, rtol=0, atol=1e-8)
    torch.testing.assert_close(torch.diagonal(corr), 1 - m**2, rtol=0, atol=1e-12)
    assert torch.linalg.eigvalsh(corr).min() > -1e-12


def test_covariance_backward_equals_autograd():
    g = torch.Generator().manual_seed(4)
    h = torch.randn(3, 5, generator=g, dtype=f64, requires_grad=True)
    J = torch.randn(5, 5, generator=g, dtype=f64, requires_grad=True)
    grad_m = torch.randn(3, 5, generator=g, dtype=f64)
    spins = configurations(5, dtype=f64)
    log_weight = h @ spins.T + coupling_energy(spins, J)
    m = torch.softmax(log_weight, -1) @ spins
    grad_h, grad_J = torch.autograd.grad((m * grad_m).sum(), (h, J))
    p = torch.softmax(log_weight.detach(), -1)
    vjp_h, vjp_J = ising_vjp(spins.expand(3, -1, -1), p, grad_m)
    torch.testing.assert_close(vjp_h, grad_h, rtol=0, atol=1e-12)
    torch.testing.assert_close(vjp_J.sum(0), grad_J.triu(1), rtol=0, atol=1e-12)


def test_sample_covariance_gradient_converges_like_one_over_root_n():
    g = torch.Generator().manual_seed(5)
    h, J = torch.randn(4, generator=g, dtype=f64), torch.randn(4, 4, generator=g, dtype=f64) * 0.5
    grad_m = torch.randn(1, 4, generator=g, dtype=f64)
    spins = configurations(4, dtype=f64)
    p = torch.softmax(h @ spins.T + coupling_energy(spins, J), -1)
    exact_h, _ = ising_vjp(spins[None], p[None], grad_m)

    def error(n, trials=40):
        errs = []
        for _ in range(trials):
            idx = torch.multinomial(p, n, replacement=True, generator=g)
            est, _ = ising_vjp(spins[idx][None], torch.full((1, n), 1 / n, dtype=f64), grad_m)
            errs.append((est - exact_h).norm())
        return torch.stack(errs).mean()

    ratio = (error(10_000) / error(100)).item()
    assert 0.05 < ratio < 0.2  # 1/sqrt(100) = 0.1


def test_j_only_is_uniform_and_its_couplings_get_no_gradient():
    J = torch.randn(1, 6, 6, dtype=f64, requires_grad=True)
    w = causal_log_weights(torch.zeros(1, 1, 6, 6, dtype=f64), J).exp()
    uniform = torch.ones(6, 6, dtype=f64).tril() / torch.arange(1, 7, dtype=f64)[:, None]
    torch.testing.assert_close(w[0, 0], uniform, rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad((w * torch.randn_like(w)).sum(), J)
    assert grad.abs().max() < 1e-12
    K = torch.randn(1, 6, 6, 6, dtype=f64)  # an odd three-body term breaks the s -> -s symmetry
    assert not torch.allclose(causal_log_weights(torch.zeros(1, 1, 6, 6, dtype=f64), J, K).exp()[0, 0], uniform)


def test_permuting_keys_with_the_couplings_permutes_the_marginals():
    g = torch.Generator().manual_seed(6)
    h, J = torch.randn(5, generator=g, dtype=f64), torch.randn(5, 5, generator=g, dtype=f64)
    J_sym = J.triu(1) + J.triu(1).T
    perm = torch.tensor([3, 0, 4, 1, 2])
    permuted = exact_alpha(h[perm], J_sym[perm][:, perm].triu(1))
    torch.testing.assert_close(permuted, exact_alpha(h, J)[perm], rtol=0, atol=1e-12)


@pytest.mark.parametrize("n, w", [(7, 2), (9, 3), (6, 5)])
def test_banded_equals_enumeration(n, w):
    g = torch.Generator().manual_seed(n)
    h = torch.randn(3, n, generator=g, dtype=f64, requires_grad=True)
    offset = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    J = (torch.randn(n, n, generator=g, dtype=f64) * (offset <= w)).requires_grad_()
    banded = banded_log_marginals(h, band_couplings(J, w)[None])
    spins = configurations(n, dtype=f64)
    exact = log_marginals(h, coupling_energy(spins, J))[0]
    torch.testing.assert_close(banded, exact, rtol=0, atol=1e-12)
    upstream = torch.randn(3, n, generator=g, dtype=f64)
    grads_banded = torch.autograd.grad((banded * upstream).sum(), (h, J))
    grads_exact = torch.autograd.grad((exact * upstream).sum(), (h, J))
    in_band = (offset >= 1) & (offset <= w)  # the only couplings the banded pass reads
    torch.testing.assert_close(grads_banded[0], grads_exact[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(grads_banded[1] * in_band, grads_exact[1] * in_band, rtol=0, atol=1e-10)
    assert (grads_banded[1][~in_band] == 0).all()


def test_mean_field_is_exact_without_couplings_and_close_for_weak_ones():
    h = torch.randn(2, 6, dtype=f64)
    torch.testing.assert_close(torch.tanh(mean_field_fields(h)), torch.tanh(h))
    torch.testing.assert_close(torch.tanh(mean_field_fields(h, torch.zeros(6, 6, dtype=f64))), torch.tanh(h))
    J = torch.randn(6, 6, dtype=f64) * 0.05
    m_exact = 2 * exact_alpha(h, J) - 1
    mean_field_error = (torch.tanh(mean_field_fields(h, J, iterations=60)) - m_exact).abs().max()
    independent_error = (torch.tanh(h) - m_exact).abs().max()  # ignoring the couplings altogether
    assert mean_field_error < 0.2 * independent_error


def test_mean_field_fixed_point():
    h, J = torch.randn(5, dtype=f64), torch.randn(5, 5, dtype=f64) * 0.1
    phi = mean_field_fields(h, J, iterations=200)
    J_sym = J.triu(1) + J.triu(1).T
    torch.testing.assert_close(phi, h + J_sym @ torch.tanh(phi), rtol=0, atol=1e-10)


def test_coupling_profile_averages_each_diagonal():
    from attnlab.papers.boltzmann.couplings import coupling_profile

    J = torch.tensor([[0.0, 1.0, 2.0], [9.0, 0.0, 3.0], [9.0, 9.0, 0.0]])
    mean, std = coupling_profile(J)
    torch.testing.assert_close(mean, torch.tensor([2.0, 2.0]))
    torch.testing.assert_close(std, torch.tensor([1.0, 0.0]))
