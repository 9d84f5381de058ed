"""A report's claims figure: each claim's Δ and 95% interval beside the paper's effect, coloured by verdict."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from ..plots import new_figure, save_figure
from .claims import Claim, Verdict

COLOURS = {"agrees": "tab:green", "agrees in sign; smaller than the paper's": "yellowgreen",
           "agrees in sign; larger than the paper's": "darkgreen", "opposite": "tab:red",
           "smaller than the paper's": "tab:orange",
           "inconclusive": "tab:gray", "untestable here": "tab:purple", "not calibrated": "tab:brown",
           "mechanism not engaged": "tab:olive", "not run yet": "lightgray"}


def _plot_row(ax, claim: Claim, v: Verdict) -> None:
    colour = COLOURS[v.verdict]
    ax.axvline(0, color="black", lw=0.8)
    if claim.direction == "equal":
        ax.axvspan(-claim.threshold, claim.threshold, color="tab:blue", alpha=0.12)
    if v.n >= 2:
        ax.errorbar(v.delta, 0, xerr=[[v.delta - v.low], [v.high - v.delta]], fmt="o", color=colour, capsize=4)
    elif v.n == 1:
        ax.plot(v.delta, 0, "o", color=colour, mfc="white")  # hollow: one seed, no interval
    if claim.target is not None:
        ax.plot(claim.target, 0.5, "D", color="black", mfc="none")  # just above ours, on the same Δ axis
    shown = [0.0, *([claim.target] if claim.target is not None else []),
             *([-claim.threshold, claim.threshold] if claim.direction == "equal" else []),
             *[x for x in (v.low, v.high, v.delta) if not math.isnan(x)]]
    pad = 0.15 * (max(shown) - min(shown)) or 1.0
    ax.set(xlim=(min(shown) - pad, max(shown) + pad), ylim=(-0.8, 1.1), yticks=[])
    ax.tick_params(axis="x", labelsize=7)
    if claim.relative:
        ax.xaxis.set_major_formatter(lambda x, _: f"{x:g}%".replace("-", "−"))
    ax.set_ylabel(textwrap.fill(claim.statement, 40), rotation=0, ha="right", va="center", fontsize=8,
                  fontweight="bold" if claim.headline else "normal")
    ax.text(1.01, 0.5, v.verdict, transform=ax.transAxes, color=colour, fontsize=8, va="center")


def plot_claims(judged: list[tuple[Claim, Verdict]], path: str | Path) -> Path:
    """One row per claim, each with its own Δ axis since claims come in different units (%, perplexity,
    percentage points): the mean Δ with its 95% interval, 0, the paper's effect and, for equal claims, the
    ±margin band, coloured by verdict. Headline claims are labelled in bold."""
    from matplotlib.lines import Line2D  # matplotlib, only when a report draws
    from matplotlib.patches import Patch

    fig, axes = new_figure(len(judged), 1, figsize=(9, 0.4 + 0.75 * len(judged)), squeeze=False)
    for ax, (claim, v) in zip(axes[:, 0], judged, strict=True):
        _plot_row(ax, claim, v)
    legend = [Line2D([], [], marker="o", color="gray", label="ours: Δ, 95% interval"),
              Line2D([], [], marker="D", color="black", mfc="none", ls="none", label="paper (our units)"),
              Patch(color="tab:blue", alpha=0.12, label="±margin"),
              *[Patch(color=c, label=verdict) for verdict, c in COLOURS.items()]]
    fig.legend(handles=legend, loc="upper center", ncol=len(legend), fontsize=7, frameon=False)
    # leave the top for the legend
    return save_figure(fig, Path(path), dpi=110, rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))
