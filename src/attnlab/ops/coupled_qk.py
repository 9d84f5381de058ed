"""Coupled query-key dynamics (Gahtan & Bronstein 2026): q and k of each token and head evolve together
before scoring. q plays the role of a position and k of a momentum; f is a learned force.

All functions act on q, k of shape [..., D] and a step size dt that broadcasts against them; f maps
[..., D] -> [..., D]. Each token is transformed independently, so causality is untouched.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Force = Callable[[torch.Tensor], torch.Tensor]


def euler(q: torch.Tensor, k: torch.Tensor, f: Force, dt: torch.Tensor, steps: int = 1):
    """Explicit Euler: q' = q + dt k,  k' = k + dt f(q)  (both updates read the old state)."""
    for _ in range(steps):
        q, k = q + dt * k, k + dt * f(q)
    return q, k


def leapfrog(q: torch.Tensor, k: torch.Tensor, f: Force, dt: torch.Tensor, steps: int = 1):
    """Kick-drift-kick (Stormer-Verlet):
        k_half = k + dt/2 f(q);  q' = q + dt k_half;  k' = k_half + dt/2 f(q').
    Each kick and drift is a shear, so the map is volume-preserving, and running it with -dt undoes it.
    The force at q' is reused as the next step's first kick: N steps cost N + 1 evaluations of f."""
    force = f(q)
    for _ in range(steps):
        k = k + 0.5 * dt * force
        q = q + dt * k
        force = f(q)
        k = k + 0.5 * dt * force
    return q, k


def uncoupled(q: torch.Tensor, k: torch.Tensor, g: Force, dt: torch.Tensor, steps: int = 1):
    """The ablation without coupling: q' = q + dt g(q),  k' = k + dt g(k) -- nothing crosses between them."""
    for _ in range(steps):
        q, k = q + dt * g(q), k + dt * g(k)
    return q, k


INTEGRATORS = {"euler": euler, "leapfrog": leapfrog, "uncoupled": uncoupled}


def affine(q: torch.Tensor, k: torch.Tensor, layers: list[tuple[Force, Force]]):
    """Alternating affine coupling layers (RealNVP), each a pair of nets returning (s, t) side by side:
        k' = k * exp(tanh s_1(q)) + t_1(q);   q' = q * exp(tanh s_2(k')) + t_2(k').
    Each half is rescaled and shifted by a function of the other, so the map is invertible (affine_inverse)
    whatever the nets; with nets that output zero it is the identity. tanh keeps each scale within (1/e, e), as
    RealNVP implementations bound it, so that stacked layers cannot overflow. (The coupled-QK follow-up describes
    an identity-initialised, invertible RealNVP-style coupling of q and k; this form is reconstructed from that
    description, not from its code.)"""
    for net_k, net_q in layers:
        s, t = net_k(q).chunk(2, dim=-1)
        k = k * s.tanh().exp() + t
        s, t = net_q(k).chunk(2, dim=-1)
        q = q * s.tanh().exp() + t
    return q, k


def affine_inverse(q: torch.Tensor, k: torch.Tensor, layers: list[tuple[Force, Force]]):
    """The inverse of `affine`: the layers undone in reverse order, q first."""
    for net_k, net_q in reversed(layers):
        s, t = net_q(k).chunk(2, dim=-1)
        q = (q - t) * (-s.tanh()).exp()
        s, t = net_k(q).chunk(2, dim=-1)
        k = (k - t) * (-s.tanh()).exp()
    return q, k


def head_mlp(x: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
    """The force network f(x) = W_out silu(W_in x), bias-free, applied to every head's vector.

    x: [B, H, T, D]. Weights [E, D] and [D_out, E] are shared by all heads; [H, E, D] and [H, D_out, E] give
    each head its own.
    """
    if w_in.ndim == 2:
        return torch.nn.functional.silu(x @ w_in.T) @ w_out.T
    hidden = torch.nn.functional.silu(torch.einsum("bhtd,hed->bhte", x, w_in))
    return torch.einsum("bhte,hde->bhtd", hidden, w_out)
