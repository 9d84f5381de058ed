"""Crash safety: training killed with SIGKILL at random moments, once inside a checkpoint write, resumes
with --resume auto (the dead training's run lock released) and ends with weights bitwise equal to an
uninterrupted run."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from attnlab import checkpoint

WORKER = Path(__file__).with_name("crash_worker.py")
STEPS = 16


def overrides(text_file, tmp_path, name):
    return [f"name={name}", f"out_dir={tmp_path / 'runs'}", "data.source=text", f"data.path={text_file}",
            f"data.cache_dir={tmp_path / 'cache'}", "model.d_model=64", "model.n_layers=2", "model.n_heads=4",
            f"train.steps={STEPS}", "train.batch_size=8", "train.seq_len=64", "train.warmup_steps=2",
            "train.eval_every=100", "train.eval_batches=1", "train.log_every=1", "train.ckpt_every=2",
            "train.keep_last=2"]


def last_logged_step(run_dir: Path) -> int:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    steps = [json.loads(line)["step"] for line in lines if line.endswith("}")]
    return max(steps, default=0)


def run(args, kill_after_step=None, run_dir=None) -> int:
    """Run the worker; with kill_after_step, SIGKILL it as soon as it has logged a later step."""
    process = subprocess.Popen([sys.executable, str(WORKER), *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    if kill_after_step is not None:
        while process.poll() is None and last_logged_step(run_dir) <= kill_after_step:
            time.sleep(0.002)
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=300)
    return process.returncode


def test_sigkill_at_random_moments_then_resume_gives_the_uninterrupted_weights(text_file, tmp_path):
    assert run(overrides(text_file, tmp_path, "straight")) == 0
    crashy = overrides(text_file, tmp_path, "crashy")
    run_dir = tmp_path / "runs" / "crashy"
    rng = random.Random(0)
    first, third = rng.randint(1, 5), rng.randint(11, 14)

    assert run(crashy, kill_after_step=first, run_dir=run_dir) == -signal.SIGKILL
    holder = int((run_dir / checkpoint.LOCK).read_text())  # the lock file names the killed training ...
    with pytest.raises(ProcessLookupError):
        os.kill(holder, 0)  # ... which is gone, and so is its lock: the trainings below take the run again
    assert run(["--die-in-checkpoint", "8", *crashy]) == -signal.SIGKILL
    assert any(p.name.startswith(".step-00000008") for p in run_dir.iterdir())  # the unfinished write
    assert [s for s, _ in checkpoint.list_checkpoints(run_dir)][-1] == 6  # the last finished one survives
    assert run(crashy, kill_after_step=third, run_dir=run_dir) == -signal.SIGKILL
    assert run(crashy) == 0

    straight = load_file(tmp_path / "runs" / "straight" / checkpoint.step_dir_name(STEPS) / "model.safetensors")
    resumed = load_file(run_dir / checkpoint.step_dir_name(STEPS) / "model.safetensors")
    assert straight.keys() == resumed.keys()
    assert all((straight[k] == resumed[k]).all() for k in straight)
