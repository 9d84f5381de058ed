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


def test_a_second_sigint_right_after_the_first_still_gets_the_checkpoint(text_file, tmp_path):
    """A wrapper that forwards Ctrl-C sends a second SIGINT milliseconds after the first: the first wins, the step
    it came in is finished and checkpointed, and the second only says so."""
    run_dir = tmp_path / "runs" / "stopped"
    process = subprocess.Popen(command(text_file, tmp_path, "stopped"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    while process.poll() is None and last_logged_step(run_dir) < 3:
        time.sleep(0.002)
    process.send_signal(signal.SIGINT)
    time.sleep(0.005)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=300)
    [(step, _)] = checkpoint.list_checkpoints(run_dir)
    assert process.returncode == 130 and 3 <= step < STEPS
    assert f"step {step}: stopped by SIGINT; checkpoint {checkpoint.step_dir_name(step)} written" in out
    assert last_logged_step(run_dir) == step and checkpoint.verify(run_dir / checkpoint.step_dir_name(step)) is None
    assert "already stopping: finishing the current step and writing its checkpoint" in err
    assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err


def test_a_signal_during_the_checkpoint_write_waits_for_it(text_file, tmp_path, monkeypatch):
    import os

    interrupt_during_step(monkeypatch, 2)
    save, writes = checkpoint.save_checkpoint, []

    def interrupted_save(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C again, while the checkpoint of the first is being written
        writes.append(save(*args, **kwargs))
        return writes[-1]

    monkeypatch.setattr(checkpoint, "save_checkpoint", interrupted_save)
    lines = []
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(text_file, tmp_path, "stopped", steps=6), progress=False, log=lines.append)
    run_dir = tmp_path / "runs" / "stopped"
    assert [p.name for p in writes] == ["step-00000002"] and checkpoint.verify(writes[0]) is None
    assert checkpoint.latest_checkpoint(run_dir).name == "step-00000002"
    assert lines[-1] == "step 2: stopped by SIGINT; checkpoint step-00000002 written, continue with --resume auto"


def test_a_run_interrupted_before_its_first_step_says_no_checkpoint_was_written(text_file, tmp_path, monkeypatch):
    import attnlab.train as train_module

    def interrupted_load(*args):
        raise KeyboardInterrupt  # Ctrl-C while the corpus is prepared (a BPE trained, a large file read)

    monkeypatch.setattr(train_module, "load_data", interrupted_load)
    lines = []
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(text_file, tmp_path, "stopped"), progress=False, log=lines.append)
    assert lines[-1] == "interrupted during the set-up, before the first step: no checkpoint was written"
    assert not (tmp_path / "runs").exists()
