"""The training loop: AdamW with parameter groups, a learning-rate schedule, clipping, accumulation, evaluation,
metrics and resumable checkpoints. Evaluation is periodic, with optional early stopping; the metrics go to a JSONL
log, and checkpoints resume bit for bit. Before the first step the run folder is locked and checked to be writable,
and a step too large for the memory is refused."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from . import checkpoint, distributed, loggers, step_cost
from .config import RunConfig, TrainConfig
from .data import TokenCorpus, load_data
from .data.corpus import IGNORE, default_cache_dir, packed_rows
from .data.tokenizer import NotInVocabulary
from .devices import pick_device
from .errors import ConfigError, UserError
from .evaluate import perplexity, split_loss, to_device
from .mixers.base import check_splits
from .model import Decoder, next_token_loss
from .ops.cp import Context
from .paths import user_path
from .starting_point import check_tokenizer, checkpoint_tokenizer, starting_point


def is_matrix(param: torch.Tensor) -> bool:
    """Whether a parameter is a weight matrix (or a stack of them), which weight decay pulls toward 0: at least
    two dimensions of size above 1. A per-head scalar or time constant ([H, 1, 1], [H]) is not, whatever its
    shape: decay would pull on what sets a mechanism's strength (the coupling's step, a decay rate)."""
    return sum(size > 1 for size in param.shape) >= 2


def param_groups(model: nn.Module, cfg: TrainConfig) -> list[dict]:
    """Weight decay on matrices only: not on norms, biases, scalars or embeddings (nor the head tied to them).
    Parameters marked with ``attnlab.nn.set_optim`` get their own group."""
    groups: dict[tuple, list] = {}
    seen: set[int] = set()
    for module in model.modules():
        for param in module.parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                continue
            seen.add(id(param))
            decays = is_matrix(param) and not isinstance(module, nn.Embedding)
            options = getattr(param, "_optim", {})
            lr = min(options.get("lr", cfg.lr), options.get("max_lr", float("inf")))
            key = (lr, options.get("weight_decay", cfg.weight_decay if decays else 0.0))
            groups.setdefault(key, []).append(param)
    return [{"params": ps, "peak_lr": lr, "weight_decay": wd} for (lr, wd), ps in groups.items()]


def lr_multiplier(step: int, cfg: TrainConfig, decay_start: int | None = None) -> float:
    """The learning rate of step `step` (from 0) over train.lr. cosine: linear warmup to 1, then cosine decay to
    min_lr / lr at the last step. wsd: see ``_wsd_multiplier``, whose decay starts at decay_start (where patience
    started it) or else train.steps - decay_length."""
    if cfg.schedule == "wsd":
        return _wsd_multiplier(step, cfg, cfg.steps - cfg.decay_length if decay_start is None else decay_start)
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    floor = cfg.min_lr / cfg.lr
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _wsd_multiplier(step: int, cfg: TrainConfig, start: int) -> float:
    """Warmup-stable-decay: linear warmup to 1, then 1, then from step `start` a linear decay that reaches
    floor = min_lr / lr at the decay's last step, start + D - 1 (D = decay_length), and stays there:
    m = 1 - (1 - floor) * clamp((step + 1 - start) / D, 0, 1). A decay that begins before the warmup ends (a
    short run, or patience running out during the warmup) takes the lower of the two."""
    warm = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0
    floor = cfg.min_lr / cfg.lr
    return min(warm, 1 - (1 - floor) * min(1.0, max(0, step + 1 - start) / cfg.decay_length))


class MetricsLog:
    """metrics.jsonl in the run folder; on resume, records after the checkpoint's step are dropped so
    the log reads as one uninterrupted run. Its scalars also go to the sinks of train.log_to (see
    ``attnlab.loggers``), which it closes on leaving its ``with`` block."""

    def __init__(self, path: Path, resume_step: int | None, sinks: list = ()):
        self.path, self.sinks = path, sinks
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if resume_step is not None and path.exists():
            kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= resume_step]
        path.write_text("".join(line + "\n" for line in kept))

    def write(self, **record) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        scalars = {k: v for k, v in record.items() if k in loggers.SCALARS}
        if scalars:  # a note such as the early-stopping record carries none
            for sink in self.sinks:
                sink.write(record["step"], scalars)

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc) -> None:
        for sink in self.sinks:  # flushes what they buffer, also when training fails or is interrupted
            sink.close()


class EarlyStopping:
    """Tracks the lowest validation loss (the best checkpoint); with patience > 0, training stops once
    `patience` evaluations in a row have not gone below the last significant low by more than min_delta."""

    def __init__(self, patience: int, min_delta: float = 0.0, state: dict | None = None):
        self.patience, self.min_delta = patience, min_delta
        state = state or {"best_loss": math.inf, "best_step": 0, "since_best": 0}
        self.best_loss, self.best_step, self.since_best = state["best_loss"], state["best_step"], state["since_best"]
        self.mark = state.get("mark", self.best_loss)  # the loss that a gain must beat by min_delta

    def update(self, step: int, loss: float) -> bool:
        """Record an evaluation; True if it is the lowest so far."""
        if loss < self.mark - self.min_delta:
            self.mark, self.since_best = loss, 0
        else:
            self.since_best += 1
        if loss < self.best_loss:
            self.best_loss, self.best_step = loss, step
            return True
        return False

    @property
    def stop(self) -> bool:
        return self.patience > 0 and self.since_best >= self.patience

    def state(self) -> dict:
        return {"best_loss": self.best_loss, "best_step": self.best_step, "since_best": self.since_best,
                "mark": self.mark}


@dataclass(frozen=True)
class Cadence:
    """Every `every` steps, and at the last step of the run."""

    every: int
    last: int

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.last


class StopSignals:
    """While training, SIGINT and SIGTERM ask it to stop at the end of the current step, once that step is
    checkpointed, instead of losing the work since the last checkpoint. The first signal wins: one that follows
    (a wrapper that forwards Ctrl-C as well, a second Ctrl-C) waits for that checkpoint instead of abandoning it
    half way. The previous handlers come back on exit (train is also called from Python and by the suite
    runner)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: int | None = None
        self.repeated = 0  # signals after the first, which change nothing
        self.previous: dict = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # Python lets only the main thread set them
            self.previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum
            return
        if not self.repeated:  # os.write: print could re-enter a print that the signal interrupted
            os.write(2, b"already stopping: finishing the current step and writing its checkpoint (SIGKILL stops "
                        b"at once, losing the steps since the last checkpoint)\n")
        self.repeated += 1

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else "a signal to another rank"

    def exit(self) -> None:
        """Leave as the signal asked: KeyboardInterrupt for SIGINT (the CLI prints "interrupted" and exits
        130), SystemExit(143) for SIGTERM, the status a terminated process reports; a rank that a peer's
        signal stopped leaves as for SIGTERM."""
        if self.received == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + (self.received or signal.SIGTERM))


def train(cfg: RunConfig, resume: str | None = None, progress: bool = True, log=print,
          overrides: list[str] | None = None) -> dict:
    """Train cfg's model; resume='auto' continues from the run's newest intact checkpoint, a path from
    that checkpoint, with the checkpoint's config. Of the fields that overrides set (the command line's dotted
    ones; None: every field of cfg, a config made in Python), those a resumed run may change
    (``starting_point.RESUMABLE``) take cfg's value and any other that differs from the checkpoint's is refused.
    train.init_from starts a new run from a checkpoint's weights and model (fine-tuning). Under torchrun every
    rank calls this; see ``attnlab.distributed``. While training, the run folder is locked against a second
    training (see ``checkpoint.run_lock``). Returns a summary (final losses, tokens/s, run folder) with the
    trained model under "model": the model at the last step; with early stopping the losses are the best
    checkpoint's, which ``load_run`` loads. SIGINT and SIGTERM end it after the current step, which is
    checkpointed (see ``StopSignals``). cfg itself is left unchanged."""
    ranks = distributed.setup(cfg.train.device)
    try:
        with ExitStack() as held:  # the run folder's lock, from the set-up to the end
            return _train(cfg, resume, overrides, progress, log if ranks.main else (lambda *_: None), ranks, held)
    finally:
        distributed.teardown(ranks)


@dataclass
class Run:
    """The state of one training run, from its set-up through its steps, evaluations and checkpoints."""

    cfg: RunConfig  # as given, the checkpoint's on resume (its model when fine-tuning), sized to the data
    ranks: distributed.Ranks
    device: torch.device
    run_dir: Path
    corpus: object
    model: Decoder  # the model itself, whose weights the checkpoints hold
    trained: nn.Module  # what the steps run through: the model, or DDP around it, or the model sharded by FSDP
    optimizer: torch.optim.Optimizer
    log: Callable
    progress: bool  # a progress bar rather than a line per train.log_every steps
    data_rng: torch.Generator  # draws the training batches
    stopping: EarlyStopping
    step: int = 0  # steps done: the checkpoint's on resume
    decay_start: int | None = None  # wsd: the step where patience started the decay (None: the schedule's own)
    skipped: int = 0  # steps skipped for a non-finite loss or gradient
    metrics: MetricsLog | None = None  # rank 0 alone writes the log
    summary: dict = field(default_factory=dict)
    bar: tqdm | None = None
    started: float = 0.0  # when the first step began (time.perf_counter)
    earlier_seconds: float = 0.0  # on resume, the training time of earlier attempts up to the checkpoint
    clock: float = 0.0  # tokens/s is measured over the steps since the last log line, from this time ...
    window_tokens: int = 0  # ... and this count of tokens

    @property
    def last_step(self) -> int:
        """The step the run ends at unless patience stops it: train.steps, or under wsd the end of the decay
        that patience started (at most train.steps, which a resumed run may have lowered)."""
        t = self.cfg.train
        return t.steps if self.decay_start is None else min(t.steps, self.decay_start + t.decay_length)

    @property
    def logging(self) -> Cadence:
        """When the training loss and tokens/s are logged (train.log_every)."""
        return Cadence(self.cfg.train.log_every, self.last_step)

    @property
    def evaluation(self) -> Cadence:
        """When the validation loss is measured and early stopping counts it (train.eval_every)."""
        return Cadence(self.cfg.train.eval_every, self.last_step)

    @property
    def checkpoints(self) -> Cadence:
        """When a checkpoint is written, besides the best one and the last before a stop (train.ckpt_every)."""
        return Cadence(self.cfg.train.ckpt_every, self.last_step)

    @property
    def micro_batch(self) -> int:
        return self.cfg.train.batch_size // self.cfg.train.grad_accum

    @property
    def context(self) -> Context | None:
        """This rank's place in its group of ranks that split every sequence (None without context parallelism)."""
        return Context(self.ranks.context_group) if self.ranks.context > 1 else None

    def autocast(self):
        return _autocast(self.cfg.train.precision, self.device)

    def plain_copy(self) -> tuple[Decoder, torch.optim.Optimizer]:
        """A plain copy of the model and optimizer, for checkpoints of a sharded model."""
        plain = Decoder(self.cfg.model)
        return plain, _adamw(param_groups(plain, self.cfg.train), self.cfg.train, self.device)

    def say(self, line: str) -> None:
        """A line below the progress bar, or to the log when there is none."""
        (self.bar.write if self.progress else self.log)(line)


def _train(cfg: RunConfig, resume: str | None, overrides: list[str] | None, progress: bool, log,
           ranks: distributed.Ranks, held: ExitStack) -> dict:
    try:
        run = _set_up(cfg, resume, overrides, progress, log, ranks, held)
    except KeyboardInterrupt:  # Ctrl-C while the data loads or the model is built: nothing was trained
        log(f"interrupted during the set-up, before the first step: no {'new ' if resume else ''}checkpoint was "
            "written")
        raise
    interrupted = False
    with StopSignals() as stop, run.metrics or nullcontext():  # only rank 0 has a log to close
        for step in run.bar:
            loss, grad_norm, interrupted = _train_step(run, step, stop)
            if run.logging.due(run.step) and run.ranks.main:
                _log_progress(run, loss, grad_norm)
            best = run.evaluation.due(run.step) and _evaluate(run)
            _decay_if_patience_ran_out(run)
            finished = _stops_early(run)
            ending = finished or interrupted
            if best or ending or run.checkpoints.due(run.step):
                _save_checkpoint(run, best)
            if finished:
                _report_early_stop(run)
            if ending:
                break
        run.bar.close()
        if stop.received is not None or interrupted:  # each way out of the loop above wrote a checkpoint
            run.log(f"step {run.step}: stopped by {stop.name}; checkpoint {checkpoint.step_dir_name(run.step)} "
                    "written, continue with --resume auto")
            stop.exit()
    return _summarize(run)


# ---------------------------------------------------------------------------------------------------
# set-up and resume


def _set_up(cfg: RunConfig, resume: str | None, overrides: list[str] | None, progress: bool, log,
            ranks: distributed.Ranks, held: ExitStack) -> Run:
    """The run's data, model and optimizer, restored from the checkpoint when resuming (the weights of
    train.init_from when fine-tuning); its metrics log and progress bar open. Whatever refuses the run does so
    before the first step: a run folder that cannot be written or that another training holds before the model
    is built, a step too large for the memory after. The seeding and the order of these steps make a resumed
    run continue bit for bit."""
    run_dir = Path(cfg.out_dir) / cfg.name
    with distributed.refusals_once(ranks):
        if ranks.main:  # rank 0 alone writes the run folder
            _check_writable(run_dir, cfg.out_dir)
            try:
                held.enter_context(checkpoint.run_lock(run_dir))
            except OSError as err:  # a folder that cannot be made: under /proc, a name too long, ...
                raise ConfigError(f"out_dir={cfg.out_dir}: the run folder {run_dir} cannot be made ({err.strerror}); "
                                  "choose an out_dir= in a writable folder") from None
        cfg, ckpt, source = starting_point(cfg, run_dir, resume, overrides, log)
        t = cfg.train
        _check_ranks(t, ranks)
        device = ranks.device or pick_device(t.device)
        torch.manual_seed(t.seed)
        corpus = _load_data(cfg, checkpoint_tokenizer(cfg, ckpt or source, source is not None, overrides))
        _check_splits(corpus, t)
        if source is not None:
            check_tokenizer(corpus, source, t.init_from)
        # the sizes the model leaves to the data, as the checkpoints record them
        cfg = dataclasses.replace(cfg, model=cfg.model.fitted(corpus.vocab_size, getattr(corpus, "output_size", 0)))
        model = Decoder(cfg.model).to(device)
        _check_splits_sequences(model, cfg)
        _check_memory(model, cfg, device, ranks)
    ranks.split_sequences(t.context_parallel)
    step_cost.warn_if_expensive(model, cfg, device, log)  # an expensive configuration is reported before its first step
    if ckpt is not None or source is not None:
        checkpoint.load_weights(model, ckpt or source)
    if t.compile:
        model.compile_blocks(log)
    groups = param_groups(model, t)
    names = {id(p): n for n, p in model.named_parameters()}
    trained = distributed.wrap(model, ranks, t.fsdp)
    optimizer = _adamw(distributed.rebind(groups, model, names), t, device)
    run = Run(cfg, ranks, device, run_dir, corpus, model, trained, optimizer, log, progress,
              data_rng=torch.Generator().manual_seed(t.seed), stopping=EarlyStopping(t.patience, t.min_delta))
    if ckpt is not None:
        _restore(run, ckpt)
    elif source is not None:
        log(f"starting from the weights of {source} (train.init_from), with a fresh optimizer")
    _start(run, resumed=ckpt is not None)
    return run


def _autocast(precision: str, device: torch.device):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def _check_ranks(t: TrainConfig, ranks: distributed.Ranks) -> None:
    if ranks.world % t.context_parallel:
        raise ConfigError(f"train.context_parallel={t.context_parallel} does not divide the {ranks.world} "
                          "process(es): launch data x context_parallel processes (torchrun --nproc_per_node)")
    if t.context_parallel > 1 and t.compile:
        raise ConfigError(f"train.context_parallel={t.context_parallel} runs eager blocks only: set "
                          "train.compile=false")
    data_ranks = ranks.world // t.context_parallel  # each group of context_parallel ranks shares its rows
    micro_batch = t.batch_size // t.grad_accum  # drawn alike on every rank, which trains on its slice
    if micro_batch % data_ranks:
        raise ConfigError(f"train.batch_size / train.grad_accum = {micro_batch} must be divisible by the "
                          f"{data_ranks} data-parallel ranks; change train.batch_size or the number of processes")


def _check_splits_sequences(model: Decoder, cfg: RunConfig) -> None:
    """Under context parallelism every layer's mixer must split a sequence across ranks (with data.pack, packed
    documents too), and each shard (a sequence padded to a multiple of the ranks) must hold what the next one reads
    across the boundary: refused before the first step as a call would refuse it."""
    t = cfg.train
    if t.context_parallel == 1:
        return
    shard = -(-t.seq_len // t.context_parallel)
    for block in model.blocks:
        check_splits(block.mixer)
        halo = block.mixer.cfg.halo
        if halo is not None and shard < halo[0]:
            raise ConfigError(f"train.seq_len={t.seq_len} split across train.context_parallel={t.context_parallel} "
                              f"ranks gives shards of {shard} tokens, fewer than the {halo[0]} that "
                              f"{block.mixer.name}'s {halo[1]} reads across a shard's boundary: raise train.seq_len "
                              f"to at least {halo[0] * t.context_parallel} or lower train.context_parallel")


def _check_memory(model: Decoder, cfg: RunConfig, device: torch.device, ranks: distributed.Ranks) -> None:
    """A step of this rank's share of a micro-batch must fit in the device's memory (see ``step_cost.check_memory``)."""
    t = cfg.train
    shards = ranks.world if t.fsdp else 1  # FSDP splits the gradients and optimizer moments over the ranks
    step_cost.check_memory(model, cfg, device, t.batch_size // t.grad_accum // ranks.world, shards,
                           lambda: _autocast(t.precision, device))


def _check_writable(run_dir: Path, out_dir: str) -> None:
    """The run folder must be one that training can make and write in: refused now, not at its first checkpoint."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is a file, not a run folder; choose another name= or out_dir=")
    existing = next(folder for folder in (run_dir, *run_dir.parents) if folder.exists())
    if not existing.is_dir():
        raise ConfigError(f"out_dir={out_dir}: {existing} is a file, not a folder; choose another out_dir=")
    if os.access(existing, os.W_OK | os.X_OK):
        return
    if existing == run_dir:
        raise ConfigError(f"{run_dir} cannot be written (permission denied or a read-only file system), so no "
                          "checkpoint could be saved; make it writable, or copy the run to a writable out_dir= and "
                          "resume it there")
    raise ConfigError(f"out_dir={out_dir}: {existing} cannot be written (permission denied or a read-only file "
                      "system); choose another out_dir= or make it writable")


def _load_data(cfg: RunConfig, tokenizer=None):
    """The run's data, read with `tokenizer` where given (a text corpus continuing a checkpoint's); a token cache
    that cannot be written is refused naming the setting that moves it."""
    try:
        return load_data(cfg.data, cfg.train.seq_len, tokenizer)
    except NotInVocabulary as err:
        lacking = f"characters {err.characters!r} that the checkpoint's vocabulary of {err.vocab_size} lacks"
        if cfg.train.init_from is None:  # a resumed run's own text changed since its checkpoint
            raise UserError(f"the text now has {lacking}: it changed since the run's checkpoint, whose tokenizer reads "
                            "it; resume with the text the run was trained on") from None
        raise UserError(f"train.init_from={cfg.train.init_from}: the new text has {lacking}; fine-tuning reads it "
                        "with the checkpoint's tokenizer: remove them from the text, or train both runs with "
                        "data.tokenizer=byte") from None
    except OSError as err:
        cache = user_path(cfg.data.cache_dir) if cfg.data.cache_dir else default_cache_dir()
        if err.filename is None or not Path(err.filename).resolve().is_relative_to(cache.resolve()):
            raise
        raise ConfigError(f"data.cache_dir={cache}: the token cache cannot be written there ({err.strerror}); give "
                          "a writable data.cache_dir= (or set $ATTNLAB_CACHE)") from None


def _adamw(groups: list[dict], t: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), fused=device.type == "cuda")


def _restore(run: Run, ckpt: Path) -> None:
    """The optimizer, step, random streams, early-stopping count and wsd decay start of the checkpoint resumed from."""
    t = run.cfg.train
    optimizer_state = checkpoint.load_state(ckpt / "optimizer.pt", run.device)
    distributed.load_optimizer(run.model, run.optimizer, optimizer_state, run.ranks, run.plain_copy)
    state = checkpoint.load_state(ckpt / "train_state.pt")
    run.step = state["step"]
    run.data_rng.set_state(state["data_rng"])
    torch.set_rng_state(state["torch_rng"])
    run.stopping = EarlyStopping(t.patience, t.min_delta, state.get("early_stopping"))
    run.decay_start = state.get("decay_start")  # checkpoints written before wsd have none: the schedule's own
    run.earlier_seconds = state.get("train_seconds", 0.0)  # checkpoints written before it counted time: unknown
    _reconcile_best(run.run_dir, run.stopping if t.patience > 0 else None)
    if run.device.type == "cuda" and state.get("cuda_rng") is not None and run.ranks.world == 1:
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    run.log(f"resuming {run.run_dir} from {ckpt.name}")


def _start(run: Run, resumed: bool) -> None:
    """The start of the steps: the line describing the run, (on rank 0) its metrics log and sinks, the summary
    to fill, the model in training mode, the progress bar and the tokens/s clock."""
    cfg, ranks = run.cfg, run.ranks
    split = f", every sequence split across {ranks.context}" if ranks.context > 1 else ""
    where = f"{ranks.world} ranks ({'FSDP' if ranks.sharded else 'DDP'}{split})" if ranks.world > 1 else \
        f"device {run.device}"
    run.log(f"{cfg.name}: {run.model.num_params():,} parameters, mixers {', '.join(cfg.model.layer_mixers())}, "
            f"{where}; {run.corpus.describe()}")
    if cfg.data.pack:
        documents = len(run.corpus.document_bounds("train")) - 1
        run.log(f"packed documents: {documents:,} training documents in rows of {cfg.train.seq_len} tokens, each "
                "read from its own start; no target is predicted across a document boundary")
    if ranks.main:
        resume_step = run.step if resumed else None
        sinks = loggers.open_sinks(cfg.train.log_to, run.run_dir, cfg.to_dict(), resume_step)
        run.metrics = MetricsLog(run.run_dir / "metrics.jsonl", resume_step, sinks)
    run.summary = {"run_dir": str(run.run_dir), "params": run.model.num_params(), "model": run.model}
    run.trained.train()
    last = run.step if _stops_early(run) else run.last_step  # a run that stopped early stays stopped
    run.bar = tqdm(range(run.step, last), initial=run.step, total=cfg.train.steps,
                   disable=not (run.progress and ranks.main), desc=cfg.name, dynamic_ncols=True)
    run.started = run.clock = time.perf_counter()


# ---------------------------------------------------------------------------------------------------
# one training step


def _train_step(run: Run, step: int, stop: StopSignals) -> tuple[float, float, bool]:
    """One optimizer step over train.grad_accum micro-batches. Returns the batch's mean loss, the gradient
    norm before clipping, and whether a signal at any rank asked training to stop."""
    t = run.cfg.train
    multiplier = lr_multiplier(step, t, run.decay_start)
    for group in run.optimizer.param_groups:
        group["lr"] = group["peak_lr"] * multiplier
    loss_share = _accumulate_gradients(run)
    # a signal at any rank stops them all after this step: its vote travels in the loss's one reduction
    asked = torch.full((), float(stop.received is not None), device=run.device)
    share_mean, votes = distributed.mean(torch.stack((loss_share, asked)), run.ranks)
    loss_mean = share_mean * run.ranks.world  # the ranks' shares sum to the batch's mean loss
    grad_norm = nn.utils.get_total_norm([p.grad for p in run.trained.parameters() if p.grad is not None])
    full_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: DTensor
    loss, norm, votes = torch.stack((loss_mean, full_norm.float(), votes)).tolist()  # 1 host sync
    run.step = step + 1
    _apply_gradients(run, loss, norm, grad_norm)
    run.window_tokens += t.batch_size * t.seq_len
    return loss, norm, votes > 0


def _accumulate_gradients(run: Run) -> torch.Tensor:
    """The forward and backward passes of the step's micro-batches; this rank's share of the step's loss, on the
    device. The step's loss is the mean over every target the whole batch scores: each micro-batch's summed
    loss is divided by the batch's count of scored targets, which every rank knows (all draw the batch alike),
    so that micro-batches and ranks that score different numbers of targets (packed rows, ignored targets)
    train as one process with the whole batch would."""
    t, ranks = run.cfg.train, run.ranks
    micro_batches = [_micro_batch(run) for _ in range(t.grad_accum)]
    scored = max(1, sum(count for *_, count in micro_batches))  # a batch that scores nothing adds nothing
    share = torch.zeros((), device=run.device)
    for micro, (x, y, cu_seqlens, _) in enumerate(micro_batches):
        last = micro == t.grad_accum - 1  # DDP averages gradients over the ranks once, at the last one
        with nullcontext() if last or ranks.sharded or ranks.world == 1 else run.trained.no_sync():
            with run.autocast():
                loss = _loss(run.trained, to_device(x, run.device), to_device(y, run.device), cu_seqlens,
                             run.context)
            (loss * (ranks.world / scored)).backward()  # times the ranks, whose gradients DDP and FSDP average
        share += loss.detach().float() / scored
    return share


def _micro_batch(run: Run):
    """This rank's share of a micro-batch drawn alike on every rank: (inputs, targets, None) of windows cut from
    the token stream, or with data.pack its rows of whole documents as one packed row and its boundaries; and
    the number of targets the whole micro-batch scores."""
    t, ranks = run.cfg.train, run.ranks
    if not run.cfg.data.pack:
        x, y = run.corpus.batch("train", run.micro_batch, t.seq_len, run.data_rng)
        mine, targets = (distributed.my_share(batch, ranks) for batch in (x, y))
        return distributed.my_shard(mine, ranks, 0), distributed.my_shard(targets, ranks, IGNORE), None, \
            scored_targets(y)
    x, y, cu_seqlens = run.corpus.packed_batch("train", run.micro_batch, t.seq_len, run.data_rng)
    share = run.micro_batch // ranks.data_world
    rows = slice(ranks.data_rank * share, (ranks.data_rank + 1) * share)
    mine, targets, cu_seqlens = packed_rows(x, y, cu_seqlens, rows)
    if ranks.context > 1:  # the packed row split along time: the padding at its end joins its last document
        mine, targets = distributed.my_shard(mine, ranks, 0), distributed.my_shard(targets, ranks, IGNORE)
        cu_seqlens = torch.cat((cu_seqlens[:-1], cu_seqlens.new_full((1,), mine.shape[1] * ranks.context)))
    return mine, targets, cu_seqlens.to(run.device), scored_targets(y)


def _apply_gradients(run: Run, loss: float, norm: float, grad_norm: torch.Tensor) -> None:
    """The optimizer step on the clipped gradients; a step whose loss or gradient is not finite is skipped
    (at most train.skip_non_finite of them) or ends training, keeping the last good checkpoint."""
    t = run.cfg.train
    bad = _first_non_finite(loss, norm, run.model)  # before clipping, which would spread a nan
    if bad is None:
        if t.grad_clip > 0:
            nn.utils.clip_grads_with_norm_(run.trained.parameters(), t.grad_clip, grad_norm)
        run.optimizer.step()
    elif run.skipped >= t.skip_non_finite:
        kept = checkpoint.list_checkpoints(run.run_dir)
        where = (f"the last good checkpoint, {kept[-1][1].name}, is kept" if kept else
                 f"no checkpoint exists yet (the first was due at step {min(t.ckpt_every, t.steps)})")
        raise UserError(f"training diverged at step {run.step}: {bad} is not finite (nan or inf); {where}. Lower "
                        f"train.lr (now {t.lr}), check the data, or let train.skip_non_finite=N skip up to N such "
                        "steps")
    else:
        run.skipped += 1
        run.log(f"step {run.step}: {bad} is not finite; step skipped ({run.skipped} of at most "
                f"{t.skip_non_finite})")
    run.optimizer.zero_grad(set_to_none=True)


def _log_progress(run: Run, loss: float, grad_norm: float) -> None:
    """The training loss and the tokens/s since the last log line (rank 0)."""
    now = time.perf_counter()
    tokens_per_s = run.window_tokens / (now - run.clock)
    run.clock, run.window_tokens = now, 0
    run.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_s:,.0f}")
    run.metrics.write(step=run.step, loss=loss, lr=run.optimizer.param_groups[0]["lr"], tokens_per_s=tokens_per_s,
                      grad_norm=grad_norm)
    run.summary.update(train_loss=loss, tokens_per_s=tokens_per_s)
    if not run.progress:  # no bar to show the loss: one line per log_every steps instead
        run.log(f"step {run.step}: loss {loss:.3f}, {tokens_per_s:,.0f} tokens/s")


# ---------------------------------------------------------------------------------------------------
# evaluation, checkpoints and the summary


def _evaluate(run: Run) -> bool:
    """The validation loss, logged and counted by early stopping. True when it is the lowest so far and early
    stopping keeps the best checkpoint."""
    val = _validation_loss(run)  # every rank evaluates the same batches (a sharded model needs them all)
    best = run.stopping.update(run.step, val) and run.cfg.train.patience > 0
    if run.ranks.main:
        run.metrics.write(step=run.step, val_loss=val, val_ppl=perplexity(val))
        run.say(f"step {run.step}: val loss {val:.4f} (perplexity {perplexity(val):.2f})")
    run.summary.update(val_loss=val, val_ppl=perplexity(val))
    return best


def _validation_loss(run: Run) -> float:
    t = run.cfg.train
    # the windows of whole batches, evaluated a micro-batch at a time: the loss does not depend on grad_accum
    return split_loss(run.model, run.corpus, "val", t.eval_batches, t.batch_size, t.seq_len, run.device,
                      run.autocast, chunk=run.micro_batch, packed=run.cfg.data.pack)


def _save_checkpoint(run: Run, best: bool) -> None:
    """The checkpoint of the current step (every rank takes part: FSDP gathers the shards); rank 0 writes it,
    marks it as the best if it is, and deletes the ones beyond train.keep_last."""
    train_state = {
        "step": run.step,
        "data_rng": run.data_rng.get_state(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if run.device.type == "cuda" else None,
        "early_stopping": run.stopping.state(),
        "decay_start": run.decay_start,
        "train_seconds": run.earlier_seconds + time.perf_counter() - run.started,
    }
    full_model, full_optimizer = distributed.full_state(run.model, run.optimizer, run.ranks, run.plain_copy)
    if run.ranks.main:
        checkpoint.save_checkpoint(run.run_dir, run.step, full_model, full_optimizer, train_state, run.cfg.to_dict(),
                                   run.corpus.tokenizer.to_dict())
        if best:
            checkpoint.mark_best(run.run_dir, run.step, run.stopping.best_loss)
        checkpoint.prune_checkpoints(run.run_dir, run.cfg.train.keep_last)


def _decay_if_patience_ran_out(run: Run) -> None:
    """Under wsd, patience running out before the schedule's own decay starts the decay at this step instead of
    stopping the run, which stops when the decay ends (before the cap: it starts before train.steps - D)."""
    t = run.cfg.train
    if t.schedule != "wsd" or run.decay_start is not None or not run.stopping.stop:
        return
    if run.step >= t.steps - t.decay_length:  # the schedule's own decay is under way and ends at the cap
        return
    run.decay_start = run.step
    if run.ranks.main:
        run.metrics.write(step=run.step, decay="patience", best_step=run.stopping.best_step)
        run.say(f"step {run.step}: no significant gain in validation loss in {t.patience} evaluations; decaying "
                f"the learning rate to train.min_lr over {t.decay_length} steps, then stopping at step {run.last_step}")


def _stops_early(run: Run) -> bool:
    """Whether early stopping ends the run at this step: patience ran out (cosine), or the decay it started has
    ended (wsd)."""
    if run.cfg.train.schedule == "wsd":
        return run.decay_start is not None and run.step >= run.last_step
    return run.stopping.stop


def _report_early_stop(run: Run) -> None:
    if run.ranks.main:
        t, best = run.cfg.train, run.stopping.best_step
        run.metrics.write(step=run.step, stopped="patience", best_step=best)
        why = (f"the learning rate's decay, started at step {run.decay_start} when patience ran out, has ended"
               if t.schedule == "wsd" else f"no significant gain in validation loss in {t.patience} evaluations")
        run.say(f"step {run.step}: {why}; stopping (the best checkpoint is step {best})")


def _summarize(run: Run) -> dict:
    """The run's summary: its last losses and throughput, or with early stopping its best checkpoint's losses."""
    summary, stopping = run.summary, run.stopping
    summary["earlier_seconds"] = run.earlier_seconds
    summary["train_seconds"] = run.earlier_seconds + time.perf_counter() - run.started  # every attempt's steps
    summary["steps"] = run.step
    if run.cfg.train.patience > 0 and stopping.best_step > 0:  # the run's result is its best checkpoint (load_run)
        summary.update(best_step=stopping.best_step, val_loss=stopping.best_loss,
                       val_ppl=perplexity(stopping.best_loss))
    if "val_loss" not in summary:  # resumed at the last step: nothing left to train
        summary.update(val_loss=_validation_loss(run))
        summary["val_ppl"] = perplexity(summary["val_loss"])
    summary["skipped_steps"] = run.skipped
    return summary


def _check_splits(corpus, t: TrainConfig) -> None:
    """Training draws windows of train.seq_len tokens plus the next one from the train split, every evaluation
    from the val split: a split too short for one fails here, not at the first evaluation after training."""
    if not isinstance(corpus, TokenCorpus):  # the tasks generate their examples at train.seq_len
        return
    train_split = corpus.split("train")
    if len(train_split) and _one_token(train_split):  # it would train to a loss of 0 and learn nothing
        symbol = corpus.tokenizer.decode([int(train_split[0])])
        raise ConfigError(f"the training split is one token repeated ({symbol!r}, {len(train_split):,} times): there "
                          "is nothing to predict; use text with more than one distinct symbol (data.path, "
                          "data.max_chars)")
    for split, fix in (("train", "lower data.val_fraction"), ("val", "raise data.val_fraction")):
        tokens = len(corpus.split(split))
        if tokens <= t.seq_len:
            raise ConfigError(f"the {split} split has {tokens:,} tokens, too few for one window of train.seq_len="
                              f"{t.seq_len} ({t.seq_len + 1} tokens); lower train.seq_len, {fix} or use more text")


def _one_token(tokens, block: int = 1 << 20) -> bool:
    """Whether every token is the first one, read a block at a time: ordinary text differs within its first."""
    first = tokens[0]
    return all((tokens[i : i + block] == first).all() for i in range(0, len(tokens), block))


def _reconcile_best(run_dir: Path, stopping: EarlyStopping | None) -> None:
    """On resume, best.json names the best checkpoint of the trajectory being continued (a crash may have
    come between a checkpoint and its mark, or an older checkpoint may be resumed); without early stopping
    the run is measured at its newest checkpoint, so there is no best."""
    kept = stopping is not None and (run_dir / checkpoint.step_dir_name(stopping.best_step)).is_dir()
    if kept and stopping.best_step:
        checkpoint.mark_best(run_dir, stopping.best_step, stopping.best_loss)
    else:
        (run_dir / checkpoint.BEST).unlink(missing_ok=True)


def _first_non_finite(loss: float, grad_norm: float, model: nn.Module) -> str | None:
    """What went non-finite first: the loss, else the gradient of the first parameter (in model order)."""
    if not math.isfinite(loss):
        return f"the loss ({loss})"
    if math.isfinite(grad_norm):
        return None
    for name, param in model.named_parameters():
        if param.grad is not None and not torch.isfinite(param.grad).all():
            return f"the gradient of {name}"
    return "the gradient norm"


def _loss(trained: nn.Module, tokens: torch.Tensor, targets: torch.Tensor,
          cu_seqlens: torch.Tensor | None = None, context: Context | None = None) -> torch.Tensor:
    """Next-token cross-entropy summed over the scored targets, through the trained module's forward (DDP and FSDP
    hook into it); under a context, over this rank's shard of the sequences."""
    logits, _ = trained(tokens, cu_seqlens=cu_seqlens, keep_states=False, context=context)
    return next_token_loss(logits, targets, reduction="sum")


def scored_targets(targets: torch.Tensor) -> int:
    """How many targets a batch scores (those not ignored)."""
    return int((targets != IGNORE).sum())
