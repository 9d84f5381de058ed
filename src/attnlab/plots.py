"""Figures: creating and saving them (shared by every plot), and perplexity against context length."""

from __future__ import annotations


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
