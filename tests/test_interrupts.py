"""Interrupts: SIGINT or SIGTERM during training finish the current step, checkpoint it and leave; --resume auto
then ends with weights bitwise equal to an uninterrupted run."""

import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from attnlab import checkpoint
from attnlab.train import train
from test_crash import last_logged_step
from test_train import interrupt_during_step, tiny_config

STEPS = 16


def command(text_file, tmp_path, name):
    """`attnlab train` of a tiny model whose only periodic checkpoint is its last step."""
    return [sys.executable, "-m", "attnlab.cli", "train", "demo", f"name={name}", f"out_dir={tmp_path / 'runs'}",
            "data.source=text", f"data.path={text_file}", f"data.cache_dir={tmp_path / 'cache'}", "model.d_model=64",
            "model.n_layers=2", "model.n_heads=4", f"train.steps={STEPS}", "train.batch_size=8", "train.seq_len=64",
            "train.warmup_steps=2", f"train.eval_every={STEPS}", "train.eval_batches=1", "train.log_every=1",
            f"train.ckpt_every={STEPS}", "--resume", "auto", "--quiet"]


def weights(run_dir):
    return load_file(run_dir / checkpoint.step_dir_name(STEPS) / "model.safetensors")


def interrupt(text_file, tmp_path, signum) -> tuple[int, int, str, str]:
    """Train in a subprocess, send it signum after its third step; (exit status, checkpoint step, stdout, stderr)."""
    run_dir = tmp_path / "runs" / "stopped"
    process = subprocess.Popen(command(text_file, tmp_path, "stopped"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    while process.poll() is None and last_logged_step(run_dir) < 3:
        time.sleep(0.002)
    process.send_signal(signum)
    out, err = process.communicate(timeout=300)
    [(step, _)] = checkpoint.list_checkpoints(run_dir)  # the periodic one, at the last step, is not reached
    assert 3 <= step < STEPS and f"step {step}: stopped by {signum.name}" in out
    assert last_logged_step(run_dir) == step  # the step it was in was finished, and no other begun
    return process.returncode, step, out, err


def test_sigint_checkpoints_the_current_step_and_resume_gives_the_uninterrupted_weights(text_file, tmp_path):
    assert subprocess.run(command(text_file, tmp_path, "straight"), capture_output=True).returncode == 0
    status, _, _, err = interrupt(text_file, tmp_path, signal.SIGINT)
    assert status == 130 and err.strip().splitlines()[-1] == "interrupted"
    assert subprocess.run(command(text_file, tmp_path, "stopped"), capture_output=True).returncode == 0
    straight, resumed = weights(tmp_path / "runs" / "straight"), weights(tmp_path / "runs" / "stopped")
    assert straight.keys() == resumed.keys() and all((straight[k] == resumed[k]).all() for k in straight)


def test_training_gives_back_the_signal_handlers_it_found(text_file, tmp_path, monkeypatch):
    def mine(signum, frame):
        pass

    previous = {sig: signal.signal(sig, mine) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        train(tiny_config(text_file, tmp_path, "whole", steps=2), progress=False, log=lambda *_: None)
        assert signal.getsignal(signal.SIGINT) is mine and signal.getsignal(signal.SIGTERM) is mine
        interrupt_during_step(monkeypatch, 1)
        with pytest.raises(KeyboardInterrupt):
            train(tiny_config(text_file, tmp_path, "stopped", steps=2), progress=False, log=lambda *_: None)
        assert signal.getsignal(signal.SIGINT) is mine and signal.getsignal(signal.SIGTERM) is mine
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_sigterm_checkpoints_the_current_step_and_exits_with_the_terminated_status(text_file, tmp_path):
    status, _, _, err = interrupt(text_file, tmp_path, signal.SIGTERM)
    assert status == 128 + signal.SIGTERM and "Traceback" not in err
