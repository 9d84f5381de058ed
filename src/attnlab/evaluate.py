"""Evaluation: mean next-token loss and perplexity on a corpus split."""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch

EVAL_SEED = 20240531  # every evaluation of a run reads the same windows


@torch.no_grad()
def split_loss(model, corpus, split: str, batches: int, batch_size: int, seq_len: int, device,
               autocast=nullcontext) -> float:
    """Mean cross-entropy (nats per token) over `batches` fixed random windows of the split."""
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(EVAL_SEED)
    total = 0.0
    for _ in range(batches):
        x, y = corpus.batch(split, batch_size, seq_len, generator)
        with autocast():
            total += model.loss(x.to(device), y.to(device)).item()
    model.train(was_training)
    return total / batches


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 700.0))
