"""Paths as people type them."""

from __future__ import annotations

import os
from pathlib import Path


def user_path(path: str | os.PathLike) -> Path:
    """Path(path) with `~` and `~user` expanded as a shell does. A `~user` naming no user stays as typed (and is
    then not found, which the caller reports), where pathlib's expanduser raises RuntimeError."""
    return Path(os.path.expanduser(path))
