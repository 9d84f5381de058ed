"""The diabatic quantum annealing simulator."""

import torch

from attnlab.ops.annealing import anneal, covariance_magnetisation, sample_configurations, ste_magnetisation
from attnlab.ops.ising import configurations, coupling_energy

f64 = torch.float64


def instance(n=4, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(1, n, generator=g, dtype=f64) * scale
    J = torch.randn(n, n, generator=g, dtype=f64) * scale
    spins = configurations(n, dtype=f64)
    return h, J, spins, h @ spins.T + coupling_energy(spins, J)  # log-weights = -E


def flip_sum(energy, n):
    """sum_j [E(s with spin j flipped) - E(s)] for every configuration."""
    idx = torch.arange(2**n)
    return sum(energy[..., idx ^ (1 << j)] - energy for j in range(n))


def test_zero_time_is_uniform_and_norm_is_kept():
    *_, log_weight = instance()
    torch.testing.assert_close(anneal(-log_weight, 1e-9, 10), torch.full((1, 16), 1 / 16, dtype=f64))
    probs = anneal(-log_weight, 3.0, 200)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, dtype=f64), rtol=0, atol=1e-12)


def test_slow_anneal_finds_the_ground_state():
    *_, log_weight = instance(seed=0)
    best, second = log_weight[0].topk(2).values
    assert best - second > 0.5  # a non-degenerate ground state with a clear gap
    probs = anneal(-log_weight, 80.0, 2000)
    assert probs[0, log_weight[0].argmax()] > 0.99


def test_fast_anneal_follows_the_high_temperature_law():
    """p(s) = 2^-n [1 + (tau^2/12) sum_j dE_j(s)] + O(tau^4)."""
    *_, log_weight = instance(n=3, scale=0.5)
    errors = []
    for tau in (0.1, 0.2):
        law = (1 + tau**2 / 12 * flip_sum(-log_weight, 3)) / 8
        errors.append((anneal(-log_weight, tau, 2000) - law).abs().max().item())
    assert errors[1] < 1e-4
    assert errors[1] / errors[0] > 8  # fourth order: doubling tau multiplies the error by about 16


def test_independent_spins_stay_independent():
    h = torch.randn(1, 3, dtype=f64)
    spins = configurations(3, dtype=f64)
    probs = anneal(-(h @ spins.T), 2.0, 200)[0].reshape(2, 2, 2)  # axes: spin 2, spin 1, spin 0
    product = probs.sum((1, 2))[:, None, None] * probs.sum((0, 2))[None, :, None] * probs.sum((0, 1))[None, None, :]
    torch.testing.assert_close(probs, product, rtol=0, atol=1e-12)


def test_free_qubits_leave_the_others_alone():
    h, J, _, log_weight = instance(n=3, seed=4)
    spins4 = configurations(4, dtype=f64)
    padded_h = torch.cat((h, torch.zeros(1, 1, dtype=f64)), dim=1)
    padded_J = torch.nn.functional.pad(J, (0, 1, 0, 1))
    padded = anneal(-(padded_h @ spins4.T + coupling_energy(spins4, padded_J)), 2.0, 100)
    m3 = anneal(-log_weight, 2.0, 100) @ configurations(3, dtype=f64)
    torch.testing.assert_close((padded @ spins4)[:, :3], m3, rtol=0, atol=1e-12)
    torch.testing.assert_close((padded @ spins4)[:, 3], torch.zeros(1, dtype=f64), rtol=0, atol=1e-12)


def test_trotter_error_falls_with_more_steps():
    *_, log_weight = instance(seed=5)
    fine = anneal(-log_weight, 2.0, 4000)
    assert (anneal(-log_weight, 2.0, 400) - fine).abs().max() < (anneal(-log_weight, 2.0, 40) - fine).abs().max() / 5


def test_straight_through_gradient_is_that_of_the_simulated_probabilities():
    h = torch.randn(1, 3, dtype=f64, requires_grad=True)
    spins = configurations(3, dtype=f64)
    probs = anneal(-(h @ spins.T), 1.5, 50)
    samples = sample_configurations(probs, 64, torch.Generator().manual_seed(0))
    m = ste_magnetisation(probs, samples)
    torch.testing.assert_close(m.detach(), samples.mean(1))
    (grad,) = torch.autograd.grad(m[0, 1], h)
    eps = 1e-6
    numeric = []
    for k in range(3):
        e = torch.zeros(1, 3, dtype=f64)
        e[0, k] = eps
        plus = anneal(-((h.detach() + e) @ spins.T), 1.5, 50) @ spins
        minus = anneal(-((h.detach() - e) @ spins.T), 1.5, 50) @ spins
        numeric.append(((plus - minus) / (2 * eps))[0, 1])
    torch.testing.assert_close(grad[0], torch.stack(numeric), rtol=0, atol=1e-7)


def test_covariance_gradient_reaches_fields_and_couplings():
    h = torch.randn(2, 3, dtype=f64, requires_grad=True)
    J = torch.randn(2, 3, 3, dtype=f64, requires_grad=True)
    samples = configurations(3, dtype=f64)[torch.randint(8, (2, 500))]
    m = covariance_magnetisation(h, J, samples, 0.5, 1.0)
    grad_h, grad_J = torch.autograd.grad(m.sum(), (h, J))
    assert torch.isfinite(grad_h).all() and grad_h.abs().sum() > 0 and grad_J.triu(1).abs().sum() > 0
