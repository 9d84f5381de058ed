"""What a training step will cost, measured before the first one. So a configuration whose steps are expensive
(exact inference over long chains, say) is reported before hours go into it, and one whose step cannot fit in memory
is refused before it is killed.

The time probe runs a forward+backward of one sequence through the model and through a softmax model of the
same shape, on this machine, now. Their ratio decides whether the estimate is printed (a ratio holds across
machines where seconds do not); the model's seconds, scaled to the sequences of a step, give the estimate.

The memory probe measures the peak memory of a forward+backward of one and of two sequences: the difference
is what each sequence of a micro-batch adds, the rest is fixed (the gradients); AdamW's two moments add twice
the parameters' bytes. On a GPU the allocator counts the peak; elsewhere ``LiveBytes`` counts the tensors
alive at once.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from .config import RunConfig
from .errors import ConfigError
from .mixers import Mixer
from .model import Decoder
from .timing import round_robin

EXPENSIVE_X_SOFTMAX = 10.0  # a step dearer than this many softmax steps of the same shape gets an estimate


@dataclass
class StepCost:
    seconds: float  # per training step, estimated
    x_softmax: float  # against a softmax model of the same shape


def probe_seconds(models: dict, seq_len: int, vocab_size: int, device, repeats: int = 2, batch: int = 1,
                  backward: bool = True) -> dict:
    """Median seconds of a forward+backward (a forward alone, without gradients, where not backward) of `batch`
    sequences through each model (after a warm-up), taking turns; the gradients are cleared after."""
    tokens = torch.randint(vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(0)).to(device)
    targets = torch.zeros_like(tokens)  # a valid class for any head, tokens or positions

    def step(model):
        with torch.set_grad_enabled(backward):
            loss = model.loss(tokens, targets)
        if backward:
            loss.backward()

    seconds = round_robin({name: lambda m=model: step(m) for name, model in models.items()}, repeats)
    for model in models.values():
        model.zero_grad(set_to_none=True)
    return seconds


def estimate_step_cost(model: Decoder, cfg: RunConfig, device) -> StepCost | None:
    """The cost of a training step of model against a softmax twin; None when every layer is softmax. The
    random numbers drawn (the twin's init, dropout) are put back, so the run that follows is unchanged."""
    if set(cfg.model.layer_mixers()) == {"softmax"}:
        return None
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        twin = Decoder(dataclasses.replace(cfg.model, mixer="softmax", layers=None)).to(device)
        seconds = probe_seconds({"model": model, "softmax": twin}, cfg.train.seq_len, cfg.model.vocab_size, device)
    # sequences run one after another on a CPU; a GPU runs a batch in parallel, so there this is an upper bound
    return StepCost(seconds["model"] * cfg.train.batch_size, seconds["model"] / seconds["softmax"])


def cost_report(cost: StepCost, steps: int, advice: list[str]) -> str | None:
    """The estimate and what to change, or None when a step costs at most EXPENSIVE_X_SOFTMAX softmax steps."""
    if cost.x_softmax <= EXPENSIVE_X_SOFTMAX:
        return None
    lines = [f"cost: a training step takes about {cost.seconds:.3g} s here, {cost.x_softmax:.0f}x a softmax model of "
             f"the same shape (estimated now from one sequence): {steps} steps x {cost.seconds:.3g} s = about "
             f"{duration(steps * cost.seconds)}. To make steps cheaper:"]
    lines += [f"  {line}" for line in advice] or ["  lower train.batch_size or train.seq_len, or use another mixer"]
    return "\n".join(lines)


def duration(seconds: float) -> str:
    """'40 s', '12 min' or '7.5 h'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.2g} h"


def mixer_advice(model: Decoder) -> list[str]:
    """Each distinct mixer configuration's own advice (its config's `cost_advice`), naming its fields."""
    advice = []
    for mixer in (module for module in model.modules() if isinstance(module, Mixer)):
        said = mixer.cfg.cost_advice
        line = f"{mixer.name}: {said} (model.mixer_options.{mixer.name}.<field>=<value>)"
        if said is not None and line not in advice:
            advice.append(line)
    return advice


def warn_if_expensive(model: Decoder, cfg: RunConfig, device, log=print) -> StepCost | None:
    """Measures a step before training; logs the run's estimated time and advice when steps are expensive."""
    cost = estimate_step_cost(model, cfg, device)
    report = None if cost is None else cost_report(cost, cfg.train.steps, mixer_advice(model))
    if report:
        log(report)
    return cost


# ---------------------------------------------------------------------------------------------------
# memory

GiB = 1 << 30


class LiveBytes(TorchDispatchMode):
    """Within its block, the bytes of the tensor storages that operations allocate and that are still alive, and
    the peak of that count: what an allocator must hold at once, without its caching (which blurs a process's
    resident memory). A storage counts once, however many views share it, and not at all if it existed before
    (an operation's inputs: a view or an in-place update of a weight allocates nothing)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.seen = WeakIdKeyDictionary()  # storage -> a weak reference whose callback uncounts it, None: not counted

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for value in tree_leaves((args, kwargs)):
            if isinstance(value, torch.Tensor):
                self.seen.setdefault(value.untyped_storage(), None)
        out = func(*args, **(kwargs or {}))
        for value in tree_leaves(out):
            if isinstance(value, torch.Tensor) and value.untyped_storage() not in self.seen:
                self._count(value.untyped_storage())
        return out

    def _count(self, storage) -> None:
        size = storage.nbytes()
        self.seen[storage] = weakref.ref(storage, lambda _, size=size: self._free(size))
        self.live += size
        self.peak = max(self.peak, self.live)

    def _free(self, size: int) -> None:
        self.live -= size


def peak_bytes(fn, device) -> int:
    """The peak memory that fn's tensors take at once: the CUDA allocator's peak above what was allocated
    before, elsewhere ``LiveBytes``'s."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    with LiveBytes() as live:
        fn()
    return live.peak


def step_memory(model: Decoder, cfg: RunConfig, device, sequences: int, shards: int = 1,
                autocast: Callable = nullcontext) -> int:
    """Bytes that a training step with `sequences` sequences per micro-batch takes besides the weights, measured
    now: a fixed part (the gradients) and a part per sequence, from passes of one and of two sequences, plus
    AdamW's two moments; FSDP splits the gradients and moments over `shards` ranks. The random numbers drawn
    (dropout) are put back and the gradients cleared, so the run that follows is unchanged."""

    def forward_backward(batch: int) -> None:
        tokens = torch.randint(cfg.model.vocab_size, (batch, cfg.train.seq_len),
                               generator=torch.Generator().manual_seed(0)).to(device)
        with autocast():
            loss = model.loss(tokens, torch.zeros_like(tokens))  # a valid class for any head, tokens or positions
        loss.backward()
        model.zero_grad(set_to_none=True)  # each pass allocates its gradients anew, as a training step does

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        one = peak_bytes(lambda: forward_backward(1), device)
        two = peak_bytes(lambda: forward_backward(2), device)
    per_sequence = max(two - one, 0)
    moments = 2 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return (max(one - per_sequence, 0) + moments) // shards + sequences * per_sequence


def available_memory(device) -> int | None:
    """Bytes this process can still allocate on device: on CUDA the device's free memory plus what PyTorch
    holds cached; on a CPU the RAM the system calls available (psutil if installed, else /proc/meminfo).
    None where neither says."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type != "cpu":
        return None
    try:
        import psutil
    except ImportError:
        return _meminfo_available()
    return psutil.virtual_memory().available


def _meminfo_available() -> int | None:
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024  # kB
    return None


def check_memory(model: Decoder, cfg: RunConfig, device, sequences: int, shards: int = 1,
                 autocast: Callable = nullcontext) -> None:
    """Refuse a step that cannot fit (see ``step_memory``) in what the device has available, which on a CPU the
    processes of this machine share (torchrun's LOCAL_WORLD_SIZE). Skipped where nothing says what is
    available."""
    available = available_memory(device)
    if available is None:
        return
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if device.type == "cpu" else 1
    need = processes * step_memory(model, cfg, device, sequences, shards, autocast)
    if need <= available:
        return
    where = "this machine has" if device.type == "cpu" else f"{device} has"
    shared = f" ({processes} processes here)" if processes > 1 else ""
    fix = ("lower train.batch_size or train.seq_len, or raise train.grad_accum" if sequences > 1
           else "lower train.seq_len or the model's size (model.d_model, model.n_layers)")
    raise ConfigError(f"a step needs about {readable_size(need)}{shared}; {where} {readable_size(available)} "
                      f"available: {fix}")


def readable_size(nbytes: int) -> str:
    """'31 GiB', '512 MiB'."""
    return f"{nbytes / GiB:.3g} GiB" if nbytes >= GiB else f"{nbytes / (1 << 20):.3g} MiB"
