"""Files that others may read as the umask allows, though written through temporary folders."""

from __future__ import annotations

import os
from pathlib import Path


def follow_umask(folder: Path) -> None:
    """Give a folder and everything in it the permissions that the umask leaves (0777 for folders and 0666 for
    files, less the umask), as files made by open() have: a temporary folder is 0700 and safetensors writes
    0600, which would keep others from loading a checkpoint, an export or a token cache that the umask lets them
    read."""
    mask = os.umask(0o077)  # POSIX reads the umask only by setting it: put it straight back
    os.umask(mask)
    for path in [folder, *folder.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)
