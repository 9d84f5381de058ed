"""What a plan will cost, and the plan as `attnlab reproduce --dry-run` prints it.

A CPU-sized suite's job is estimated by the step-cost probe: a forward+backward of one micro-batch through the
job's model, on this machine, now, times the micro-batches of a step and the steps (an upper bound: a run that
stops early costs less). A whole micro-batch, not one sequence times the batch: a small model's step is mostly
fixed overhead, which one sequence would count once per sequence. A GPU-sized suite's (`Suite.gpu`) models are
too large to build here: its jobs are estimated from their training FLOPs at the throughput `estimate.py` assumes.
A job that measures a model trained already costs its evaluation only, which is not estimated. Given a GPU's
doctor report (`--predict-on`), every job is predicted on that GPU instead (`device_times`), and the plan says
how long it takes from start to end with its jobs spread over --jobs workers.
"""

from __future__ import annotations

from .device_times import DeviceTimes, wall_seconds
from .plan import Job, Plan
from .spec import Suite

STATUS = {"done": "done", "train": "trains", "measure": "measures", "waiting": "waits for", "blocked": "not trained:"}


def job_seconds(suite: Suite, job: Job, settings, probes: dict, device: DeviceTimes | None = None) -> float | None:
    """The job's estimated training seconds (None: it trains nothing, or the device did not time its mixer);
    probes caches one probe per model shape."""
    if job.status in ("done", "measure", "blocked") or (job.status == "waiting" and job.model is not None):
        return None
    cfg = job.cfg  # one waiting for its rate: at its preset's, which costs the same
    steps = cfg.train.steps
    if device is not None:
        step = device.step_seconds(cfg)
        return None if step is None else step * steps
    if suite.gpu and not settings.smoke:  # a smoke run's models are CPU-sized
        from .estimate import SUSTAINED_TFLOPS, training_flops

        return training_flops(cfg) / (SUSTAINED_TFLOPS * 1e12)
    t = cfg.train
    shape = repr((cfg.model, t.seq_len, t.batch_size, t.grad_accum, cfg.data.source, cfg.data.tokenizer))
    if shape not in probes:
        probes[shape] = step_seconds(cfg)
    return probes[shape] * steps


def step_seconds(cfg) -> float:
    """A training step's forward+backward through the job's model on this machine's CPU (the step-cost probe):
    one micro-batch, times the micro-batches of a step."""
    import torch

    from ..model import Decoder
    from ..step_cost import probe_seconds

    micro = max(1, cfg.train.batch_size // cfg.train.grad_accum)
    with torch.random.fork_rng():
        model = Decoder(cfg.sized_model())
        vocab = model.cfg.vocab_size
        seconds = probe_seconds({"model": model}, cfg.train.seq_len, vocab, torch.device("cpu"), batch=micro)["model"]
    return seconds * cfg.train.grad_accum


def describe_plan(suite: Suite, plan: Plan, device: DeviceTimes | None = None, workers: int | None = None) -> str:
    """The plan, a line a job: its stage, its key, what it does (or waits for) and its estimated time; then the
    counts and the total, and on a device with several workers, from start to end."""
    from ..step_cost import duration

    probes: dict = {}
    by_flops = suite.gpu and not plan.settings.smoke and device is None
    unit = ("GPU time at the FLOP rate estimate.py assumes" if by_flops else
            f"{device.device}, predicted from {device.source}" if device else "this machine's CPU (step-cost probe)")
    lines = [f"{suite.name} ({suite.tier}): {len(plan.jobs)} jobs; estimated training time on {unit}"]
    costs, unknown = [], 0
    for job in plan.jobs:
        seconds = job_seconds(suite, job, plan.settings, probes, device)
        unknown += seconds is None and job.status == "train"
        what = STATUS[job.status] + (f" {job.why}" if job.why and job.status in ("waiting", "blocked") else "")
        if job.status == "measure" and job.model is not None:
            what += f" the model of {job.model}"
        if job.supersedes:
            what += " (replaces a record of another config)"
        elif job.again:
            what += " again (--remeasure)"
        if seconds is not None:
            costs.append(seconds)
        cost = duration(seconds) if seconds is not None else ("no timing" if job.status == "train" else "")
        lines.append(f"  {job.stage:<12} {str(job.key):<44} {what:<60} {cost:>9}")
    counts = ", ".join(f"{plan.count(s)} {STATUS[s].rstrip(':')}" for s in STATUS if plan.count(s))
    lines.append(f"{counts}; about {duration(sum(costs))} of training in all (the jobs that wait counted at their "
                 "presets' rates)" + (f"; {unknown} that train have no timing on this device" if unknown else ""))
    if device is not None and workers:
        at_once = min(workers, len(costs)) or 1
        wall = wall_seconds([c * device.slowdown(at_once) for c in costs], workers)
        lines.append(f"with {workers} at once, from start to end: about {duration(wall)} ({wall:.0f} s; each job "
                     f"given a worker in plan order, waiting aside; {device.assumption()})")
    return "\n".join(lines)
