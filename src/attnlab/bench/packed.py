"""Packed documents against plain windows: every mixer's training step on whole documents laid end to end. One
packed row holds them with their starts, as data.pack=true trains, against the same tokens as plain rows."""

from __future__ import annotations

import math
import statistics

import torch

from ..config import ModelConfig
from ..errors import UserError
from ..model import Decoder
from ..timing import paired_ratio, round_robin_times
from .mixers import contenders
from .models import adamw_step

PACKED_GOAL = 1.2  # a packed step takes at most this many times an unpacked one of the same tokens


def document_starts(batch: int, seq_len: int, shortest: int, longest: int, seed: int = 0) -> torch.Tensor:
    """cu_seqlens of `batch` rows of seq_len tokens laid end to end, each filled with documents whose lengths are
    drawn log-uniformly between shortest and longest tokens (a web corpus's spread), the last one of a row cut at
    its end."""
    g = torch.Generator().manual_seed(seed)
    starts = [0]
    for row in range(batch):
        end, at = (row + 1) * seq_len, starts[-1]
        while at < end:
            u = float(torch.rand((), generator=g))
            at = min(end, at + round(math.exp(math.log(shortest) + u * (math.log(longest) - math.log(shortest)))))
            starts.append(at)
    return torch.tensor(starts)


def bench_packed(seq_len: int = 512, batch: int = 8, d_model: int = 128, n_layers: int = 2, n_heads: int = 4,
                 vocab: int = 256, repeats: int = 3, log=print) -> dict:
    """{label: {packed_ms, unpacked_ms, x_unpacked, documents}}: AdamW steps of a decoder of each mixer on
    batch rows of seq_len tokens, plain and as packed documents of seq_len / 8 to 2 seq_len tokens, timed in
    turns; x_unpacked is the median over rounds of the paired ratio."""
    cu_seqlens = document_starts(batch, seq_len, max(1, seq_len // 8), 2 * seq_len)
    documents = len(cu_seqlens) - 1
    log(f"packed documents: {batch} rows of {seq_len} tokens as {documents} documents of {seq_len // 8} to "
        f"{2 * seq_len} tokens (one packed row) against plain rows; AdamW steps of a decoder of d_model {d_model}, "
        f"{n_layers} layers, {torch.get_num_threads()} threads, median of {repeats}")
    log(f"{'mixer':<30} {'plain ms':>9} {'packed ms':>10} {'x plain':>8}")
    tokens = torch.randint(vocab, (batch, seq_len + 1), generator=torch.Generator().manual_seed(0))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    last = cu_seqlens[1:] - 1  # a document's last token predicts nothing across its boundary
    packed_targets = targets.reshape(1, -1).clone()
    packed_targets[0, last] = -100
    results = {}
    for label, name, options in contenders():
        torch.manual_seed(0)
        cfg = ModelConfig(vocab_size=vocab, d_model=d_model, n_layers=n_layers, n_heads=n_heads, layers=[name],
                          mixer_options={name: options} if options else {})
        model = Decoder(cfg)
        tasks = {"plain": adamw_step(model, lambda m=model: m.loss(inputs, targets)),
                 "packed": adamw_step(model, lambda m=model: m.loss(inputs.reshape(1, -1), packed_targets,
                                                                     cu_seqlens))}
        try:
            times = round_robin_times(tasks, repeats)
        except UserError as err:  # e.g. a mixer with an exact window, past it: the others still run
            log(f"{label:<30} not run: {str(err).split(';')[0]}")
            continue
        plain, packed = (1e3 * statistics.median(times[form]) for form in ("plain", "packed"))
        row = {"plain_ms": plain, "packed_ms": packed, "x_plain": paired_ratio(times, "packed", "plain"),
               "documents": documents}
        results[label] = row
        log(f"{label:<30} {row['plain_ms']:>9.1f} {row['packed_ms']:>10.1f} {row['x_plain']:>8.2f}")
    return results
