"""What a plan will cost, and the plan as `attnlab reproduce --dry-run` prints it.

A CPU-sized suite's job is estimated by the step-cost probe: a forward+backward of one micro-batch through the
job's model, on this machine, now, times the micro-batches of a step and the steps (an upper bound: a run that
stops early costs less). A whole micro-batch, not one sequence times the batch: a small model's step is mostly
fixed overhead, which one sequence would count once per sequence. A GPU-sized suite's (`Suite.gpu`) models are
too large to build here: its jobs get a FLOP bound instead, their training FLOPs at the throughput `estimate.py`
assumes, which is a lower bound and no prediction (a small model's step is bound by its kernel launches). A job
that measures a model trained already costs its evaluation only, which is not estimated. Given a GPU's doctor
report (`--predict-on`), every job is predicted on that GPU instead (`device_times`: start-up and compile warm-up
included), and the plan says how long it takes from start to end with its jobs spread over --jobs workers, and
what that assumes. Beside the jobs: the claims' rows they carry (`carried`).
"""

from __future__ import annotations

from .carried import describe_rows
from .device_times import DeviceTimes
from .plan import Job, Plan
from .spec import Suite
from .store import Results

STATUS = {"done": "done", "train": "trains", "measure": "measures", "waiting": "waits for", "blocked": "not trained:"}


def job_seconds(suite: Suite, job: Job, settings, probes: dict,
                device: DeviceTimes | None = None) -> tuple[float, float] | None:
    """The job's estimated training seconds, as (before its steps, its steps): on a device its start-up and compile
    warm-up, and its steps; elsewhere 0 and all of it (None: it trains nothing, or the device did not time its
    mixer). probes caches one probe per model shape."""
    if job.status in ("done", "measure", "blocked") or (job.status == "waiting" and job.model is not None):
        return None
    cfg = job.cfg  # one waiting for its rate: at its preset's, which costs the same
    if device is not None:
        return device.run_parts(cfg)
    if suite.gpu and not settings.smoke:  # a smoke run's models are CPU-sized
        from .estimate import SUSTAINED_TFLOPS, training_flops

        return 0.0, training_flops(cfg) / (SUSTAINED_TFLOPS * 1e12)
    t = cfg.train
    shape = repr((cfg.model, t.seq_len, t.batch_size, t.grad_accum, cfg.data.source, cfg.data.tokenizer))
    if shape not in probes:
        probes[shape] = step_seconds(cfg)
    return 0.0, probes[shape] * t.steps


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


# what no prediction of a plan counts, said beside each one
NOT_COUNTED = ("not counted: evaluation every train.eval_every steps, the measurements after training and the jobs "
               "that only measure; early stopping's caps counted in full (less where runs stop early)")


def describe_plan(suite: Suite, plan: Plan, device: DeviceTimes | None = None, workers: int | None = None,
                  results: Results | None = None) -> str:
    """The plan (plan_lines), and on a device with several workers, from start to end and what that assumes."""
    lines, costs = plan_lines(suite, plan, device, results)
    if device is not None and workers:
        lines += prediction_lines(device, *device.walls([(costs, workers)]), f"with {workers} at once")
    return "\n".join(lines)


def plan_lines(suite: Suite, plan: Plan, device: DeviceTimes | None = None,
               results: Results | None = None) -> tuple[list[str], list[tuple[float, float]]]:
    """A line a job: its stage, its key, what it does (or waits for) and its estimated time; then the counts and
    the total, and with results (the suite folder's records) the claims' rows the jobs carry. Also each timed
    job's seconds (job_seconds), in plan order."""
    from ..step_cost import duration

    probes: dict = {}
    bound = suite.gpu and not plan.settings.smoke and device is None  # a FLOP bound, not a prediction
    lines = [f"{suite.name} ({suite.tier}): {len(plan.jobs)} jobs; {_unit(device, bound)}"]
    costs, unknown = [], 0
    for job in plan.jobs:
        seconds = job_seconds(suite, job, plan.settings, probes, device)
        unknown += seconds is None and job.status == "train"
        costs += [] if seconds is None else [seconds]
        cost = ("no timing" if job.status == "train" else "") if seconds is None else \
            ("≥ " if bound else "") + duration(sum(seconds))
        lines.append(f"  {job.stage:<12} {str(job.key):<44} {_what(job):<60} {cost:>9}")
    counts = ", ".join(f"{plan.count(s)} {STATUS[s].rstrip(':')}" for s in STATUS if plan.count(s))
    in_all = duration(sum(map(sum, costs)))
    total = (f"at least {in_all} of training in all by FLOPs (a lower bound, not a prediction)"
             if bound else f"about {in_all} of training in all" +
             (", each run alone on the GPU, its start-up and compile warm-up included" if device else ""))
    lines.append(f"{counts}; {total} (the jobs that wait counted at their presets' rates)" +
                 (f"; {unknown} that train have no timing on this device" if unknown else ""))
    return lines + (describe_rows(suite, plan, results) if results is not None else []), costs


def prediction_lines(device: DeviceTimes, low: float, high: float, label: str) -> list[str]:
    """From start to end (one number, or a range where packing was not measured), then what it assumes."""
    from ..step_cost import duration

    span = (f"about {duration(low)} ({low:.0f} s)" if low == high else
            f"{duration(low)} ({low:.0f} s) with every run at its speed alone to {duration(high)} ({high:.0f} s) "
            "with their steps one after another")
    return ([f"{label}, from start to end: {span}; each job given a worker in plan order, waiting aside"] +
            [f"  assumes {item}" for item in device.assumptions()] + [f"  {NOT_COUNTED}"])


def _unit(device: DeviceTimes | None, bound: bool) -> str:
    """What the jobs' times are: a FLOP bound, a prediction on a GPU, or the CPU's step-cost probe."""
    if bound:
        from .estimate import SUSTAINED_TFLOPS

        return (f"a FLOP bound on their training time, not a prediction: their training FLOPs at "
                f"{SUSTAINED_TFLOPS:.0f} TFLOP/s sustained (estimate.py), a lower bound, since a small model's steps "
                "are bound by kernel launches; --predict-on a GPU's doctor.json predicts them")
    if device is not None:
        return f"training time predicted on {device.device} from {device.source}"
    return "estimated training time on this machine's CPU (step-cost probe)"


def _what(job: Job) -> str:
    """What the job does, or what it waits for."""
    what = STATUS[job.status] + (f" {job.why}" if job.why and job.status in ("waiting", "blocked") else "")
    if job.status == "measure" and job.model is not None:
        what += f" the model of {job.model}"
    if job.supersedes:
        return what + " (replaces a record of another config)"
    return what + (" again (--remeasure)" if job.again else "")
