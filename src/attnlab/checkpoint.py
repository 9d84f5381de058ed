"""Checkpoints: ``<run>/step-XXXXXXXX/`` folders written atomically and verified by a manifest.

A checkpoint is first written to a hidden temporary folder; its ``manifest.json`` (SHA-256 of every
file) is written last, and only then is the folder renamed into place. A folder without a manifest or
whose files do not match it is incomplete or corrupt and is never loaded or counted. While a training writes
a run folder it holds the folder's lock (``run_lock``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pickle
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_model, save_model

from .errors import UserError
from .paths import user_path
from .permissions import follow_umask

STEP_DIR = re.compile(r"^step-(\d{8})$")
MANIFEST = "manifest.json"
BEST = "best.json"  # {"step", "val_loss"} of the best checkpoint, written by training with early stopping
LOCK = ".lock"  # held by the training that writes the run folder; names its pid


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: Path, step: int, model, optimizer, train_state: dict, config: dict,
                    tokenizer: dict) -> Path:
    """Write everything needed to continue training bit for bit; returns the final folder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    final = run_dir / step_dir_name(step)
    tmp = Path(tempfile.mkdtemp(dir=run_dir, prefix=f".{final.name}-"))
    try:
        save_model(model, str(tmp / "model.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(train_state, tmp / "train_state.pt")
        (tmp / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (tmp / "tokenizer.json").write_text(json.dumps(tokenizer))
        files = sorted(p.name for p in tmp.iterdir())
        for name in files:
            with open(tmp / name, "rb") as f:
                os.fsync(f.fileno())
        manifest = {"step": step, "files": {name: _sha256(tmp / name) for name in files}}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        follow_umask(tmp)
        _fsync_dir(tmp)
        if final.exists():  # a stale or corrupt folder from an earlier, interrupted run
            stale = run_dir / f".stale-{final.name}-{os.getpid()}"
            os.replace(final, stale)
            shutil.rmtree(stale)
        os.replace(tmp, final)
        _fsync_dir(run_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold the run folder's lock, made if need be, while the block runs: fcntl.flock on <run>/.lock, which the
    kernel releases when the process ends, however it ends, so a crash or SIGKILL leaves no stale lock. A
    second holder is refused with the first one's pid. A folder made here that holds only the lock at the end
    (the start failed before writing anything) is removed again, with the folders made for it (out_dir)."""
    made = [folder for folder in (run_dir, *run_dir.parents) if not folder.exists()]
    fd = _lock(run_dir)
    try:
        yield
    finally:
        if made and run_dir.is_dir() and [p.name for p in run_dir.iterdir()] == [LOCK]:
            (run_dir / LOCK).unlink()
            for folder in made:  # innermost first; one that something else wrote in stays
                try:
                    folder.rmdir()
                except OSError:
                    break
        os.close(fd)


def _lock(run_dir: Path) -> int:
    """The open, locked and pid-stamped lock file of run_dir."""
    path = run_dir / LOCK
    while True:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise UserError(f"{run_dir} is in use by another training (pid {holder}); choose another name= or "
                            "wait for it to finish") from None
        if _is_open_file(fd, path):
            break
        os.close(fd)  # a failed start removed the file we locked, after we opened it: lock the new one
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def _is_open_file(fd: int, path: Path) -> bool:
    try:
        found, opened = path.stat(), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (found.st_dev, found.st_ino) == (opened.st_dev, opened.st_ino)


def verify(folder: Path) -> str | None:
    """None if the checkpoint is complete and intact, else the reason it is not."""
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        return "no manifest (the write did not finish)"
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError:
        return "unreadable manifest"
    for name, digest in manifest["files"].items():
        if not (folder / name).is_file():
            return f"{name} is missing"
        if _sha256(folder / name) != digest:
            return f"{name} does not match its checksum"
    return None


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """All step folders of a run, oldest first, whether intact or not."""
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(found)


def latest_checkpoint(run_dir: Path, warn=print) -> Path | None:
    """The newest intact checkpoint; damaged newer ones are reported and skipped."""
    for _, folder in reversed(list_checkpoints(run_dir)):
        problem = verify(folder)
        if problem is None:
            return folder
        warn(f"skipping checkpoint {folder}: {problem}")
    return None


def prune_checkpoints(run_dir: Path, keep_last: int) -> None:
    """Delete intact checkpoints beyond the newest keep_last, except the best one; damaged ones are left
    for inspection."""
    if keep_last <= 0:
        return
    best = best_checkpoint(run_dir)
    intact = [folder for _, folder in list_checkpoints(run_dir) if verify(folder) is None]
    for folder in intact[:-keep_last]:
        if folder != best:
            shutil.rmtree(folder)


def mark_best(run_dir: Path, step: int, val_loss: float) -> None:
    """Record the checkpoint of `step` as the run's best (the lowest validation loss of its trajectory)."""
    tmp = run_dir / f".{BEST}.tmp"
    tmp.write_text(json.dumps({"step": step, "val_loss": val_loss}))
    os.replace(tmp, run_dir / BEST)


def best_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint marked best by early stopping, if there is one and it is intact."""
    path = run_dir / BEST
    if not path.is_file():
        return None
    folder = run_dir / step_dir_name(json.loads(path.read_text())["step"])
    return folder if folder.is_dir() and verify(folder) is None else None


def resolve_checkpoint(path: str | Path, best: bool = True) -> Path:
    """A checkpoint folder, or a run folder: its best checkpoint if it trained with early stopping
    (train.patience) and best is set, else its newest intact one."""
    path = user_path(path)
    if STEP_DIR.match(path.name):
        problem = verify(path) if path.is_dir() else "it does not exist"
        if problem:
            raise UserError(f"checkpoint {path} cannot be used: {problem}")
        return path
    if not path.is_dir():
        raise UserError(f"{path} is neither a run folder nor a checkpoint folder (runs/<name>/step-XXXXXXXX)")
    found = (best and best_checkpoint(path)) or latest_checkpoint(path)
    if found is None:
        raise UserError(f"{path} holds no intact checkpoint")
    return found


def load_weights(model, folder: Path) -> None:
    missing, unexpected = load_model(model, str(folder / "model.safetensors"), strict=False)
    if missing or unexpected:
        raise UserError(f"checkpoint {folder} does not fit this model (missing {missing}, unexpected {unexpected})")


def load_state(path: Path, device=None) -> dict:
    """optimizer.pt or train_state.pt: tensors and plain values only (RNG states are tensors), read without
    unpickling anything else, so a crafted file cannot run code."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        raise UserError(f"{path} holds objects other than tensors and plain values, which attnlab never writes, so "
                        "it was not loaded; resume from another checkpoint or start a new run (name=...)") from None


def load_config(folder: Path) -> dict:
    return yaml.safe_load((folder / "config.yaml").read_text())


def load_tokenizer_dict(folder: Path) -> dict:
    return json.loads((folder / "tokenizer.json").read_text())
