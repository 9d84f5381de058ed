"""Typed run configuration: dataclasses are the single source of truth, filled by YAML presets and dotted overrides.
A dotted command-line override (``model.mixer=sigmoid train.steps=500``) changes a single field."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from . import plugins, presets
from .data import TASKS
from .data.corpus import TEXT_SOURCES, is_text
from .data.hf import reads_files
from .data.texts import SOURCES
from .errors import ConfigError, UserError, unknown_name
from .loggers import SINKS
from .mixers import MixerConfig, list_mixers, mixer_class, mixer_config
from .nn import FFNS, NORMS
from .paths import user_path
from .typed import check_choices, from_dict

log = logging.getLogger(__name__)
# warmup takes at most this fraction of train.steps, so that a shortened run still decays its learning rate
MAX_WARMUP_FRACTION = 0.5
# the choices of fields, from the tables of what each choice names
FfnKind = Literal[tuple(FFNS)]
NormKind = Literal[tuple(NORMS)]
MixSource = Literal[SOURCES]
Sink = Literal[SINKS]
# the tasks whose settings were sections of the data config (data.mqar.pairs) before data.task_options: saved runs
# and older files and overrides name them so
TASK_SECTIONS = ("mqar", "brackets", "niah")
# the fields every mixer's config shares, which the decoder sets for each layer, and what sets them instead
SET_BY_THE_MODEL = {"d_model": "model.d_model, for every layer; remove it and set model.d_model instead",
                    "n_heads": "model.n_heads, for every layer; remove it and set model.n_heads instead",
                    "layer_idx": "the layer's depth; remove it"}


@dataclass
class ModelConfig:
    vocab_size: int = 0  # 0: taken from the tokenizer
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mixer: str = "softmax"  # the token mixer of every layer ...
    layers: list[str] | None = None  # ... unless this per-layer list is given (hybrids)
    # {mixer name: {field: value}}. A preset may hold the options of mixers it does not use (those its suites
    # compare it with); `attnlab train` refuses options given on its command line for a mixer no layer uses
    mixer_options: dict[str, dict] = field(default_factory=dict)
    ffn_hidden: int | None = None  # feed-forward width; None: SwiGLU 8/3 * d_model (to a multiple of 32), GELU 4x
    ffn: bool = True  # False: blocks without the feed-forward part (attention only)
    ffn_kind: FfnKind = "swiglu"  # swiglu (Llama) | gelu (two layers with biases, GPT-2)
    norm: NormKind = "rms"  # rms (RMSNorm) | layer (LayerNorm), before each mixer, feed-forward block and the head
    output_size: int = 0  # 0: the vocabulary; tasks with a pointer head over positions set it (untied)
    # learned absolute position embeddings for this many positions, added to the token embeddings
    # (0: none -- the mixers carry position themselves, e.g. RoPE or a recurrent state)
    positions: int = 0
    tie_embeddings: bool = True
    dropout: float = 0.0
    norm_eps: float = 1e-6

    def layer_mixers(self) -> list[str]:
        return list(self.layers) if self.layers is not None else [self.mixer] * self.n_layers

    def mixer_config(self, name: str, layer_idx: int = 0) -> MixerConfig:
        """The typed config of mixer `name` at depth layer_idx: its model.mixer_options entry, with the model's
        d_model and n_heads (fields every mixer shares, which an entry may not set)."""
        options = self.mixer_options.get(name, {})
        where = f"model.mixer_options.{name}"
        for key in options:
            if key in SET_BY_THE_MODEL:
                raise ConfigError(f"{where}.{key} is set by the decoder from {SET_BY_THE_MODEL[key]}")
        own = [f.name for f in dataclasses.fields(mixer_class(name).config_class) if f.name not in SET_BY_THE_MODEL]
        for key in options:  # named here so that the known fields listed are those an entry may set
            if key not in own:
                raise ConfigError(unknown_name("field", f"{where}.{key}", [f"{where}.{f}" for f in own]))
        return mixer_config(name, where=where, d_model=self.d_model, n_heads=self.n_heads, layer_idx=layer_idx,
                            **options)

    def fitted(self, vocab_size: int, output_size: int = 0) -> ModelConfig:
        """This config with the sizes it leaves to the data (0) set to the data's: the vocabulary, and the output
        size of a pointer head (which scores positions, not tokens, so its embeddings are untied). A new config.
        The one place where 0 means the data's: a vocabulary set smaller than the data's is refused."""
        if 0 < self.vocab_size < vocab_size:
            raise ConfigError(f"model.vocab_size={self.vocab_size} is smaller than the data's {vocab_size}; "
                              "set it to 0 to take the data's")
        model = self
        if model.vocab_size == 0:
            model = dataclasses.replace(model, vocab_size=vocab_size)
        if output_size and model.output_size == 0:
            model = dataclasses.replace(model, output_size=output_size, tie_embeddings=False)
        return model

    def validate(self) -> None:
        check_choices(self, "model")
        _positive(self, "model", "d_model", "n_layers", "n_heads")
        if self.vocab_size < 0:
            raise ConfigError(f"model.vocab_size={self.vocab_size} must be >= 0 (0 takes it from the tokenizer)")
        if self.layers is not None and len(self.layers) != self.n_layers:
            raise ConfigError(
                f"model.layers lists {len(self.layers)} mixers but model.n_layers={self.n_layers}; "
                "give one mixer name per layer"
            )
        known = list_mixers()
        places = [("model.layers" if self.layers is not None else "model.mixer", name) for name in self.layer_mixers()]
        for where, name in places + [("model.mixer_options", name) for name in self.mixer_options]:
            if name not in known:
                raise ConfigError(f"{where}: {plugins.unknown_mixer(name, known)}")
        self._check_heads()
        if self.output_size < 0:
            raise ConfigError(f"model.output_size={self.output_size} must be >= 0 (0: the vocabulary)")
        if self.positions < 0:
            raise ConfigError(f"model.positions={self.positions} must be >= 0 (0: no learned position embeddings)")
        if self.ffn_hidden is not None and self.ffn_hidden <= 0:
            raise ConfigError(f"model.ffn_hidden={self.ffn_hidden} must be positive (or null for 8/3*d_model)")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout={self.dropout} must be in [0, 1)")
        # every layer's mixer and every mixer_options entry, typed now: a mistake fails before any data loads
        for i, name in enumerate(self.layer_mixers()):
            self.mixer_config(name, i)
        for name in self.mixer_options:
            self.mixer_config(name)

    def _check_heads(self) -> None:
        """The head count must divide d_model and fit every layer's mixer; the counts the error suggests do."""
        problem = self._head_problem()
        if problem is None:
            return
        message, other_fix = problem
        counts = self._fitting_head_counts()
        choose = f"choose model.n_heads from {counts}" if counts else f"no head count fits model.d_model={self.d_model}"
        raise ConfigError(f"{message}; {choose}{other_fix} or change model.d_model")

    def _head_problem(self) -> tuple[str, str] | None:
        """(what is wrong with model.n_heads, another fix) or None when the heads fit."""
        if self.d_model % self.n_heads:
            return f"model.n_heads={self.n_heads} does not divide model.d_model={self.d_model}", ""
        for name in dict.fromkeys(self.layer_mixers()):
            cfg = self.mixer_config(name)
            # RoPE rotates channel pairs (i, i + D/2) of each head: its width D must be even
            if getattr(cfg, "rope", False) and cfg.head_dim % 2:
                return (f"model.n_heads={cfg.n_heads} makes {name}'s heads {self.d_model} / {cfg.n_heads} = "
                        f"{cfg.head_dim} channels wide, and RoPE needs an even width"), \
                    f", set model.mixer_options.{name}.rope=false"
        return None

    def _fitting_head_counts(self, most: int = 6) -> list[int]:
        """The values of model.n_heads that fit, the `most` nearest the given."""
        def fits(heads: int) -> bool:
            try:
                return dataclasses.replace(self, n_heads=heads)._head_problem() is None
            except ConfigError:  # the count breaks another rule of a mixer (e.g. a width it must divide)
                return False

        counts = [h for h in range(1, self.d_model + 1) if self.d_model % h == 0 and fits(h)]
        return sorted(sorted(counts, key=lambda h: abs(h - self.n_heads))[:most])


@dataclass
class DataConfig:
    # shakespeare (the plays as printed) | shakespeare-dialogue (their speeches in Tiny Shakespeare's layout,
    # Coriolanus first) | text (data.path) | mixed (plays + Python source + docs) | a registered task (mqar,
    # brackets, niah, ...: attnlab.data.tasks) | hf:<dataset>[/<config>] (Hugging Face datasets; its file
    # builders hf:text, hf:json, hf:csv, hf:parquet, ... read data.path)
    source: str = "shakespeare"
    path: str | None = None  # a file or a folder of them (any name), for source=text or a file builder (hf:json)
    # char (vocabulary of the corpus) | byte (256 symbols) | bpe (trained locally)
    tokenizer: Literal["char", "byte", "bpe"] = "char"
    bpe_vocab: int = 4096
    max_chars: int | None = None  # keep only the first max_chars characters (e.g. 100_000)
    val_fraction: float = 0.1  # the last fraction of the corpus is the validation split
    mix: dict[MixSource, float] = field(default_factory=lambda: {"plays": 1.0, "python": 1.0, "docs": 1.0})
    chunk_chars: int = 512  # source=mixed: size of the shuffled chunks
    seed: int = 0  # source=mixed: chunk order
    cache_dir: str | None = None  # where token arrays are stored; None: $ATTNLAB_CACHE or ~/.cache/attnlab
    pack: bool = False  # text corpora: rows of whole documents with their boundaries, not windows of the stream
    # {task: {field: value}}: the settings of the task data.source names, typed by the dataclass it registers
    # (data.task_options.mqar.pairs=8); a task that is not the source may only be given its defaults
    task_options: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def upgrade(cls, values: dict) -> dict:
        """values with the sections of TASK_SECTIONS (data.mqar: {...}, as saved runs hold them) moved into
        task_options; a field given in both places takes task_options' value."""
        old = [name for name in TASK_SECTIONS if name in values]
        if not old:
            return values
        values = dict(values)
        options = dict(values.get("task_options") or {})
        for name in old:
            section = values.pop(name)
            options[name] = {**(section or {}), **(options.get(name) or {})}
        return {**values, "task_options": options}

    def task_config(self, name: str | None = None):
        """The typed, validated settings of task `name` (default: the source's): its data.task_options entry."""
        cfg = self._typed_options(name or self.source)
        if hasattr(cfg, "validate"):
            cfg.validate()
        return cfg

    def _typed_options(self, name: str):
        return from_dict(TASKS[name].options, self.task_options.get(name) or {}, f"data.task_options.{name}")

    def source_options(self) -> dict:
        """The task options a run records: {data.source: every setting of its task, typed} (other tasks' entries
        hold only their defaults), nothing for a text corpus, and the entries as given while the source is a task
        that no imported plugin registered."""
        if is_text(self.source):
            return {}
        if self.source not in TASKS:
            return dict(self.task_options)
        return {self.source: dataclasses.asdict(self._typed_options(self.source))}

    def validate(self) -> None:
        known = [*TEXT_SOURCES, *TASKS]
        if self.source not in known and not self.source.startswith("hf:"):
            raise ConfigError(unknown_name("data.source", self.source, [*known, "hf:<dataset>"]))
        check_choices(self, "data")
        if self.source == "text" or reads_files(self.source):
            if not self.path:
                raise ConfigError(f"data.source={self.source} needs data.path=<a file or a folder of them>")
            if not user_path(self.path).exists():
                raise ConfigError(f"data.path={self.path} does not exist; give an existing file or folder")
        if self.source == "mixed" and (any(w < 0 for w in self.mix.values()) or sum(self.mix.values()) <= 0):
            raise ConfigError("data.mix weights must be >= 0 and not all zero")
        self._check_task_options()
        if self.bpe_vocab < 260:
            raise ConfigError(f"data.bpe_vocab={self.bpe_vocab} must be at least 260 (the bytes and a few merges)")
        if self.max_chars is not None and self.max_chars <= 0:
            raise ConfigError(f"data.max_chars={self.max_chars} must be positive (or null for everything)")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction={self.val_fraction} must be between 0 and 1")
        self._refuse_unread_settings()

    def _check_task_options(self) -> None:
        """Every entry names a registered task and is typed by its settings' dataclass; the source's is validated,
        and another task's may hold only its defaults (it would not be read)."""
        for name in self.task_options:
            if name not in TASKS:
                raise ConfigError(f"data.task_options: {unknown_name('task', name, TASKS)}")
            if name != self.source and self._typed_options(name) != TASKS[name].options():
                raise ConfigError(f"data.task_options.{name}.* applies only to data.source={name}, not to "
                                  f"data.source={self.source}; remove it")
        if self.source in TASKS:
            self.task_config()

    def reads(self, key: str) -> bool:
        """Whether this source reads the setting at `key` below data: a field (source and cache_dir: always), or
        task_options.<task>[.<field>] (only the source's task; an old section name, e.g. mqar, stands for it)."""
        first, _, rest = upgraded_key(f"data.{key}").removeprefix("data.").partition(".")
        if first == "task_options":
            return not rest or rest.split(".")[0] == self.source
        return self._readers().get(first, (True, ""))[0]

    def _refuse_unread_settings(self) -> None:
        """A field changed from its default that this source never reads is a mistake, not a no-op: refuse it."""
        default = DataConfig()
        for name, (applies, where) in self._readers().items():
            value = getattr(self, name)
            if applies or value == getattr(default, name):
                continue
            run = f"data.source={self.source}"
            if name == "bpe_vocab":
                run += f" with data.tokenizer={self.tokenizer}"
            raise ConfigError(f"data.{name}={value} applies only to {where}, not to {run}; remove it")

    def _readers(self) -> dict[str, tuple[bool, str]]:
        """{field: (whether this source reads it, what reads it)} for every field but source, cache_dir (a place
        to keep prepared data, which every source accepts) and task_options (see _check_task_options)."""
        corpus = is_text(self.source)
        corpora = "text corpora (data.source=shakespeare, shakespeare-dialogue, text, mixed or hf:...)"
        mixed = self.source == "mixed"
        files = "data.source=text and the file builders of Hugging Face datasets (hf:text, hf:json, hf:csv, ...)"
        return {"path": (self.source == "text" or reads_files(self.source), files),
                "tokenizer": (corpus, corpora),
                "bpe_vocab": (corpus and self.tokenizer == "bpe", "data.tokenizer=bpe on a text corpus"),
                "max_chars": (corpus, corpora),
                "val_fraction": (corpus, corpora),
                "mix": (mixed, "data.source=mixed"),
                "chunk_chars": (mixed, "data.source=mixed"),
                "seed": (mixed, "data.source=mixed"),
                "pack": (corpus, corpora)}


def upgraded_key(key: str) -> str:
    """A dotted key as the config names it now: data.mqar.pairs (a section of TASK_SECTIONS) is
    data.task_options.mqar.pairs."""
    section, dot, rest = key.partition(".")
    if section == "data" and rest.split(".")[0] in TASK_SECTIONS:
        return f"data.task_options.{rest}"
    return key


@dataclass
class TrainConfig:
    steps: int = 2000
    batch_size: int = 32  # sequences per optimizer step (split over grad_accum micro-batches)
    seq_len: int = 128
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr: float = 1e-4  # the schedule decays to this
    warmup_steps: int = 100
    # after the linear warmup, cosine decays to min_lr over the rest of train.steps; wsd (warmup-stable-decay)
    # holds lr, then decays linearly to min_lr over decay_steps steps: the last of train.steps or, with patience,
    # those after the evaluation where patience runs out if that comes first, the run then stopping when they end
    schedule: Literal["cosine", "wsd"] = "cosine"
    decay_steps: int = 0  # wsd: the decay's length in steps (0: one fifth of train.steps)
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 disables clipping
    skip_non_finite: int = 0  # steps with a nan/inf loss or gradient to skip before stopping (0: stop at the first)
    eval_every: int = 250
    eval_batches: int = 20  # validation batches of batch_size random windows (or examples); 0: the whole split once
    # early stopping: stop once this many evaluations in a row bring no validation loss lower than the best
    # by more than min_delta (0: train all train.steps, which is the cap otherwise; under the wsd schedule, start
    # its decay and stop when that ends); the best checkpoint is kept and loaded
    patience: int = 0
    min_delta: float = 0.0
    log_every: int = 10
    ckpt_every: int = 500  # a checkpoint is also written at the last step
    keep_last: int = 3  # older checkpoints are deleted; 0 keeps all
    seed: int = 1337
    precision: Literal["fp32", "bf16"] = "fp32"  # bf16: autocast; parameters and states stay fp32
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    fsdp: bool = False  # under torchrun: shard the model with FSDP instead of replicating it with DDP
    # under torchrun: split every sequence across this many processes (context parallelism); the processes are
    # data x context_parallel, each group of context_parallel consecutive ranks sharing its rows of the batch
    context_parallel: int = 1
    compile: bool = False  # torch.compile each block whose mixer compiles (the others are logged and run eagerly)
    log_to: list[Sink] = field(default_factory=list)  # also stream metrics.jsonl's scalars to: tensorboard, wandb
    # fine-tuning: a run folder (its best or newest checkpoint) or step-XXXXXXXX folder whose weights and model
    # config a new run starts from, at step 0 with a fresh optimizer
    init_from: str | None = None

    def validate(self) -> None:
        check_choices(self, "train")
        _positive(self, "train", "steps", "batch_size", "seq_len", "grad_accum", "eval_every", "log_every",
                  "ckpt_every", "context_parallel")
        for name in ("beta1", "beta2"):  # AdamW's decay rates of its moment averages
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"train.{name}={getattr(self, name)} must be in [0, 1), e.g. 0.9 for beta1 and "
                                  "0.99 for beta2")
        if self.init_from is not None and not self.init_from.strip():
            raise ConfigError("train.init_from is empty; give a run folder or a step-XXXXXXXX checkpoint folder, "
                              "or leave it out")
        if self.batch_size % self.grad_accum:
            raise ConfigError(
                f"train.batch_size={self.batch_size} is not divisible by train.grad_accum={self.grad_accum}; "
                "the batch is split evenly into grad_accum micro-batches"
            )
        if self.lr <= 0:
            raise ConfigError(f"train.lr={self.lr} must be above 0, e.g. 1e-3")
        if self.min_lr < 0:
            raise ConfigError(f"train.min_lr={self.min_lr} must be >= 0 (0: the schedule decays to nothing)")
        if self.min_lr > self.lr:  # the schedule would rise from lr to min_lr instead of decaying
            raise ConfigError(f"train.min_lr={self.min_lr} is above train.lr={self.lr}; the schedule decays "
                              "from lr to min_lr: lower train.min_lr or raise train.lr")
        for name in ("eval_batches", "warmup_steps", "weight_decay", "grad_clip", "keep_last", "skip_non_finite",
                     "patience", "min_delta"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name}={getattr(self, name)} must be >= 0")
        self._check_decay_steps()
        if self.device != "auto" and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ConfigError(f"train.device={self.device} is not one of auto, cpu, cuda, cuda:N")
        for sink in self.log_to:
            if self.log_to.count(sink) > 1:
                raise ConfigError(f"train.log_to lists {sink} twice; list each sink once")

    def _check_decay_steps(self) -> None:
        """train.decay_steps is a length within the run, and one that only the wsd schedule reads."""
        if self.decay_steps < 0:
            raise ConfigError(f"train.decay_steps={self.decay_steps} must be >= 0 (0: one fifth of train.steps)")
        if self.decay_steps and self.schedule != "wsd":  # cosine's decay spans the run after the warmup
            raise ConfigError(f"train.decay_steps={self.decay_steps} applies to train.schedule=wsd only; set "
                              "train.schedule=wsd or leave train.decay_steps out")
        if self.decay_steps > self.steps:
            raise ConfigError(f"train.decay_steps={self.decay_steps} is more than train.steps={self.steps}; lower it "
                              "(0: one fifth of train.steps)")

    @property
    def decay_length(self) -> int:
        """The wsd schedule's decay in steps: train.decay_steps, or one fifth of train.steps (at least 1)."""
        return self.decay_steps or max(1, self.steps // 5)

    def with_capped_warmup(self) -> TrainConfig:
        """A preset's warmup would fill a run shortened with train.steps: this config with it capped, said in a
        note. Made where a config comes from a preset and overrides, not when a trained run's is read back."""
        cap = int(self.steps * MAX_WARMUP_FRACTION)
        if self.warmup_steps <= cap:
            return self
        if int(os.environ.get("RANK", "0")) == 0:  # under torchrun every rank makes the config; rank 0 speaks
            log.warning(f"note: train.warmup_steps={self.warmup_steps} is more than half of train.steps="
                        f"{self.steps}; warming up for {cap} steps (set train.warmup_steps={cap} or less to choose)")
        return dataclasses.replace(self, warmup_steps=cap)


@dataclass
class RunConfig:
    name: str = "run"  # checkpoints and logs go to <out_dir>/<name>/; a YAML file without it: the file's stem
    out_dir: str = "runs"
    # modules or .py files to import first, which register mixers and tasks from outside attnlab (see
    # attnlab.plugins); a run saves those its mixers and task come from
    imports: list[str] = field(default_factory=list)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> RunConfig:
        if not self.name or "/" in self.name:
            raise ConfigError(f"name='{self.name}' must be a non-empty folder name without '/'")
        self._import_plugins()
        self.model.validate()
        self.data.validate()
        self.train.validate()
        if 0 < self.model.positions < self.train.seq_len:
            raise ConfigError(f"model.positions={self.model.positions} learned positions cannot cover "
                              f"train.seq_len={self.train.seq_len}: raise model.positions or lower the length")
        return self

    def _import_plugins(self) -> None:
        """Import the installed plugins and those of `imports`. One that fails to import matters only while a
        mixer or the task of the config is unknown: --import can stand in for a plugin that moved since a run
        saved it."""
        plugins.import_installed()
        failed = None
        for spec in self.imports:
            try:
                plugins.import_plugin(spec, "imports")
            except UserError as err:
                failed = failed or err
        unknown = [f"mixer '{name}'" for name in self.mixers() if name not in list_mixers()]
        if not is_text(self.data.source) and self.data.source not in TASKS:
            unknown.append(f"task '{self.data.source}'")
        if failed and unknown:
            raise UserError(f"{failed} ({unknown[0]} is not built in: {plugins.HINT} to where its module is "
                            "now)") from failed

    def mixers(self) -> list[str]:
        """Every mixer the config names: its layers' and those it has options for."""
        return list(dict.fromkeys([*self.model.layer_mixers(), *self.model.mixer_options]))

    def to_dict(self) -> dict:
        """The config as plain values, as a run saves it: `imports` adds the plugin each mixer (and the task)
        comes from, so that the run loaded back in another process imports them; data.task_options holds every
        setting of the source's task, typed."""
        values = dataclasses.asdict(self)
        values["data"]["task_options"] = self.data.source_options()
        known = list_mixers()
        sources = [plugins.source_of(mixer_class(name)) for name in self.mixers() if name in known]
        if self.data.source in TASKS:  # a task from outside attnlab is imported again where the run is loaded
            sources.append(plugins.source_of(TASKS[self.data.source].load))
        values["imports"] = list(dict.fromkeys([*map(plugins.absolute, self.imports), *filter(None, sources)]))
        return values

    def settings(self) -> dict:
        """to_dict's values as run fingerprints hash them (attnlab.lab.configs.fingerprint): the settings of
        a task of TASK_SECTIONS at data.<task>, those that differ from the task's defaults, where they were before
        data.task_options, so that a run keeps its fingerprint."""
        values = self.to_dict()
        options = values["data"].pop("task_options")
        for name in TASK_SECTIONS:
            if name in options:
                default = dataclasses.asdict(TASKS[name].options())
                changed = {key: value for key, value in options.pop(name).items() if value != default[key]}
                if changed:
                    values["data"][name] = changed
        if options:
            values["data"]["task_options"] = options
        return values

    def sized_model(self) -> ModelConfig:
        """The model config with a vocabulary where it leaves it to the tokenizer (0), for shapes before any
        data loads: the BPE's size, a task's own, else 256 (bytes; a bound for the character vocabularies
        of the local corpora, e.g. Shakespeare's 65)."""
        if self.model.vocab_size:
            return self.model
        if self.data.tokenizer == "bpe":
            return self.model.fitted(self.data.bpe_vocab)
        task = TASKS.get(self.data.source)
        return self.model.fitted(task.vocab_size(self.data.task_config()) if task else 256)


def _positive(cfg, section: str, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value <= 0:
            raise ConfigError(f"{section}.{name}={value} must be a positive integer")


# ---------------------------------------------------------------------------------------------------
# presets and overrides


def list_presets() -> list[str]:
    """The registered presets: those of the installed papers (plugins.import_papers), the shared ones included."""
    plugins.import_papers()
    return sorted(presets.PRESETS)


def preset_values(preset_or_path: str) -> dict:
    """The values of any YAML file by path, else of a preset by name (see ``list_presets``), as plain dicts
    that overrides apply to."""
    if user_path(preset_or_path).is_file():
        # a file without a name names its run after itself, as a preset does: two files never share runs/run
        return {"name": user_path(preset_or_path).stem, **load_yaml(preset_or_path)}
    plugins.import_papers()
    if preset_or_path not in presets.PRESETS:
        raise ConfigError(unknown_name("config preset or file", preset_or_path, list_presets()))
    return dataclasses.asdict(presets.PRESETS[preset_or_path]())


def load_yaml(file: str) -> dict:
    """Read a YAML config file."""
    path = user_path(file)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8") from None
    try:
        _refuse_repeated_keys(yaml.compose(text, Loader=yaml.SafeLoader), path)
        values = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path} must hold a mapping with sections model, data, train")
    return values


def _refuse_repeated_keys(node, path: Path, where: str = "") -> None:
    """A key given twice in one mapping (a second `model:` section): YAML keeps the last and drops the first
    without a word, so it is refused, naming the key and both lines."""
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_repeated_keys(item, path, where)
    if not isinstance(node, yaml.MappingNode):
        return
    seen = {}
    for key, value in node.value:
        name = f"{where}.{key.value}" if where else str(key.value)
        if isinstance(key, yaml.ScalarNode) and key.value != "<<":  # << merges another mapping in
            if key.value in seen:
                raise ConfigError(f"{path}: '{name}' is given twice (lines {seen[key.value]} and "
                                  f"{key.start_mark.line + 1}); keep one, the second would replace the first")
            seen[key.value] = key.start_mark.line + 1
        _refuse_repeated_keys(value, path, name)


# an override: "section.field=value" (the command line's), or (dotted key, Python value) (a suite's arms)
Override = str | tuple[str, object]


def apply_overrides(values: dict, overrides: Iterable[Override]) -> dict:
    """Apply overrides: ``a.b.c=value`` strings, whose values are parsed as YAML (``3``, ``1e-3``, ``true``,
    ``[a, b]``), or ``(a.b.c, value)`` pairs of a key and a Python value (a suite's arms). A key of a task's old
    section (data.mqar.pairs) sets its place in data.task_options."""
    for item in overrides:
        key, value = parsed_override(item)
        node = values
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{_shown(item)}': '{part}' is a value, not a section")
        node[leaf] = value
    return values


def parsed_override(item: Override) -> tuple[str, object]:
    """An override as (the key as the config names it now, its value)."""
    if isinstance(item, tuple):
        key, value = item
        return upgraded_key(key), value
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"override '{item}' must look like section.field=value, e.g. train.steps=500")
    try:
        value = yaml.safe_load(raw) if raw else None
    except yaml.YAMLError:
        value = raw
    return upgraded_key(key), value


def _shown(item: Override) -> str:
    return item if isinstance(item, str) else f"{item[0]}={item[1]!r}"


def load_config(preset_or_path: str | None = None, overrides: Iterable[Override] = ()) -> RunConfig:
    """A preset or YAML file with overrides applied (strings or pairs, see apply_overrides), validated."""
    values = preset_values(preset_or_path) if preset_or_path else {}
    if isinstance(values.get("data"), dict):  # old sections moved first, so that the overrides below win over them
        values["data"] = DataConfig.upgrade(values["data"])
    cfg = from_dict(RunConfig, apply_overrides(values, list(overrides))).validate()
    _refuse_unused_mixer(cfg.model, overridden(overrides))
    return dataclasses.replace(cfg, train=cfg.train.with_capped_warmup())


def overridden(overrides: Iterable[Override]) -> set[str]:
    """The dotted keys that overrides (strings or pairs, see apply_overrides) set, as the config names them now."""
    return {upgraded_key(item[0] if isinstance(item, tuple) else item.partition("=")[0]) for item in overrides}


def _refuse_unused_mixer(model: ModelConfig, asked: set[str]) -> None:
    """model.mixer set by an override beside a model.layers without it: no layer would be that mixer. A preset or
    file may set both (a saved run's config holds model.mixer beside its layers)."""
    layers = model.layer_mixers()
    if model.layers is not None and model.mixer not in layers and asked & {"model", "model.mixer"}:
        raise ConfigError(f"model.mixer={model.mixer} is not used: model.layers=[{', '.join(layers)}] names the mixer "
                          f"of every layer; drop model.mixer, list {model.mixer} in model.layers, or set "
                          "model.layers=null to give every layer model.mixer")


def refuse_unused_options(model: ModelConfig, asked: set[str]) -> None:
    """Options given on the command line (the dotted keys `asked`) for a mixer that no layer is. Presets and
    suites may hold options of mixers they do not use (those they are compared with, settings shared by the
    arms of a suite): only the train command refuses them, where a person typed them."""
    layers = model.layer_mixers()
    whole = asked & {"model", "model.mixer_options"}  # the command line replaced all the options
    for name in model.mixer_options:
        mine = f"model.mixer_options.{name}"
        if name not in layers and (whole or any(key == mine or key.startswith(mine + ".") for key in asked)):
            raise ConfigError(f"{mine} sets options of mixer {name}, which no layer uses (the layers are "
                              f"{', '.join(dict.fromkeys(layers))}); remove it, or use {name} in model.mixer or "
                              "model.layers")

