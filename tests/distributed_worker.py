"""Run by torchrun in the distributed tests: train the demo preset with the given overrides on every rank (resuming
the run where --resume is given; dying right after the checkpoint of step N where --die-after=N is), then save this
rank's final weights so that the test can compare the replicas."""

import os
import sys
from pathlib import Path

import torch

from attnlab import checkpoint
from attnlab.config import load_config
from attnlab.train import train


def die_after(step: int) -> None:
    """The process (rank 0, which writes the checkpoints) ends at once after writing the one of this step."""
    save = checkpoint.save_checkpoint

    def save_then_die(run_dir, at, *args, **kwargs):
        folder = save(run_dir, at, *args, **kwargs)
        if at == step:
            os._exit(3)
        return folder

    checkpoint.save_checkpoint = save_then_die


if __name__ == "__main__":
    flags = [a for a in sys.argv[2:] if a.startswith("--")]
    out, overrides = Path(sys.argv[1]), [a for a in sys.argv[2:] if not a.startswith("--")]
    for flag in flags:
        if flag.startswith("--die-after="):
            die_after(int(flag.split("=")[1]))
    resume = "auto" if "--resume" in flags else None
    summary = train(load_config("demo", overrides), resume=resume, progress=False, log=lambda *_: None)
    torch.save(summary["model"].state_dict(), out / f"rank{os.environ['RANK']}.pt")
