"""Nothing attnlab reads back runs code: a checkpoint file holding a pickled object other than tensors and plain
values is refused with a one-line error, and the object's code never runs."""

import json

import pytest
import torch

from attnlab import checkpoint
from attnlab.cli import main


class Planted:
    """Unpickling this calls open(marker, "w"): code that a trusting loader would run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def train_args(text_file, tmp_path):
    return ["train", "demo", "name=run", f"out_dir={tmp_path / 'runs'}", "data.source=text", f"data.path={text_file}",
            f"data.cache_dir={tmp_path / 'cache'}", "model.d_model=32", "model.n_layers=1", "model.n_heads=4",
            "train.steps=2", "train.batch_size=4", "train.seq_len=32", "train.warmup_steps=1", "train.eval_every=2",
            "train.eval_batches=1", "train.ckpt_every=2", "--quiet"]


def plant(folder, name, marker):
    """Replace a checkpoint file with a crafted pickle and vouch for it in the manifest, as an attacker could."""
    torch.save({"step": Planted(marker)}, folder / name)
    manifest = json.loads((folder / checkpoint.MANIFEST).read_text())
    manifest["files"][name] = checkpoint._sha256(folder / name)
    (folder / checkpoint.MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("name", ["train_state.pt", "optimizer.pt"])
def test_resume_refuses_a_checkpoint_file_that_would_run_code(text_file, tmp_path, capsys, name):
    assert main(train_args(text_file, tmp_path)) == 0
    folder = tmp_path / "runs" / "run" / checkpoint.step_dir_name(2)
    marker = tmp_path / "code-ran"
    plant(folder, name, marker)
    capsys.readouterr()

    assert main([*train_args(text_file, tmp_path), "--resume", "auto"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {folder / name} holds objects other than tensors and plain values")
    assert err.count("\n") == 1 and not marker.exists()


def test_a_checkpoint_written_by_training_loads_as_tensors_and_plain_values(text_file, tmp_path):
    assert main(train_args(text_file, tmp_path)) == 0
    folder = tmp_path / "runs" / "run" / checkpoint.step_dir_name(2)
    state = checkpoint.load_state(folder / "train_state.pt")
    assert state["step"] == 2 and isinstance(state["torch_rng"], torch.Tensor)
    assert set(state["early_stopping"]) == {"best_loss", "best_step", "since_best", "mark"}
    assert "state" in checkpoint.load_state(folder / "optimizer.pt")
