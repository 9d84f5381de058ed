"""Imported into a suite's worker processes by the executors' tests: the first worker to write its checkpoint of
step $ATTNLAB_DIE_AT_STEP kills itself with SIGKILL right after, once (the file $ATTNLAB_DIE_MARK says it did);
with $ATTNLAB_FAIL_AT_STEP, every worker raises a UserError there instead; with $ATTNLAB_HOLD_AT_STEP, it writes
its pid to $ATTNLAB_DIE_MARK there and then holds the GIL for a minute (a long call that lets no other thread of
the interpreter run)."""

import ctypes
import multiprocessing
import os
import signal
from pathlib import Path

from attnlab import checkpoint
from attnlab.errors import UserError

_save = checkpoint.save_checkpoint


def save_then_die_once(run_dir, step, *args, **kwargs):
    folder = _save(run_dir, step, *args, **kwargs)
    if str(step) == os.environ.get("ATTNLAB_FAIL_AT_STEP"):
        raise UserError(f"a planted failure at step {step}")
    mark = Path(os.environ.get("ATTNLAB_DIE_MARK", ""))
    if str(step) == os.environ.get("ATTNLAB_HOLD_AT_STEP"):
        mark.write_text(str(os.getpid()))
        ctypes.PyDLL(None).sleep(60)  # libc's sleep through PyDLL, which keeps the GIL for the call
    if str(step) == os.environ.get("ATTNLAB_DIE_AT_STEP") and not mark.exists():
        mark.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return folder


if multiprocessing.parent_process() is not None:  # a worker: never the test's own process
    checkpoint.save_checkpoint = save_then_die_once
