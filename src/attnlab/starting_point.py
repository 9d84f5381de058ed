"""Where a training run starts: from scratch, from the checkpoint it resumes, or from train.init_from's weights
(fine-tuning). A resumed run takes that checkpoint's config, of which the command line may change only what
RESUMABLE lists; fine-tuning takes the weights and model of train.init_from, and may change only FINE_TUNABLE."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import yaml

from . import checkpoint
from .config import RunConfig, upgraded_key
from .data import TASKS, tokenizer_from_dict
from .data.tokenizer import describe, difference
from .errors import UserError
from .typed import from_dict


def resume_point(run_dir: Path, resume: str | None, log) -> Path | None:
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


def as_fitted(given: RunConfig, saved: RunConfig) -> RunConfig:
    """given with the model sizes it leaves to the data (0) taken from saved, a checkpoint's config, which
    records them as the data fixed them."""
    return dataclasses.replace(given, model=given.model.fitted(saved.model.vocab_size, saved.model.output_size))


# what a resumed run may change: how long it trains (its warmup, which a preset's shortened run caps at half of the
# steps, with them), how it evaluates, logs, checkpoints and stops early, how its arithmetic runs and where its
# token cache is; any other change would make it another run
RESUMABLE = ("train.steps", "train.warmup_steps", "train.eval_every", "train.log_every", "train.ckpt_every",
             "train.keep_last", "train.patience", "train.min_delta", "train.skip_non_finite", "train.grad_accum",
             "train.precision", "train.device", "train.fsdp", "train.context_parallel", "train.compile", "train.log_to",
             "data.cache_dir")
FINE_TUNABLE = ("model.dropout",)  # what fine-tuning may change of the model it starts from


def starting_point(cfg: RunConfig, run_dir: Path, resume: str | None, overrides: list[str] | None,
                    log) -> tuple[RunConfig, Path | None, Path | None]:
    """The run's config and where its weights come from: (config, the checkpoint it resumes, None) continuing
    the checkpoint's config, (config, None, the checkpoint of train.init_from) with that checkpoint's model, or
    (cfg, None, None) for a run from scratch."""
    ckpt = resume_point(run_dir, resume, log)
    if ckpt is not None:
        resumable = ", ".join(RESUMABLE)
        advice = (f"repeat the checkpoint's values or leave them out (a resumed run may change only {resumable}), "
                  "or start a new run with another name=")
        return _inherit(cfg, ckpt, overrides, lambda key: key not in ("name", "out_dir"), RESUMABLE,
                        f"cannot resume from {ckpt}", advice), ckpt, None
    if cfg.train.init_from is None:
        return cfg, None, None
    try:
        source = checkpoint.resolve_checkpoint(cfg.train.init_from)
    except UserError as err:
        raise UserError(f"train.init_from={cfg.train.init_from}: {err}") from None
    advice = (f"a fine-tuned model is the checkpoint's: repeat its values or leave them out (only "
              f"{', '.join(FINE_TUNABLE)} may change)")
    return _inherit(cfg, source, overrides, lambda key: key.startswith("model."), FINE_TUNABLE,
                    f"train.init_from={cfg.train.init_from}", advice), None, source


def _inherit(given: RunConfig, ckpt: Path, overrides: list[str] | None, taken: Callable[[str], bool],
             changeable: tuple[str, ...], context: str, advice: str) -> RunConfig:
    """given with the fields that `taken` selects set to those of the checkpoint's config, except the
    changeable ones that overrides set. A taken field that overrides set to another value than the checkpoint's
    is refused, with all such fields in one line."""
    saved = from_dict(RunConfig, checkpoint.load_config(ckpt))  # what is taken is validated with the rest below
    old, new = _fields(saved), _fields(as_fitted(given, saved))
    asked = _set_by(overrides, new)
    kept = {key for key in new if taken(key) and not (key in changeable and key in asked)}
    clashes = sorted(key for key in asked & kept if new[key] != old[key])
    if clashes:
        verb = "differs" if len(clashes) == 1 else "differ"
        raise UserError(f"{context}: {_listing(clashes, new)} {verb} from the checkpoint's {_listing(clashes, old)}; "
                        f"{advice}")
    return _config({key: old[key] if key in kept else value for key, value in new.items()})


def _fields(cfg: RunConfig) -> dict:
    """A config's fields by their dotted names: {"name": ..., "model.d_model": ..., "data.task_options": {...}}."""
    fields = {}
    for key, value in cfg.to_dict().items():
        if isinstance(value, dict):  # a section
            fields |= {f"{key}.{name}": field_value for name, field_value in value.items()}
        else:
            fields[key] = value
    return fields


def _config(fields: dict) -> RunConfig:
    """The config of _fields' dotted names."""
    values = {}
    for key, value in fields.items():
        section, dot, name = key.partition(".")
        if dot:
            values.setdefault(section, {})[name] = value
        else:
            values[key] = value
    return from_dict(RunConfig, values).validate()


def _set_by(overrides: list[str] | None, fields: dict) -> set[str]:
    """The fields that dotted overrides set (model.mixer_options.gla.chunk_size sets model.mixer_options, and
    data.mqar.pairs data.task_options); all of them when there are no overrides to tell (None)."""
    if overrides is None:
        return set(fields)
    return {".".join(upgraded_key(item.partition("=")[0]).split(".")[:2]) for item in overrides}


def _listing(keys: list[str], fields: dict) -> str:
    """'model.d_model=64, train.lr=0.01': fields as the overrides that set them are written."""
    return ", ".join(f"{key}={_as_override(fields[key])}" for key in keys)


def _as_override(value) -> str:
    """A value as an override writes it (YAML): 64, 0.01, sigmoid, true, null, [a, b]."""
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 20).strip().removesuffix("...").strip()


def checkpoint_tokenizer(cfg: RunConfig, folder: Path | None, fine_tuning: bool, overrides: list[str] | None):
    """The tokenizer of the checkpoint whose weights the run starts from, which reads its text (None: a run from
    scratch, or a task, whose ids need none). Fine-tuning (train.init_from) reuses it rather than fitting a new
    one to the new text, whose ids would stand for other symbols: data.tokenizer must name its kind."""
    if folder is None or cfg.data.source in TASKS:
        return None
    theirs = checkpoint.load_tokenizer_dict(folder)
    if fine_tuning:
        where = f"train.init_from={cfg.train.init_from}"
        saved = checkpoint.load_config(folder)["data"]
        if theirs["kind"] not in ("char", "byte", "bpe"):
            raise UserError(f"{where}: the checkpoint was trained on data.source={saved['source']}, whose token ids "
                            f"({describe(theirs)}) are not text; fine-tune it on data.source={saved['source']}")
        if theirs["kind"] != cfg.data.tokenizer:
            raise UserError(f"{where}: data.tokenizer={cfg.data.tokenizer}, but the checkpoint's tokenizer is "
                            f"{describe(theirs)}; fine-tuning reads the new text with the checkpoint's tokenizer: "
                            f"set data.tokenizer={theirs['kind']}")
        asked = overrides is not None and any(item.startswith("data.bpe_vocab=") for item in overrides)
        if theirs["kind"] == "bpe" and asked and cfg.data.bpe_vocab != saved.get("bpe_vocab"):
            raise UserError(f"{where}: data.bpe_vocab={cfg.data.bpe_vocab}, but fine-tuning reads the new text with "
                            f"the checkpoint's BPE ({describe(theirs)}, trained with data.bpe_vocab="
                            f"{saved.get('bpe_vocab')}) and trains none; leave data.bpe_vocab out")
    return tokenizer_from_dict(theirs)


def check_tokenizer(corpus, source: Path, init_from: str) -> None:
    """Fine-tuning reads the new data with the ids of the checkpoint's tokenizer: a task's must be the same, or
    every id would stand for another symbol (text is read with the checkpoint's own: see checkpoint_tokenizer)."""
    theirs = checkpoint.load_tokenizer_dict(source)
    problem = difference(corpus.tokenizer.to_dict(), theirs)
    if problem is not None:
        raise UserError(f"train.init_from={init_from}: {problem}; fine-tune on data that tokenizes alike")
