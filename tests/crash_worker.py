"""Run as a subprocess by the crash-safety test: train (resuming from the newest intact checkpoint) with
the given overrides; with --die-in-checkpoint N, kill itself with SIGKILL in the middle of writing the
checkpoint of step N (its files and manifest written, the folder not yet in place)."""

import os
import signal
import sys

from attnlab import checkpoint
from attnlab.config import load_config
from attnlab.train import train

if __name__ == "__main__":
    args = sys.argv[1:]
    if args[0] == "--die-in-checkpoint":
        step, args = int(args[1]), args[2:]
        write = checkpoint.save_checkpoint

        def save_and_die(run_dir, at_step, *rest, **kwargs):
            if at_step == step:
                checkpoint._fsync_dir = lambda path: os.kill(os.getpid(), signal.SIGKILL)
            return write(run_dir, at_step, *rest, **kwargs)

        checkpoint.save_checkpoint = save_and_die
    train(load_config("demo", args), resume="auto", progress=False, log=lambda *_: None)
