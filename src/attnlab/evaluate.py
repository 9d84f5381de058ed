"""Evaluation: mean next-token loss and perplexity on a corpus split."""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch

from .data.corpus import IGNORE, packed_rows
from .data.examples import FixedExamples

EVAL_SEED = 20240531  # every evaluation of a run reads the same windows


def to_device(batch: torch.Tensor, device) -> torch.Tensor:
    """A CPU batch on the device; to a GPU through pinned memory, without waiting for the copy."""
    if device is None or torch.device(device).type != "cuda":
        return batch.to(device)
    return batch.pin_memory().to(device, non_blocking=True)


@torch.no_grad()
def split_loss(model, corpus, split: str, batches: int, batch_size: int, seq_len: int, device,
               autocast=nullcontext, chunk: int | None = None, packed: bool = False) -> float:
    """Mean cross-entropy (nats per scored token) on a corpus split: over `batches` x `batch_size` fixed random
    windows of seq_len tokens, or, with batches = 0, over every position of the split once (whole_split_loss;
    a task of fixed examples: every example of the split once).
    packed: rows of whole documents instead of windows, each document read from its start and no target
    predicted across a boundary. The rows are evaluated `chunk` at a time (default batch_size), which changes
    the memory it takes, not the number: it does not depend on how training splits its batch into micro-batches."""
    chunk = chunk or batch_size
    if packed:
        rows = (corpus.packed_split(split, seq_len) if batches == 0 else
                corpus.packed_batch(split, batches * batch_size, seq_len, torch.Generator().manual_seed(EVAL_SEED)))
        return _mean_loss(model, _packed_chunks(*rows, chunk), device, autocast, chunk=1)
    if batches == 0 and isinstance(corpus, FixedExamples):
        return _mean_loss(model, [corpus.examples(split)], device, autocast, chunk)
    if batches == 0:
        return whole_split_loss(model, corpus, split, seq_len, device, autocast, chunk)
    generator = torch.Generator().manual_seed(EVAL_SEED)
    x, y = corpus.batch(split, batches * batch_size, seq_len, generator)
    return _mean_loss(model, [(x, y)], device, autocast, chunk)


def _packed_chunks(x, y, cu_seqlens, chunk: int):
    """Packed rows `chunk` at a time, each chunk one packed row with its boundaries."""
    return [packed_rows(x, y, cu_seqlens, slice(lo, lo + chunk)) for lo in range(0, len(x), chunk)]


@torch.no_grad()
def whole_split_loss(model, corpus, split: str, seq_len: int, device, autocast=nullcontext,
                     chunk: int = 64) -> float:
    """Mean cross-entropy over every position of the split that has a predecessor, each scored once: the
    split cut into consecutive windows of seq_len tokens (each read from a fresh state, as in training), the
    last one shorter if the split does not divide evenly."""
    data = corpus.split(split)
    full = (len(data) - 1) // seq_len
    if full == 0:
        raise ValueError(f"the {split} split has {len(data)} tokens, fewer than one window of {seq_len}")
    tokens = torch.from_numpy(data[: full * seq_len + 1].astype("int64"))
    windows = [(tokens[:-1].view(full, seq_len), tokens[1:].view(full, seq_len))]
    tail = len(data) - 1 - full * seq_len
    if tail:
        rest = torch.from_numpy(data[full * seq_len :].astype("int64"))[None]
        windows.append((rest[:, :-1], rest[:, 1:]))
    return _mean_loss(model, windows, device, autocast, chunk)


@torch.no_grad()
def block_losses(model, corpus, split: str, seq_len: int, device, blocks: int, chunk: int = 64) -> list[float]:
    """The mean cross-entropy of each of `blocks` consecutive runs of the split's full windows of seq_len tokens
    (each window from a fresh state, as whole_split_loss reads them; the shorter tail window is left out): what
    a bootstrap over the validation tokens resamples, keeping neighbouring tokens together."""
    data = corpus.split(split)
    full = (len(data) - 1) // seq_len
    if full < blocks:
        raise ValueError(f"the {split} split has {full} windows of {seq_len}, fewer than {blocks} blocks")
    tokens = torch.from_numpy(data[: full * seq_len + 1].astype("int64"))
    x, y = tokens[:-1].view(full, seq_len), tokens[1:].view(full, seq_len)
    was_training = model.training
    model.eval()
    per_window = []
    for lo in range(0, full, chunk):
        logits, _ = model(to_device(x[lo : lo + chunk], device), keep_states=False)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 up to fp32, fp64 kept
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), to_device(y[lo : lo + chunk], device).flatten(),
                                                 reduction="none")
        per_window.append(loss.view(-1, seq_len).double().mean(1).cpu())
    model.train(was_training)
    return [block.mean().item() for block in torch.cat(per_window).tensor_split(blocks)]


def scored_positions(corpus, split: str = "val", packed: bool = False) -> int:
    """How many positions split_loss scores over the whole split: every token of the split but the first, or,
    packed, every token but the first of each document; for a task of fixed examples, their scored targets."""
    if isinstance(corpus, FixedExamples):
        return int((corpus.examples(split)[1] != IGNORE).sum())
    documents = len(corpus.document_bounds(split)) - 1 if packed else 1
    return len(corpus.split(split)) - documents


def _mean_loss(model, batches, device, autocast, chunk: int) -> float:
    """The mean loss per scored target (targets of -100 are not) over (inputs, targets[, cu_seqlens]) batches,
    evaluated `chunk` rows at a time (a packed batch is one row)."""
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=device, dtype=torch.float64)  # summed on the device: one host sync at the end
    count = torch.zeros((), device=device, dtype=torch.int64)
    for x, y, *packed in batches:
        cu_seqlens = packed[0].to(device) if packed else None
        for lo in range(0, len(x), chunk):
            xs, ys = to_device(x[lo : lo + chunk], device), to_device(y[lo : lo + chunk], device)
            scored = (ys != IGNORE).sum()
            with autocast():
                loss = model.loss(xs, ys, cu_seqlens)
            # the mean over scored targets, weighted by their number (a chunk of padding alone scores none)
            total += torch.where(scored > 0, loss.double() * scored, 0.0)
            count += scored
    model.train(was_training)
    return total.item() / count.item()


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 700.0))


@torch.no_grad()
def accuracy(model, inputs: torch.Tensor, targets: torch.Tensor, device=None, batch_size: int = 256) -> float:
    """Fraction of scored positions (targets != -100) whose argmax prediction equals the target."""
    model.eval()
    correct = total = 0
    for lo in range(0, len(inputs), batch_size):
        x, y = to_device(inputs[lo : lo + batch_size], device), to_device(targets[lo : lo + batch_size], device)
        logits, _ = model(x)
        scored = y != -100
        correct += (logits.argmax(-1)[scored] == y[scored]).sum()  # on the device: no host sync per batch
        total += scored.sum()
    return int(correct) / max(int(total), 1)


def task_accuracy(model, data, device=None) -> dict:
    """Test accuracy of a synthetic task: overall and on each of its test slices where it has them (MQAR's per
    number of key-value pairs, a word problem's at longer lengths), named by its slice_label. A slice longer than
    the model can read (its learned positions, a window: Decoder.read_limit) is left out."""
    result = {"accuracy": accuracy(model, *data.test, device=device)}
    limit = model.read_limit()
    for key, (x, y) in getattr(data, "slices", {}).items():
        if limit is None or x.shape[1] <= limit[0]:
            result[data.slice_label.format(key)] = accuracy(model, x, y, device=device)
    return result


@torch.no_grad()
def perplexity_by_length(model, corpus, lengths, max_tokens: int | None = 65_536, device=None, split: str = "val"
                         ) -> dict:
    """Perplexity on non-overlapping windows of each length (each window from a fresh state), using at
    most max_tokens tokens of the split per length (None: every window): exp of the token-weighted mean
    cross-entropy."""
    model.eval()
    data = corpus.split(split)
    result = {}
    for length in lengths:
        windows = (len(data) - 1) // length
        if max_tokens is not None:
            windows = min(windows, max(1, max_tokens // length))
        if windows == 0:
            raise ValueError(f"the {split} split has {len(data)} tokens, fewer than one window of {length}")
        total = torch.zeros((), device=device)
        for w in range(windows):
            window = torch.from_numpy(data[w * length : w * length + length + 1].astype("int64"))[None]
            chunk = to_device(window, device)
            total += model.loss(chunk[:, :-1], chunk[:, 1:]).float()
        result[length] = perplexity(total.item() / windows)  # every window has the same length
    return result
