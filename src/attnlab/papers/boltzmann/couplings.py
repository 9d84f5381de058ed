"""What Boltzmann attention learned: the couplings J by distance (the paper's Fig. 2). They are the suite's
`couplings` metric and the command `attnlab couplings RUN`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ...arguments import RUN, check_folder
from ...lab.forward_passes import no_passes
from ...lab.metrics import Curve, Metric

if TYPE_CHECKING:
    import torch

    from ...lab.spec import Experiment


def coupling_profile(J: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation of J_jk over the pairs at each distance d = k - j = 1..W-1.

    J [..., W, W] (the strict upper triangle is used; leading dimensions, e.g. heads or seeds, are pooled).
    """
    import torch

    W = J.shape[-1]
    means, stds = [], []
    for d in range(1, W):
        values = torch.diagonal(J, offset=d, dim1=-2, dim2=-1).flatten()
        means.append(values.mean())
        stds.append(values.std(correction=0))
    return torch.stack(means), torch.stack(stds)


def plot_couplings(J: torch.Tensor, path: str | Path, title: str = "learned couplings J") -> Path:
    """Write a PNG with the (pooled) coupling matrix and its profile over distance; returns the path."""
    import torch

    from ...plots import new_figure, save_figure

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


def layer_couplings(model) -> list[tuple[int, torch.Tensor]]:
    """(layer, J [heads, window, window]) of every Boltzmann layer with pair couplings."""
    return [(i, block.mixer.coupling_matrix(block.mixer.cfg.window)) for i, block in enumerate(model.blocks)
            if block.mixer.name == "boltzmann" and block.mixer.J is not None]


def learned_couplings(experiment: Experiment, run_dir: Path) -> dict:
    """Mean J by distance |j - k|, pooled over layers, heads and pairs ("J@<distance>")."""
    import torch

    from ...inference import load_run

    J = torch.cat([J.detach() for _, J in layer_couplings(load_run(run_dir).model)])
    mean, _ = coupling_profile(J)
    return {f"J@{d}": value for d, value in enumerate(mean.tolist(), start=1)}


METRIC = Metric("couplings", learned_couplings, curve=Curve("distance |j - k|", "mean J", log_x=False, zero_line=True),
                passes=no_passes)


def inspect_couplings(args) -> None:
    """`attnlab couplings RUN`: each Boltzmann layer's learned J, as its mean by distance (printed) and a heat
    map with the profile (PNG)."""
    from ...errors import UserError
    from ...inference import load_run

    run = load_run(args.checkpoint)
    layers = layer_couplings(run.model)
    for i, J in layers:
        mean, std = coupling_profile(J)
        print(f"layer {i}: mean J by distance |j - k| (+- std over pairs and heads)")
        for d, (m, s) in enumerate(zip(mean.tolist(), std.tolist(), strict=True), start=1):
            print(f"  {d:>3}  {m:+.4f} +- {s:.4f}")
        path = Path(args.out or run.folder.parent) / f"couplings-layer{i}.png"
        print(f"  figure: {plot_couplings(J, path, title=f'learned J, layer {i}')}")
    if not layers:
        raise UserError(f"{run.folder} has no Boltzmann layer with couplings J")


def add_parser(sub) -> None:
    p = sub.add_parser("couplings", help="a Boltzmann model's learned J: profile over distance and heat map")
    p.add_argument("checkpoint", help=RUN)
    p.add_argument("--out", help="folder for the PNG files (default: the run folder)")
    p.set_defaults(func=inspect_couplings, check=lambda args: check_folder(args.out, "--out"))
