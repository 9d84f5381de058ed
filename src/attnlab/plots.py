"""Figures: creating and saving them (shared by every plot), perplexity against context length, and the learned
Boltzmann couplings as a heat map and as a profile over distance."""

from __future__ import annotations

from pathlib import Path

import torch


def new_figure(*args, **kwargs):
    """``plt.subplots(*args, **kwargs)`` on matplotlib's Agg backend (files only, no display): (fig, axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save_figure(fig, path, dpi: int, rect=None):
    """Lay fig out tightly (within rect, if given), write it to path and close it; returns path."""
    import matplotlib.pyplot as plt

    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot_perplexity_by_length(curves: dict, path, train_length: int | None = None):
    """curves: {label: {length: perplexity}} -> a PNG of perplexity against context length."""
    fig, ax = new_figure(figsize=(6, 4))
    for label, curve in curves.items():
        ax.plot(list(curve), list(curve.values()), marker="o", label=label)
    if train_length:
        ax.axvline(train_length, color="gray", linestyle="--", linewidth=0.8, label="training length")
    ax.set(xscale="log", xlabel="context length (tokens)", ylabel="perplexity", title="length extrapolation")
    ax.legend()
    return save_figure(fig, path, dpi=120)


def coupling_profile(J: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation of J_jk over the pairs at each distance d = k - j = 1..W-1.

    J [..., W, W] (the strict upper triangle is used; leading dimensions, e.g. heads or seeds, are pooled).
    """
    W = J.shape[-1]
    means, stds = [], []
    for d in range(1, W):
        values = torch.diagonal(J, offset=d, dim1=-2, dim2=-1).flatten()
        means.append(values.mean())
        stds.append(values.std(correction=0))
    return torch.stack(means), torch.stack(stds)


def plot_couplings(J: torch.Tensor, path: str | Path, title: str = "learned couplings J") -> Path:
    """Write a PNG with the (pooled) coupling matrix and its profile over distance; returns the path."""
    J = J.detach().float().cpu()
    J = J.reshape(-1, *J.shape[-2:])
    matrix = J.mean(0).triu(1)
    matrix = matrix + matrix.T  # J_jk for j < k, shown on both sides
    mean, std = coupling_profile(J)
    fig, (left, right) = new_figure(1, 2, figsize=(10, 4))
    limit = float(matrix.abs().max()) or 1.0
    image = left.imshow(matrix.numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit)
    left.set(title=title, xlabel="key position k", ylabel="key position j")
    fig.colorbar(image, ax=left)
    distance = torch.arange(1, len(mean) + 1)
    right.errorbar(distance.numpy(), mean.numpy(), yerr=std.numpy(), marker="o", capsize=3)
    right.axhline(0, color="gray", linewidth=0.8)
    right.set(title="mean J by distance", xlabel="|j - k|", ylabel="J (ferromagnetic > 0)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, path, dpi=120)
