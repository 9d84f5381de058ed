"""Synthetic tasks with fixed train and test sets of (inputs, targets) from which batches are drawn."""

from __future__ import annotations

import torch


class FixedExamples:
    """Subclasses set ``train`` and ``test`` to (inputs [N, T], targets [N, T]) pairs."""

    train: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]

    def examples(self, split: str):
        if split not in ("train", "val", "test"):
            raise ValueError(f"split must be train, val or test, got {split!r}")
        return self.train if split == "train" else self.test

    def batch(self, split: str, batch_size: int, seq_len: int, generator: torch.Generator):
        inputs, targets = self.examples(split)
        index = torch.randint(len(inputs), (batch_size,), generator=generator)
        return inputs[index], targets[index]
