"""Run by torchrun in the distributed tests: train the demo preset with the given overrides on every rank (resuming
the run where --resume is given), then save this rank's final weights so that the test can compare the replicas."""

import os
import sys
from pathlib import Path

import torch

from attnlab.config import load_config
from attnlab.train import train

if __name__ == "__main__":
    out, overrides = Path(sys.argv[1]), [a for a in sys.argv[2:] if a != "--resume"]
    resume = "auto" if "--resume" in sys.argv[2:] else None
    summary = train(load_config("demo", overrides), resume=resume, progress=False, log=lambda *_: None)
    torch.save(summary["model"].state_dict(), out / f"rank{os.environ['RANK']}.pt")
