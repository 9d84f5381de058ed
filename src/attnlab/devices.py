"""The device a command runs on, from train.device or a --device flag: auto | cpu | cuda | cuda:N."""

from __future__ import annotations

import torch

from .errors import ConfigError


def pick_device(name: str) -> torch.device:
    """auto: a GPU where CUDA has one, else the CPU; a CUDA device asked for where there is none is refused."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} but no CUDA device is available; use train.device=cpu")
    return torch.device(name)
