"""What a plan will cost, and the plan as `attnlab reproduce --dry-run` prints it.

A CPU-sized suite's job is estimated by the step-cost probe: a forward+backward of one micro-batch through the
job's model, on this machine, now, times the micro-batches of a step and the steps (an upper bound: a run that
stops early costs less). A whole micro-batch, not one sequence times the batch: a small model's step is mostly
fixed overhead, which one sequence would count once per sequence. Its evaluation is estimated alike: the forward
passes of its evaluations while training and of its measurement after (its metric's, `forward_passes`: on a small
model these can cost more than the training), each call timed by a forward alone through the model, without
gradients; a job that measures a model trained already costs that alone. A job's start-up (its data loaded, its
model built) is not counted. A GPU-sized suite's (`Suite.gpu`) models are
too large to build here: its jobs get a FLOP bound instead, their training FLOPs at the throughput `estimate.py`
assumes, which is a lower bound and no prediction (a small model's step is bound by its kernel launches), and
their evaluation is not counted. Given a GPU's doctor
report (`--predict-on`), every job is predicted on that GPU instead (`device_times`: start-up and compile warm-up
included), and the plan says how long it takes from start to end with its jobs spread over --jobs workers, and
what that assumes. Beside the jobs: the claims' rows they carry (`carried`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .carried import describe_rows
from .device_times import DeviceTimes
from .forward_passes import Passes
from .plan import Job, Plan
from .spec import Suite
from .store import Results

STATUS = {"done": "done", "train": "trains", "measure": "measures", "waiting": "waits for", "blocked": "not trained:"}


def job_seconds(suite: Suite, job: Job, settings, probes: dict,
                device: DeviceTimes | None = None) -> tuple[float, float] | None:
    """The job's estimated training seconds, as (before its steps, its steps): on a device its start-up and compile
    warm-up, and its steps; elsewhere 0 and all of it (None: it trains nothing, or the device did not time its
    mixer). probes caches one probe per model shape."""
    if not _trains(job):
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


def _trains(job: Job) -> bool:
    """Whether the job trains a model: to train, or waiting for its learning rate (not for another's model)."""
    return job.status == "train" or (job.status == "waiting" and job.model is None)


def evaluation_seconds(job: Job, probes: dict) -> float | None:
    """The job's estimated seconds of evaluation on this machine's CPU: its measurement after training, the forward
    passes its metric makes (forward_passes), and where it trains its evaluations every train.eval_every steps,
    each call of a pass at the step-cost probe's forward time (None: its metric has no estimate)."""
    from .estimate import meta_model
    from .metrics import get_metric

    if job.status in ("done", "blocked"):
        return 0.0
    count = get_metric(job.experiment.metric).passes
    if count is None:
        return None
    passes = count(job.experiment, job.cfg, meta_model(job.cfg)) + (evaluations(job.cfg) if _trains(job) else [])
    micro = max(1, job.cfg.train.batch_size // job.cfg.train.grad_accum)
    seconds = 0.0
    for p in filter(lambda p: p.sequences, passes):
        # a call of more than a micro-batch is priced as its micro-batches: a probe of every batch size would
        # cost the plan as much as the training probes; at a micro-batch a small model's fixed cost is paid
        batch = min(p.batch, p.sequences, micro)
        seconds += -(-p.sequences // batch) * forward_seconds(job.cfg, batch, p.length, probes)
    return seconds


def evaluations(cfg) -> list[Passes]:
    """The validation loss while training (train.eval_every steps and the last): eval_batches x batch_size windows
    each time, a micro-batch at a time."""
    t = cfg.train
    times = t.steps // t.eval_every + (t.steps % t.eval_every != 0)
    micro = max(1, t.batch_size // t.grad_accum)
    return [Passes(times * t.eval_batches * t.batch_size, t.seq_len, micro)]


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


def forward_seconds(cfg, batch: int, length: int, probes: dict) -> float:
    """A forward of `batch` sequences of `length` tokens through the job's model in evaluation mode, without
    gradients, on this machine's CPU (the step-cost probe without its backward); probes caches one per shape."""
    import torch

    from ..model import Decoder
    from ..step_cost import probe_seconds

    shape = ("forward", repr(cfg.sized_model()), batch, length)
    if shape not in probes:
        with torch.random.fork_rng():
            model = Decoder(cfg.sized_model()).eval()
            probes[shape] = probe_seconds({"model": model}, length, model.cfg.vocab_size, torch.device("cpu"),
                                          batch=batch, backward=False)["model"]
    return probes[shape]


# what no prediction of a plan counts, said beside each one
NOT_COUNTED = ("not counted: evaluation every train.eval_every steps, the measurements after training and the jobs "
               "that only measure; early stopping's caps counted in full (less where runs stop early)")
# what a CPU estimate's evaluation is, and what it leaves out, said beside its total
COUNTED = ("evaluation: each job's validation loss every train.eval_every steps and its measurement after (the "
           "forward passes its metric makes over what it scores), timed as its steps are by the step-cost probe; not "
           "counted: a job's start-up (its data loaded, its model built, its checkpoints written)")


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
    job's training seconds (job_seconds), in plan order. On this machine's CPU a job's time includes its
    evaluation (evaluation_seconds); a FLOP bound and a GPU's prediction count training alone."""
    probes: dict = {}
    bound = suite.gpu and not plan.settings.smoke and device is None  # a FLOP bound, not a prediction
    total = _Total(bound, device)
    lines = [f"{suite.name} ({suite.tier}): {len(plan.jobs)} jobs; {_unit(device, bound)}"]
    for job in plan.jobs:
        seconds = job_seconds(suite, job, plan.settings, probes, device)
        evaluated = evaluation_seconds(job, probes) if total.evaluated else 0.0
        cost = total.add(job, seconds, evaluated)
        lines.append(f"  {job.stage:<12} {str(job.key):<44} {_what(job):<60} {cost:>9}")
    lines.append(total.line(plan))
    return lines + (describe_rows(suite, plan, results) if results is not None else []), total.costs


@dataclass
class _Total:
    """A plan's estimated seconds as its jobs add to them, and what they leave without an estimate."""

    bound: bool  # a FLOP bound on training
    device: DeviceTimes | None  # a GPU's prediction of training
    costs: list[tuple[float, float]] = field(default_factory=list)  # each timed job's (before its steps, its steps)
    evaluation: float = 0.0
    untimed: int = 0  # jobs that train with no timing on the device
    unpriced: set[str] = field(default_factory=set)  # metrics whose measurement has no estimate

    @property
    def evaluated(self) -> bool:
        """Whether evaluation is estimated: by the CPU's step-cost probe, not by FLOPs or a GPU's report."""
        return not self.bound and self.device is None

    def add(self, job: Job, seconds: tuple[float, float] | None, evaluated: float | None) -> str:
        """The job's times counted in; what its line shows."""
        from ..step_cost import duration

        self.untimed += seconds is None and job.status == "train"
        self.costs += [] if seconds is None else [seconds]
        self.evaluation += evaluated or 0.0
        if evaluated is None:
            self.unpriced.add(job.experiment.metric)
        if (seconds is None and job.status == "train") or evaluated is None:
            return "no timing"
        if seconds is None and not evaluated:  # done or blocked; under a bound or a GPU, one that only measures
            return ""
        return ("≥ " if self.bound else "") + duration(sum(seconds or ()) + evaluated)

    def line(self, plan: Plan) -> str:
        """The counts and the total, and what it counts."""
        from ..step_cost import duration

        counts = ", ".join(f"{plan.count(s)} {STATUS[s].rstrip(':')}" for s in STATUS if plan.count(s))
        training, counted = sum(map(sum, self.costs)), ""
        if self.bound:
            total = f"at least {duration(training)} of training in all by FLOPs (a lower bound, not a prediction)"
        elif self.device:
            total = (f"about {duration(training)} of training in all, each run alone on the GPU, its start-up and "
                     "compile warm-up included")
        else:
            total = (f"about {duration(training + self.evaluation)} in all, {duration(training)} of training steps "
                     f"and {duration(self.evaluation)} of evaluation")
            counted = f"; {COUNTED}"
        waiting = " (the jobs that wait counted at their presets' rates)"
        unpriced = f"; the measurement by {', '.join(sorted(self.unpriced))} has no estimate" if self.unpriced else ""
        untimed = f"; {self.untimed} that train have no timing on this device" if self.untimed else ""
        return f"{counts}; {total}{waiting}{counted}{unpriced}{untimed}"


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
    return "estimated time of training and evaluation on this machine's CPU (step-cost probe)"


def _what(job: Job) -> str:
    """What the job does, or what it waits for."""
    what = STATUS[job.status] + (f" {job.why}" if job.why and job.status in ("waiting", "blocked") else "")
    if job.status == "measure" and job.model is not None:
        what += f" the model of {job.model}"
    if job.supersedes:
        return what + " (replaces a record of another config)"
    return what + (" again (--remeasure)" if job.again else "")
