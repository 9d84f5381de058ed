"""Run by torchrun in the distributed tests: train the demo preset with the given overrides on every rank,
then save this rank's final weights so that the test can compare the replicas."""

import os
import sys
from pathlib import Path

import torch

from attnlab.config import load_config
from attnlab.train import train

if __name__ == "__main__":
    out, overrides = Path(sys.argv[1]), sys.argv[2:]
    summary = train(load_config("demo", overrides), progress=False, log=lambda *_: None)
    torch.save(summary["model"].state_dict(), out / f"rank{os.environ['RANK']}.pt")
