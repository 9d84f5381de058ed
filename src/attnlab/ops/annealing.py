"""A state-vector simulator of diabatic quantum annealing (DQA) for Boltzmann attention.

    H(t) = A(t) H_X + B(t) H_P,   H_X = -sum_j sigma^x_j,   H_P |s> = E(s) |s>,
linear schedule A = 1 - t/tau, B = t/tau, starting in |+>^n. The evolution is Trotterised into K steps
of length dt = tau/K at midpoint times, each a diagonal phase exp(-i dt B E) followed by
exp(-i dt A H_X) = prod_j (cos(A dt) + i sin(A dt) sigma^x_j). Measuring sigma^z gives a configuration;
amplitude index c is configuration c of `attnlab.ops.ising.configurations` (spin j = +1 where bit j is set).

A fast anneal samples a hot Boltzmann law: for small tau, p(s) ≈ 2^-n [1 + (tau^2/12) sum_j dE_j(s)], with
dE_j(s) the energy change when spin j flips (inverse temperatures tau^2/6 on the fields and tau^2/3 on
the couplings); a slow anneal ends in the ground state.
"""

from __future__ import annotations

import math

import torch

from .ising import configurations, ising_vjp


def anneal(energy: torch.Tensor, tau: float, steps: int = 200) -> torch.Tensor:
    """Measurement probabilities [Q, 2^n] after annealing each row of energies E(s) [Q, 2^n]."""
    Q, size = energy.shape
    n = size.bit_length() - 1
    cdtype = torch.complex128 if energy.dtype == torch.float64 else torch.complex64
    psi = torch.full((Q, size), 2 ** (-n / 2), dtype=cdtype, device=energy.device)
    dt = tau / steps
    for k in range(steps):
        s = (k + 0.5) / steps
        psi = psi * torch.exp(-1j * dt * s * energy)
        c, sn = math.cos((1 - s) * dt), math.sin((1 - s) * dt)
        for j in range(n):  # sigma^x on qubit j swaps the amplitudes of configurations that differ in bit j
            pair = psi.reshape(Q, 2 ** (n - 1 - j), 2, 2**j)
            low, high = pair[:, :, 0], pair[:, :, 1]
            psi = torch.stack((c * low + 1j * sn * high, c * high + 1j * sn * low), dim=2).reshape(Q, size)
    return psi.real**2 + psi.imag**2


def sample_configurations(probs: torch.Tensor, shots: int, generator: torch.Generator | None = None):
    """shots configurations per row of probs [Q, 2^n] -> spins [Q, shots, n]."""
    n = probs.shape[-1].bit_length() - 1
    index = torch.multinomial(probs.detach().float(), shots, replacement=True, generator=generator)
    return configurations(n, probs.device, probs.dtype)[index]


def ste_magnetisation(probs: torch.Tensor, spins: torch.Tensor) -> torch.Tensor:
    """Shot-averaged <s> [Q, n] whose gradient goes straight through the sampling into the simulated
    probabilities: value mean(spins), gradient that of probs @ configurations (autograd through the circuit)."""
    n = spins.shape[-1]
    simulated = probs @ configurations(n, probs.device, probs.dtype)
    return spins.mean(1) + (simulated - simulated.detach())


class _CovarianceEstimator(torch.autograd.Function):
    """Forward: shot-averaged magnetisations. Backward: dL/dh and dL/dJ as sample covariances (beta-scaled)."""

    @staticmethod
    def forward(ctx, h, J, spins, beta_h, beta_J):
        ctx.save_for_backward(spins)
        ctx.betas = (beta_h, beta_J)
        return spins.mean(1)

    @staticmethod
    def backward(ctx, grad_m):
        (spins,) = ctx.saved_tensors
        beta_h, beta_J = ctx.betas
        weights = torch.full(spins.shape[:2], 1 / spins.shape[1], dtype=spins.dtype, device=spins.device)
        grad_h, grad_J = ising_vjp(spins, weights, grad_m)
        return beta_h * grad_h, beta_J * grad_J, None, None, None


def covariance_magnetisation(h: torch.Tensor, J: torch.Tensor, spins: torch.Tensor, beta_h: float, beta_J: float):
    """<s> from samples spins [Q, N, n] of the Ising model with fields h [Q, n] and couplings J [Q, n, n],
    with the hardware-compatible gradient: connected correlations of the samples, scaled by the inverse
    temperatures the anneal realises (beta_h, beta_J); no differentiation through the simulator."""
    return _CovarianceEstimator.apply(h, J, spins, beta_h, beta_J)
