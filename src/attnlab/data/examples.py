"""Synthetic tasks with fixed train and test sets of (inputs, targets) from which batches are drawn."""

from __future__ import annotations

import torch

from ..errors import ConfigError

# seeds of the held-out sets, far from the training seed: validation (early stopping and learning-rate
# choice) and test (the reported accuracy) are drawn apart, so choices made on one do not fit the other
VAL_SEED_OFFSET, TEST_SEED_OFFSET = 2**30, 2**31


class FixedExamples:
    """Subclasses set ``train``, ``val`` and ``test`` to (inputs [N, T], targets [N, T]) pairs."""

    train: tuple[torch.Tensor, torch.Tensor]
    val: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]

    def examples(self, split: str):
        if split not in ("train", "val", "test"):
            raise ValueError(f"split must be train, val or test, got {split!r}")
        return getattr(self, split)

    def batch(self, split: str, batch_size: int, seq_len: int, generator: torch.Generator):
        inputs, targets = self.examples(split)
        index = torch.randint(len(inputs), (batch_size,), generator=generator)
        return inputs[index], targets[index]


def check_counts(task: str, cfg, *names: str) -> None:
    """Each named example count of a task's config is at least 1: an empty split has no batch to draw."""
    for name in names:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"data.task_options.{task}.{name}={getattr(cfg, name)} must be at least 1")
