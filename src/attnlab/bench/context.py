"""Context parallelism's traffic: the bytes a rank sends in one training step, against the sequence length. The step
is forward and backward through a decoder whose sequences are split across two gloo ranks, for every mixer that
splits.

A recurrent mixer exchanges each shard's affine transition (M, U) once, whatever the shard's length, so its traffic
is flat; attention gathers the keys and values of every shard, so its traffic grows with the length; a halo (a short
convolution's last inputs, a sliding window's last keys) adds a fixed amount. The collectives are counted as they
are called (every tensor a rank hands to all_gather or all_reduce), on the CPU: the count is the algorithm's, not a
network's.
"""

from __future__ import annotations

import socket
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .. import plugins
from ..config import ModelConfig
from ..mixers import mixer_class
from ..model import Decoder, next_token_loss
from ..ops.cp import Context
from .mixers import contenders

RANKS = 2
GROWS = 1.5  # traffic that grows by more than this factor over the lengths measured is "grows", else "flat"


@contextmanager
def counted_collectives(sent: list[int]):
    """all_gather and all_reduce as they are, each adding the bytes of the tensor this rank hands it to sent[0]."""
    originals = dist.all_gather, dist.all_reduce

    def all_gather(outputs, tensor, *args, **kwargs):
        sent[0] += tensor.numel() * tensor.element_size()
        return originals[0](outputs, tensor, *args, **kwargs)

    def all_reduce(tensor, *args, **kwargs):
        sent[0] += tensor.numel() * tensor.element_size()
        return originals[1](tensor, *args, **kwargs)

    dist.all_gather, dist.all_reduce = all_gather, all_reduce
    try:
        yield
    finally:
        dist.all_gather, dist.all_reduce = originals


def _splitting(lengths: list[int], d_model: int, n_heads: int) -> tuple[list[tuple[str, str, dict]], dict]:
    """The contenders whose mixer splits a sequence across ranks at these lengths, and {label: why not} for those
    that split but not at these lengths (a read limit below the longest, a halo longer than the shortest shard)."""
    found, skipped = [], {}
    for label, name, options in contenders():
        cfg = ModelConfig(vocab_size=2, d_model=d_model, n_layers=1, n_heads=n_heads, mixer=name,
                          mixer_options={name: options} if options else {})
        mixer = Decoder(cfg).blocks[0].mixer
        if not mixer.splits:
            continue
        limit, halo, shard = mixer.cfg.read_limit, mixer.cfg.halo, min(lengths) // RANKS
        if limit is not None and limit[0] < max(lengths):
            skipped[label] = f"reads at most {limit[0]} tokens ({limit[1]})"
        elif halo is not None and halo[0] > shard:
            skipped[label] = f"a shard of {shard} tokens is shorter than the {halo[0]} its {halo[1]} reads across"
        else:
            found.append((label, name, options))
    return found, skipped


def _rank(rank: int, port: int, cases: list, lengths: list[int], d_model: int, n_layers: int, n_heads: int,
          out: dict, sources: list[str]) -> None:
    for source in sources:  # a plugin's mixer, registered in this new process as in the one that chose the cases
        plugins.import_plugin(source, "the context benchmark's ranks")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS)
    torch.set_num_threads(1)
    try:
        for label, name, options in cases:
            torch.manual_seed(0)
            cfg = ModelConfig(vocab_size=256, d_model=d_model, n_layers=n_layers, n_heads=n_heads, mixer=name,
                              mixer_options={name: options} if options else {})
            model = Decoder(cfg)
            for length in lengths:
                shard = length // RANKS
                tokens = torch.randint(256, (1, shard + 1), generator=torch.Generator().manual_seed(rank))
                sent = [0]
                with counted_collectives(sent):
                    logits, _ = model(tokens[:, :-1], keep_states=False, context=Context())
                    next_token_loss(logits, tokens[:, 1:]).backward()
                out[label, length, rank] = sent[0]
    finally:
        dist.destroy_process_group()


def bench_context(lengths: list[int], d_model: int = 64, n_layers: int = 2, n_heads: int = 4, log=print) -> dict:
    """{label: {length: bytes a rank sends in one step, ..., "trend": "flat" | "grows"}} on two gloo ranks."""
    with socket.socket() as s:  # a free port for the ranks to meet
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cases, skipped = _splitting(lengths, d_model, n_heads)
    sources = sorted({source for _, name, _ in cases if (source := plugins.source_of(mixer_class(name)))})
    out = mp.Manager().dict()
    mp.spawn(_rank, args=(port, cases, lengths, d_model, n_layers, n_heads, out, sources), nprocs=RANKS)
    labels = list(dict.fromkeys(label for label, _, _ in out.keys()))
    log(f"context parallelism on {RANKS} gloo ranks: KiB a rank sends in one training step (forward and backward) of "
        f"a decoder of d_model {d_model}, {n_layers} layers, one sequence split in {RANKS}")
    log(f"{'mixer':<26}" + "".join(f"{f'T={n}':>12}" for n in lengths) + f"{'':>3}trend")
    results = {}
    for label in labels:
        sent = {n: max(out[label, n, r] for r in range(RANKS)) for n in lengths}
        trend = "grows" if sent[lengths[-1]] > GROWS * sent[lengths[0]] else "flat"
        results[label] = {**sent, "trend": trend}
        log(f"{label:<26}" + "".join(f"{sent[n] / 1024:>12,.1f}" for n in lengths) + f"{'':>3}{trend}")
    for label, why in skipped.items():
        log(f"{label:<26}not measured: {why}")
    return results
