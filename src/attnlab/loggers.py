"""Sinks that receive the scalars of metrics.jsonl as they are written (``train.log_to``): TensorBoard and Weights &
Biases. TensorBoard's event files go under runs/<name>/tensorboard/, and a Weights & Biases run under
runs/<name>/wandb/. Each also records the run's config. Their packages are optional (``pip install 'attnlab[log]'``)
and imported only when asked for."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from .errors import ConfigError

SINKS = ("tensorboard", "wandb")
# the fields of a metrics.jsonl record that are measurements; step is the x axis, the rest are notes
SCALARS = ("loss", "lr", "tokens_per_s", "grad_norm", "val_loss", "val_ppl")


def open_sinks(names: list[str], run_dir: Path, config: dict, resume_step: int | None) -> list:
    """One open sink per name; resume_step (None for a fresh run) is the checkpoint's step, after which
    anything an earlier attempt logged is superseded, as in metrics.jsonl."""
    for name in names:  # each sink is named after its package; all are checked before any writes a file
        try:
            __import__(name)
        except ImportError:
            fix = "pip install 'attnlab[log]'"
            raise ConfigError(f"train.log_to lists {name} but it is not installed; {fix}") from None
    kinds = {"tensorboard": TensorBoardSink, "wandb": WandbSink}
    return [kinds[name](run_dir, config, resume_step) for name in names]


def flat(config: dict, prefix: str = "") -> dict:
    """{"model.d_model": 128, ...}: hyperparameter tables take one level of plain values."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[prefix + key] = value if isinstance(value, (bool, int, float, str)) else json.dumps(value)
    return out


class TensorBoardSink:
    def __init__(self, run_dir: Path, config: dict, resume_step: int | None):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        # purge_step hides the steps after the checkpoint that an interrupted attempt had already logged
        purge = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge)
        step = resume_step or 0  # a resumed run records the config it continues with, at the step it starts from
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```", step)
        for summary in hparams(flat(config), {}):  # the HPARAMS tab; add_hparams would open a second run folder
            self.writer.file_writer.add_summary(summary, step)

    def write(self, step: int, scalars: dict) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, run_dir: Path, config: dict, resume_step: int | None):
        import wandb

        # offline unless an API key says the user means to upload; `wandb sync` sends an offline run later
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        folder = run_dir / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        # a resumed run continues the same W&B run: its id is kept in the run folder
        id_file = folder / "run-id"
        if resume_step is None or not id_file.exists():
            id_file.write_text(uuid.uuid4().hex[:16])
        self.run = wandb.init(project="attnlab", name=run_dir.name, id=id_file.read_text(), resume="allow",
                              dir=str(run_dir), config=config, mode=mode)

    def write(self, step: int, scalars: dict) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()
