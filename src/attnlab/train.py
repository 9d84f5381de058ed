"""The training loop: AdamW with parameter groups, warmup + cosine, clipping, accumulation, periodic
evaluation with optional early stopping, a JSONL metrics log and checkpoints that resume bit for bit."""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from . import checkpoint, cost, distributed, loggers
from .config import RunConfig, TrainConfig, from_dict
from .data import TokenCorpus, load_data
from .errors import ConfigError, UserError
from .evaluate import perplexity, split_loss, to_device
from .model import Decoder


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} but no CUDA device is available; use train.device=cpu")
    return torch.device(name)


def param_groups(model: nn.Module, cfg: TrainConfig) -> list[dict]:
    """Weight decay on matrices only: not on norms, biases or embeddings (nor the head tied to them).
    Parameters marked with ``attnlab.nn.set_optim`` get their own group."""
    groups: dict[tuple, list] = {}
    seen: set[int] = set()
    for module in model.modules():
        for param in module.parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                continue
            seen.add(id(param))
            decays = param.ndim >= 2 and not isinstance(module, nn.Embedding)
            options = getattr(param, "_optim", {})
            lr = min(options.get("lr", cfg.lr), options.get("max_lr", float("inf")))
            key = (lr, options.get("weight_decay", cfg.weight_decay if decays else 0.0))
            groups.setdefault(key, []).append(param)
    return [{"params": ps, "peak_lr": lr, "weight_decay": wd} for (lr, wd), ps in groups.items()]


def lr_multiplier(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to 1, then cosine decay to min_lr / lr at the last step."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    floor = cfg.min_lr / cfg.lr
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


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


class StopSignals:
    """While training, SIGINT and SIGTERM ask it to stop at the end of the current step, once that step is
    checkpointed, instead of losing the work since the last checkpoint; a second signal stops at once. The
    previous handlers come back on exit (train is also called from Python and by the suite runner)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: int | None = None
        self.previous: dict = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # Python lets only the main thread set them
            self.previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python

    def _handle(self, signum, frame) -> None:
        if self.received is not None:
            raise KeyboardInterrupt  # asked twice: stop now; the checkpoints on disk stay intact
        self.received = signum

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


def build_model(cfg: RunConfig, data) -> Decoder:
    """The decoder for cfg.model, its vocabulary (and pointer-head size) taken from the data when unset."""
    vocab_size = data.vocab_size
    if cfg.model.vocab_size == 0:
        cfg.model.vocab_size = vocab_size
    elif cfg.model.vocab_size < vocab_size:
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the data's {vocab_size}; "
                          "set it to 0 to take the data's")
    output_size = getattr(data, "output_size", None)
    if output_size is not None and cfg.model.output_size == 0:
        cfg.model.output_size = output_size
        cfg.model.tie_embeddings = False  # a pointer head scores positions, not tokens
    return Decoder(cfg.model)


def train(cfg: RunConfig, resume: str | None = None, progress: bool = True, log=print) -> dict:
    """Train cfg's model; resume='auto' continues from the run's newest intact checkpoint, a path from
    that checkpoint. Under torchrun every rank calls this; see ``attnlab.distributed``. Returns a summary
    (final losses, tokens/s, run folder) with the trained model under "model": the model at the last step;
    with early stopping the losses are the best checkpoint's, which ``load_run`` loads. SIGINT and SIGTERM end it
    after the current step, which is checkpointed (see ``StopSignals``)."""
    ranks = distributed.setup(cfg.train.device)
    try:
        return _train(cfg, resume, progress, log, ranks)
    finally:
        distributed.teardown(ranks)


def _train(cfg: RunConfig, resume: str | None, progress: bool, log, ranks: distributed.Ranks) -> dict:
    t = cfg.train
    log = log if ranks.main else (lambda *_: None)
    run_dir = Path(cfg.out_dir) / cfg.name
    ckpt = _resume_point(run_dir, resume, log)
    if ckpt is not None:  # the model and data must be the checkpoint's; train settings may change
        saved = from_dict(RunConfig, checkpoint.load_config(ckpt)).validate()
        _check_same_run(saved, cfg, ckpt)
        cfg.model = saved.model
    micro_batch = t.batch_size // t.grad_accum  # drawn alike on every rank, which trains on its slice
    if micro_batch % ranks.world:
        raise ConfigError(f"train.batch_size / train.grad_accum = {micro_batch} must be divisible by the "
                          f"{ranks.world} ranks; change train.batch_size or the number of processes")

    device = ranks.device or pick_device(t.device)
    torch.manual_seed(t.seed)
    corpus = load_data(cfg.data, t.seq_len)
    _check_splits(corpus, t)
    model = build_model(cfg, corpus).to(device)
    cost.warn_if_expensive(model, cfg, device, log)  # an expensive configuration is reported before its first step
    if ckpt is not None:
        checkpoint.load_weights(model, ckpt)
    if t.compile:
        model.compile_blocks(log)
    groups = param_groups(model, t)
    names = {id(p): n for n, p in model.named_parameters()}
    trained = distributed.wrap(model, ranks, t.fsdp)

    def new_optimizer(groups):
        return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), fused=device.type == "cuda")

    def twin():  # a plain copy of the model and optimizer, for checkpoints of a sharded model
        plain = build_model(cfg, corpus)
        return plain, new_optimizer(param_groups(plain, t))

    optimizer = new_optimizer(distributed.rebind(groups, model, names))
    data_rng = torch.Generator().manual_seed(t.seed)
    start, stopping = 0, EarlyStopping(t.patience, t.min_delta)
    if ckpt is not None:
        distributed.load_optimizer(model, optimizer, checkpoint.load_state(ckpt / "optimizer.pt", device), ranks,
                                   twin)
        state = checkpoint.load_state(ckpt / "train_state.pt")
        start = state["step"]
        data_rng.set_state(state["data_rng"])
        torch.set_rng_state(state["torch_rng"])
        stopping = EarlyStopping(t.patience, t.min_delta, state.get("early_stopping"))
        _reconcile_best(run_dir, stopping if t.patience > 0 else None)
        if device.type == "cuda" and state.get("cuda_rng") is not None and ranks.world == 1:
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        log(f"resuming {run_dir} from {ckpt.name}")
    where = f"{ranks.world} ranks ({'FSDP' if ranks.sharded else 'DDP'})" if ranks.world > 1 else f"device {device}"
    log(f"{cfg.name}: {model.num_params():,} parameters, mixers {', '.join(cfg.model.layer_mixers())}, "
        f"{where}; {corpus.describe()}")

    metrics = None  # rank 0 alone writes the log
    if ranks.main:
        resume_step = start if ckpt is not None else None
        sinks = loggers.open_sinks(t.log_to, run_dir, cfg.to_dict(), resume_step)
        metrics = MetricsLog(run_dir / "metrics.jsonl", resume_step, sinks)
    autocast = partial(torch.autocast, device.type, dtype=torch.bfloat16) if t.precision == "bf16" else nullcontext
    tokens_per_step = t.batch_size * t.seq_len
    evaluate = partial(split_loss, model, corpus, "val", t.eval_batches, micro_batch, t.seq_len, device, autocast)

    summary = {"run_dir": str(run_dir), "params": model.num_params(), "model": model}
    trained.train()
    last = start if stopping.stop else t.steps  # a run that stopped early stays stopped
    bar = tqdm(range(start, last), initial=start, total=t.steps, disable=not (progress and ranks.main),
               desc=cfg.name, dynamic_ncols=True)
    clock, window_tokens = time.perf_counter(), 0
    train_start, skipped, done = clock, 0, start
    interrupted = False
    with StopSignals() as stop, metrics or nullcontext():  # only rank 0 has a log to close
        for step in bar:
            multiplier = lr_multiplier(step, t)
            for group in optimizer.param_groups:
                group["lr"] = group["peak_lr"] * multiplier
            loss_sum = torch.zeros((), device=device)
            for micro in range(t.grad_accum):
                batch = corpus.batch("train", micro_batch, t.seq_len, data_rng)
                x, y = (distributed.my_share(b, ranks) for b in batch)
                last = micro == t.grad_accum - 1  # DDP averages gradients over the ranks once, at the last one
                with nullcontext() if last or ranks.sharded or ranks.world == 1 else trained.no_sync():
                    with autocast():
                        loss = _loss(trained, to_device(x, device), to_device(y, device))
                    (loss / t.grad_accum).backward()
                loss_sum += loss.detach().float()
            # a signal at any rank stops them all after this step: its vote travels in the loss's one reduction
            asked = torch.full((), float(stop.received is not None), device=device)
            loss_mean, votes = distributed.mean(torch.stack((loss_sum / t.grad_accum, asked)), ranks)
            grad_norm = nn.utils.get_total_norm([p.grad for p in trained.parameters() if p.grad is not None])
            full_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: DTensor
            loss_value, norm_value, votes = torch.stack((loss_mean, full_norm.float(), votes)).tolist()  # 1 host sync
            interrupted = votes > 0
            bad = _first_non_finite(loss_value, norm_value, model)  # before clipping, which would spread a nan
            done = step + 1
            if bad is None and t.grad_clip > 0:
                nn.utils.clip_grads_with_norm_(trained.parameters(), t.grad_clip, grad_norm)
            if bad is not None:
                if skipped >= t.skip_non_finite:
                    raise UserError(f"training diverged at step {done}: {bad} is not finite (nan or inf); the last "
                                    f"good checkpoint is kept. Lower train.lr (now {t.lr}), check the data, or let "
                                    "train.skip_non_finite=N skip up to N such steps")
                skipped += 1
                log(f"step {done}: {bad} is not finite; step skipped ({skipped} of at most {t.skip_non_finite})")
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            window_tokens += tokens_per_step

            if (done % t.log_every == 0 or done == t.steps) and ranks.main:
                now = time.perf_counter()
                tokens_per_s = window_tokens / (now - clock)
                clock, window_tokens = now, 0
                bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{tokens_per_s:,.0f}")
                metrics.write(step=done, loss=loss_value, lr=optimizer.param_groups[0]["lr"],
                              tokens_per_s=tokens_per_s, grad_norm=norm_value)
                summary.update(train_loss=loss_value, tokens_per_s=tokens_per_s)
                if not progress:  # no bar to show the loss: one line per log_every steps instead
                    log(f"step {done}: loss {loss_value:.3f}, {tokens_per_s:,.0f} tokens/s")
            best = False
            if done % t.eval_every == 0 or done == t.steps:
                val = evaluate()  # every rank evaluates the same batches (a sharded model needs them all)
                best = stopping.update(done, val) and t.patience > 0
                if ranks.main:
                    metrics.write(step=done, val_loss=val, val_ppl=perplexity(val))
                    (bar.write if progress else log)(f"step {done}: val loss {val:.4f} "
                                                     f"(perplexity {perplexity(val):.2f})")
                summary.update(val_loss=val, val_ppl=perplexity(val))
            if done % t.ckpt_every == 0 or done == t.steps or best or stopping.stop or interrupted:
                train_state = {
                    "step": done,
                    "data_rng": data_rng.get_state(),
                    "torch_rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state_all() if device.type == "cuda" else None,
                    "early_stopping": stopping.state(),
                }
                full_model, full_optimizer = distributed.full_state(model, optimizer, ranks, twin)
                if ranks.main:
                    checkpoint.save_checkpoint(run_dir, done, full_model, full_optimizer, train_state,
                                               cfg.to_dict(), corpus.tokenizer.to_dict())
                    if best:
                        checkpoint.mark_best(run_dir, done, val)
                    checkpoint.prune_checkpoints(run_dir, t.keep_last)
            if stopping.stop:
                if ranks.main:
                    metrics.write(step=done, stopped="patience", best_step=stopping.best_step)
                    (bar.write if progress else log)(f"step {done}: no significant gain in validation loss in "
                                                     f"{t.patience} evaluations; stopping (the best checkpoint is "
                                                     f"step {stopping.best_step})")
                break
            if interrupted:
                break
        bar.close()
        if stop.received is not None or interrupted:  # each way out of the loop above wrote a checkpoint at `done`
            log(f"step {done}: stopped by {stop.name}; checkpoint {checkpoint.step_dir_name(done)} written, continue "
                "with --resume auto")
            stop.exit()
    summary["train_seconds"] = time.perf_counter() - train_start
    summary["steps"] = done
    if t.patience > 0 and stopping.best_step > 0:  # the run's result is its best checkpoint, which load_run picks
        summary.update(best_step=stopping.best_step, val_loss=stopping.best_loss,
                       val_ppl=perplexity(stopping.best_loss))
    if "val_loss" not in summary:  # resumed at the last step: nothing left to train
        summary.update(val_loss=evaluate())
        summary["val_ppl"] = perplexity(summary["val_loss"])
    summary["skipped_steps"] = skipped
    return summary


def _check_splits(corpus, t: TrainConfig) -> None:
    """Training draws windows of train.seq_len tokens plus the next one from the train split, every evaluation
    from the val split: a split too short for one fails here, not at the first evaluation after training."""
    if not isinstance(corpus, TokenCorpus):  # the tasks generate their examples at train.seq_len
        return
    for split, fix in (("train", "lower data.val_fraction"), ("val", "raise data.val_fraction")):
        tokens = len(corpus.split(split))
        if tokens <= t.seq_len:
            raise ConfigError(f"the {split} split has {tokens:,} tokens, too few for one window of train.seq_len="
                              f"{t.seq_len} ({t.seq_len + 1} tokens); lower train.seq_len, {fix} or use more text")


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


def _loss(trained: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy through the trained module's forward (DDP and FSDP hook into it)."""
    logits, _ = trained(tokens)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)


def _resume_point(run_dir: Path, resume: str | None, log) -> Path | None:
    if resume is None:
        if checkpoint.list_checkpoints(run_dir):
            raise UserError(f"{run_dir} already holds checkpoints; pass --resume auto to continue it, "
                            "or choose another run name (name=...)")
        return None
    if resume == "auto":
        found = checkpoint.latest_checkpoint(run_dir, warn=log)
        if found is None:
            log(f"no checkpoint in {run_dir} to resume from; starting from scratch")
        return found
    return checkpoint.resolve_checkpoint(resume, best=False)  # a run folder continues from its newest


def _check_same_run(saved: RunConfig, given: RunConfig, ckpt: Path) -> None:
    old, new = saved.to_dict(), given.to_dict()
    if new["model"]["vocab_size"] == 0:  # 0 means "the tokenizer's", which the checkpoint recorded
        new["model"]["vocab_size"] = old["model"]["vocab_size"]
    if new["model"]["output_size"] == 0 and old["model"]["output_size"]:  # a pointer head the data chose
        new["model"]["output_size"] = old["model"]["output_size"]
        new["model"]["tie_embeddings"] = old["model"]["tie_embeddings"]
    changed = [f"{section}.{key}" for section in ("model", "data") for key in old[section]
               if key != "cache_dir" and old[section][key] != new[section][key]]
    if changed:
        raise UserError(f"cannot resume from {ckpt}: {', '.join(changed)} differ from the checkpoint's config; "
                        "resume with the same model and data settings, or start a new run (name=...)")
