"""What a training step will cost, measured before the first one, so that a configuration whose steps are
expensive (Boltzmann inference over long chains, say) is reported before hours go into it.

The probe times a forward+backward of one sequence through the model and through a softmax model of the
same shape, on this machine, now. Their ratio decides whether the estimate is printed (a ratio holds across
machines where seconds do not); the model's seconds, scaled to the sequences of a step, give the estimate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .bench.timing import round_robin
from .config import RunConfig
from .model import Decoder

EXPENSIVE_X_SOFTMAX = 10.0  # a step dearer than this many softmax steps of the same shape gets an estimate


@dataclass
class StepCost:
    seconds: float  # per training step, estimated
    x_softmax: float  # against a softmax model of the same shape


def probe_seconds(models: dict, seq_len: int, vocab_size: int, device, repeats: int = 2) -> dict:
    """Median seconds of a forward+backward of one sequence through each model (after a warm-up), taking
    turns; the gradients are cleared after."""
    tokens = torch.randint(vocab_size, (1, seq_len), generator=torch.Generator().manual_seed(0)).to(device)
    targets = torch.zeros_like(tokens)  # a valid class for any head, tokens or positions

    def step(model):
        model.loss(tokens, targets).backward()

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
    """Each distinct mixer configuration's own advice (mixers that have a `cost_advice`), naming its fields."""
    advice = []
    for module in model.modules():
        if hasattr(module, "cost_advice"):
            line = f"{module.name}: {module.cost_advice()} (model.mixer_options.{module.name}.<field>=<value>)"
            if line not in advice:
                advice.append(line)
    return advice


def warn_if_expensive(model: Decoder, cfg: RunConfig, device, log=print) -> StepCost | None:
    """Measures a step before training; logs the run's estimated time and advice when steps are expensive."""
    cost = estimate_step_cost(model, cfg, device)
    report = None if cost is None else cost_report(cost, cfg.train.steps, mixer_advice(model))
    if report:
        log(report)
    return cost
