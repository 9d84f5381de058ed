"""The integrators of coupled query-key dynamics, checked against their defining properties."""

import math

import torch

from attnlab.ops.coupled_qk import affine, affine_inverse, euler, head_mlp, leapfrog, uncoupled

D = 4


def random_force(per_head=False, heads=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (heads, D, D) if per_head else (D, D)
    w_in, w_out = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(2))
    return lambda x: head_mlp(x, w_in, w_out)


def test_euler_with_zero_force_drifts_q_by_k():
    q, k = torch.randn(2, 3, 5, D, dtype=torch.float64), torch.randn(2, 3, 5, D, dtype=torch.float64)
    q1, k1 = euler(q, k, torch.zeros_like, torch.tensor(0.3, dtype=torch.float64))
    torch.testing.assert_close(q1, q + 0.3 * k, rtol=0, atol=0)
    torch.testing.assert_close(k1, k, rtol=0, atol=0)


def test_euler_reads_the_old_state():
    f = random_force()
    q, k = torch.randn(1, 3, 2, D, dtype=torch.float64), torch.randn(1, 3, 2, D, dtype=torch.float64)
    dt = torch.tensor(0.2, dtype=torch.float64)
    q1, k1 = euler(q, k, f, dt)
    torch.testing.assert_close(q1, q + dt * k)
    torch.testing.assert_close(k1, k + dt * f(q))


def test_leapfrog_is_undone_by_negative_dt():
    for per_head in (False, True):
        f = random_force(per_head)
        q, k = torch.randn(2, 3, 7, D, dtype=torch.float64), torch.randn(2, 3, 7, D, dtype=torch.float64)
        dt = torch.rand(3, 1, 1, dtype=torch.float64) * 0.5
        q1, k1 = leapfrog(q, k, f, dt, steps=3)
        q0, k0 = leapfrog(q1, k1, f, -dt, steps=3)
        assert (q1 - q).abs().max() > 1e-2  # the step did move the state
        torch.testing.assert_close(q0, q, rtol=0, atol=1e-10)
        torch.testing.assert_close(k0, k, rtol=0, atol=1e-10)


def test_leapfrog_preserves_volume_and_euler_does_not():
    f = random_force(seed=3)
    dt = torch.tensor(0.3, dtype=torch.float64)

    def jacobian_det(integrator):
        def flat_map(z):
            q, k = integrator(z[:D], z[D:], f, dt, steps=2)
            return torch.cat((q, k))

        z = torch.randn(2 * D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        return torch.linalg.det(torch.autograd.functional.jacobian(flat_map, z)).item()

    assert abs(abs(jacobian_det(leapfrog)) - 1) < 1e-10
    assert abs(abs(jacobian_det(euler)) - 1) > 1e-3


def test_leapfrog_keeps_harmonic_energy_bounded_where_euler_drifts():
    omega, dt, steps = 1.5, torch.tensor(0.05, dtype=torch.float64), 1000

    def force(q):
        return -(omega**2) * q

    def energy(q, k):
        return (0.5 * k.square().sum() + 0.5 * omega**2 * q.square().sum()).item()

    q, k = torch.ones(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64)
    e0 = energy(q, k)
    worst = max(abs(energy(*leapfrog(q, k, force, dt, steps=n)) - e0) / e0 for n in (10, 250, 500, 999, 1000))
    assert worst < 1e-2
    assert energy(*euler(q, k, force, dt, steps)) > 2 * e0  # explicit Euler gains energy every step


def test_leapfrog_reuses_the_force_between_steps():
    calls = []

    def counting(q):
        calls.append(1)
        return -q

    leapfrog(torch.ones(D), torch.zeros(D), counting, torch.tensor(0.1), steps=5)
    assert len(calls) == 6  # N + 1 evaluations


def test_uncoupled_never_mixes_q_and_k():
    g = random_force()
    q, k = torch.randn(1, 3, 4, D, dtype=torch.float64), torch.randn(1, 3, 4, D, dtype=torch.float64)
    dt = torch.tensor(0.1, dtype=torch.float64)
    q1, k1 = uncoupled(q, k, g, dt, steps=2)
    q2, k2 = uncoupled(q, torch.randn_like(k), g, dt, steps=2)
    torch.testing.assert_close(q1, q2, rtol=0, atol=0)
    assert not torch.allclose(k1, k2)


def test_per_head_mlp_applies_each_heads_weights():
    g = torch.Generator().manual_seed(0)
    w_in, w_out = torch.randn(3, D, D, generator=g), torch.randn(3, D, D, generator=g)
    x = torch.randn(2, 3, 5, D, generator=g)
    y = head_mlp(x, w_in, w_out)
    for h in range(3):
        expected = torch.nn.functional.silu(x[:, h] @ w_in[h].T) @ w_out[h].T
        torch.testing.assert_close(y[:, h], expected)
    assert math.isclose(head_mlp(x, w_in[0], w_out[0])[:, 0].sum().item(), y[:, 0].sum().item(), rel_tol=1e-5)


def affine_layers(steps=2, scale=0.5, seed=0):
    """Coupling layers whose nets return (s, t) [..., 2D] from [..., D]."""
    g = torch.Generator().manual_seed(seed)

    def net():
        w_in, w_out = torch.randn(D, D, generator=g, dtype=torch.float64), torch.randn(2 * D, D, generator=g,
                                                                                         dtype=torch.float64)
        return lambda x: head_mlp(x, w_in, scale * w_out)

    return [(net(), net()) for _ in range(steps)]


def test_affine_rescales_and_shifts_each_half_by_a_net_of_the_other():
    layers = affine_layers(steps=1)
    q, k = torch.randn(2, 3, 5, D, dtype=torch.float64), torch.randn(2, 3, 5, D, dtype=torch.float64)
    q1, k1 = affine(q, k, layers)
    (net_k, net_q), = layers
    k_expected = k * net_k(q)[..., :D].tanh().exp() + net_k(q)[..., D:]
    torch.testing.assert_close(k1, k_expected, rtol=0, atol=0)
    q_expected = q * net_q(k_expected)[..., :D].tanh().exp() + net_q(k_expected)[..., D:]
    torch.testing.assert_close(q1, q_expected, rtol=0, atol=0)


def test_affine_is_undone_by_its_inverse_and_is_the_identity_with_zero_nets():
    layers = affine_layers(steps=3)
    q, k = torch.randn(2, 3, 7, D, dtype=torch.float64), torch.randn(2, 3, 7, D, dtype=torch.float64)
    q1, k1 = affine(q, k, layers)
    assert (q1 - q).abs().max() > 1e-2 and (k1 - k).abs().max() > 1e-2
    q0, k0 = affine_inverse(q1, k1, layers)
    torch.testing.assert_close(q0, q, rtol=0, atol=1e-10)
    torch.testing.assert_close(k0, k, rtol=0, atol=1e-10)
    zero = [(lambda x: torch.zeros(*x.shape[:-1], 2 * D, dtype=x.dtype),) * 2]
    assert all(torch.equal(a, b) for a, b in zip(affine(q, k, zero), (q, k), strict=True))


def test_affine_changes_volume_by_the_exp_of_its_scales():
    """log |det J| of one layer pair = sum of tanh s_1(q) + sum of tanh s_2(k'): a RealNVP map's volume change."""
    layers = affine_layers(steps=1, seed=2)
    (net_k, net_q), = layers

    def flat_map(z):
        return torch.cat(affine(z[:D], z[D:], layers))

    z = torch.randn(2 * D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    det = torch.linalg.det(torch.autograd.functional.jacobian(flat_map, z))
    k1 = affine(z[:D], z[D:], layers)[1]
    log_scales = net_k(z[:D])[:D].tanh().sum() + net_q(k1)[:D].tanh().sum()
    assert math.isclose(det.log().item(), log_scales.item(), rel_tol=1e-9)
