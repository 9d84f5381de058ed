"""Training on several processes with PyTorch's own engine. `torchrun` sets RANK, WORLD_SIZE and
LOCAL_RANK; we join the process group (NCCL on CUDA, gloo on CPU), replicate the model with DDP or shard
it with FSDP (train.fsdp=true), give each rank its slice of every batch, and let rank 0 alone log and
write checkpoints. Checkpoints always hold the full, unsharded state in the single-process format, so a
run resumes with any number of ranks that divides its batch. A refusal during the set-up is said once, by
rank 0 (``refusals_once``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from .errors import UserError

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass
class Ranks:
    rank: int = 0
    world: int = 1
    device: torch.device | None = None  # None: a single process picks its own device
    sharded: bool = False
    # context parallelism: each group of `context` consecutive ranks holds one set of rows of the batch, every
    # sequence split along time across the group (its shard: rank % context)
    context: int = 1
    context_group: object = None

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def data_rank(self) -> int:
        return self.rank // self.context

    @property
    def data_world(self) -> int:
        return self.world // self.context

    def split_sequences(self, context: int) -> None:
        """Group the ranks `context` at a time, each group splitting its sequences along time (every rank makes
        every group, as torch.distributed.new_group requires)."""
        self.context = context
        if context > 1:
            for first in range(0, self.world, context):
                group = dist.new_group(list(range(first, first + context)))
                if first <= self.rank < first + context:
                    self.context_group = group


def setup(device: str) -> Ranks:
    """Join the process group when launched by torchrun with more than one process."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Ranks()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device != "cpu" and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return Ranks(dist.get_rank(), dist.get_world_size(), torch.device("cuda", local) if cuda else torch.device("cpu"))


def teardown(ranks: Ranks) -> None:
    if ranks.world > 1 and dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def refusals_once(ranks: Ranks) -> Iterator[None]:
    """The set-up checks of every rank, which mostly find the same problem everywhere (they read one config):
    if a rank refuses (a UserError), rank 0 raises the first refusal, the one line the user sees, and the
    other ranks leave quietly with the status the CLI gives it (2). Every rank must reach the end of the
    block before any other collective, so a rank that refuses early waits there for the others."""
    refusal = None
    try:
        yield
    except UserError as err:
        if ranks.world == 1:
            raise
        refusal = str(err)
    if ranks.world == 1:
        return
    found = [None] * ranks.world
    dist.all_gather_object(found, refusal)
    first = next((message for message in found if message is not None), None)
    if first is None:
        return
    if ranks.main:
        raise UserError(first)
    raise SystemExit(2)


def wrap(model: nn.Module, ranks: Ranks, fsdp: bool) -> nn.Module:
    """The module to train: the model itself, DDP around it, or the model sharded in place (FSDP2: each
    block, then the rest)."""
    if ranks.world == 1:
        return model
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        ranks.sharded = True
        return model
    return nn.parallel.DistributedDataParallel(model)


def rebind(groups: list[dict], model: nn.Module, names: dict[int, str]) -> list[dict]:
    """Optimizer groups built before wrapping, pointed at the parameters the wrapped model trains (FSDP
    replaces them); names maps the old parameters' ids to their names."""
    current = dict(model.named_parameters())
    return [{**g, "params": [current[names[id(p)]] for p in g["params"]]} for g in groups]


def my_share(batch: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """This rank's contiguous slice of a batch that every rank drew alike (its context group's rows)."""
    size = batch.shape[0] // ranks.data_world
    return batch[ranks.data_rank * size : (ranks.data_rank + 1) * size]


def my_shard(batch: torch.Tensor, ranks: Ranks, padding: int) -> torch.Tensor:
    """This rank's shard along time of its rows [B, T] under context parallelism: T padded at its end with
    `padding` to a multiple of the group's size (causal: no earlier position reads it), then cut in equal shards."""
    if ranks.context == 1:
        return batch
    shard = -(-batch.shape[1] // ranks.context)
    padded = torch.nn.functional.pad(batch, (0, shard * ranks.context - batch.shape[1]), value=padding)
    mine = ranks.rank % ranks.context
    return padded[:, mine * shard : (mine + 1) * shard]


def mean(value: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """The mean of a scalar tensor over the ranks (the loss of the whole batch), reduced on the tensor's own
    device (NCCL reduces GPU tensors only) and without a host sync."""
    if ranks.world == 1:
        return value
    total = value.detach().clone()
    dist.all_reduce(total)
    return total / ranks.world


def full_state(model: nn.Module, optimizer, ranks: Ranks, plain_copy):
    """(model, optimizer) holding the full state in single-process form, on rank 0 (None elsewhere). Under
    FSDP every rank must call this: the shards are gathered into plain_copy() = a fresh plain (model, optimizer)."""
    if not ranks.sharded:
        return model, optimizer
    model_state = get_model_state_dict(model, options=FULL)
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=FULL)
    if not ranks.main:
        return None, None
    plain_model, plain_optimizer = plain_copy()
    set_model_state_dict(plain_model, model_state, options=StateDictOptions(full_state_dict=True))
    set_optimizer_state_dict(plain_model, plain_optimizer, optimizer_state,
                             options=StateDictOptions(full_state_dict=True))
    return plain_model, plain_optimizer


def load_optimizer(model: nn.Module, optimizer, state: dict, ranks: Ranks, plain_copy) -> None:
    """Load a single-process optimizer state; under FSDP through plain_copy(), a fresh plain (model, optimizer)
    that reads it first."""
    if not ranks.sharded:
        optimizer.load_state_dict(state)
        return
    plain_model, plain_optimizer = plain_copy()
    # every rank's plain copy needs the whole model (FULL's CPU offload would leave it on rank 0 alone)
    whole = StateDictOptions(full_state_dict=True)
    set_model_state_dict(plain_model, get_model_state_dict(model, options=whole), options=whole)
    plain_optimizer.load_state_dict(state)
    full = get_optimizer_state_dict(plain_model, plain_optimizer, options=whole)
    set_optimizer_state_dict(model, optimizer, full, options=whole)
