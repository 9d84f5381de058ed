"""attnlab list: the mixers with their fields, and the presets; --params compares every mixer's parameters."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import MISSING, fields

from ..errors import UserError
from ..paths import user_path
from ..plugins import unknown_mixer


def add_parser(sub) -> None:
    p = sub.add_parser("list", help="mixers with their fields, and presets; --params compares parameter counts")
    p.add_argument("--params", action="store_true", help="parameters and state of every mixer on a model")
    p.add_argument("name", nargs="?", help="a mixer: only its fields; with --params, a preset or YAML file "
                   "(default: the default model)")
    p.add_argument("overrides", nargs="*", help="with --params: section.field=value changes to the model")
    p.set_defaults(func=main, check=check)


def check(args) -> None:
    from ..config import list_presets
    from ..mixers import list_mixers

    if args.params:
        return
    if args.overrides:
        raise UserError(f"overrides ({' '.join(args.overrides)}) apply to --params, e.g. "
                        "attnlab list --params demo model.d_model=64")
    if args.name is None or args.name in list_mixers():
        return
    if args.name in list_presets() or user_path(args.name).is_file():
        raise UserError(f"{args.name} is a config, not a mixer; attnlab list --params {args.name} compares the "
                        "mixers on it")
    raise UserError(unknown_mixer(args.name, list_mixers()) + "; or give --params and a preset")


def main(args) -> None:
    from ..config import list_presets
    from ..mixers import list_mixers

    if args.params:
        _params(args.name, args.overrides)
        return
    print("mixers: set a field with model.mixer_options.<mixer>.<field>=<value> (d_model and n_heads come from "
          "model.*)")
    for name in [args.name] if args.name else list_mixers():
        _fields(name)
    if not args.name:
        print("presets:", ", ".join(list_presets()))


def _fields(name: str) -> None:
    """A mixer's own config fields: name, type, default and the comment that documents it in the source."""
    from ..mixers import MixerConfig, mixer_class
    from ..typed import choices, field_docs

    cls = mixer_class(name)
    summary = describe(cls)
    print(f"  {name}: {summary}" if summary else f"  {name}")
    shared = {f.name for f in fields(MixerConfig)}  # set by the model for every layer
    docs = field_docs(cls.config_class)
    hints = typing.get_type_hints(cls.config_class)
    for f in fields(cls.config_class):
        if f.name in shared:
            continue
        default = f.default if f.default is not MISSING else f.default_factory()
        kind, doc = (f.type if isinstance(f.type, str) else f.type.__name__), docs[f.name]
        options = choices(hints[f.name])
        if options:  # a choice: its type is the values' type, and the row lists the values
            values = f"one of {' | '.join(map(str, options))}"
            kind, doc = type(options[0]).__name__, f"{values}. {doc}" if doc else values
        print(f"    {f.name:<22} {kind:<6} {default!r:<12} {doc}".rstrip())


def describe(mixer_class) -> str:
    """A mixer's description: the first paragraph of its class docstring, on one line."""
    paragraph = (mixer_class.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


def _params(config: str | None, overrides: list[str]) -> None:
    import torch

    from ..config import load_config
    from ..mixers import list_mixers
    from ..model import Decoder

    cfg = load_config(config, overrides)
    base, vocabulary = _model_as_trained(cfg)
    print(f"{config or 'default'} model, vocab {base.vocab_size:,} ({vocabulary}), state at T={cfg.train.seq_len}:")
    print(f"  {'mixer':<22} {'parameters':>12} {'vs softmax':>11} {'state numbers':>14}")
    baseline = None
    for name in ["softmax"] + [m for m in list_mixers() if m != "softmax"]:
        try:
            with torch.device("meta"):  # shapes only: counting needs no memory or initialisation
                model = Decoder(dataclasses.replace(base, mixer=name, layers=None))
        except UserError as err:
            print(f"  {name:<22} (not buildable with this config: {err})")
            continue
        n = model.num_params()
        baseline = baseline or n
        print(f"  {name:<22} {n:>12,} {100 * (n / baseline - 1):>+10.3f}% {model.state_size(cfg.train.seq_len):>14,}")


def _model_as_trained(cfg):
    """The model config that train would build, with its vocabulary (and a task's pointer head) fitted to the
    data as train fits them, and how the vocabulary was found. A BPE is not trained here, nor a Hugging Face
    corpus downloaded: their vocabulary is the bound that sized_model gives."""
    from ..data import TASKS, load_data

    data = cfg.data
    local = data.tokenizer != "bpe" and not data.source.startswith("hf:")
    if data.source in TASKS or local:  # a task's tokens, or local text read once (and cached for train)
        loaded = load_data(data, cfg.train.seq_len)
        model = cfg.model.fitted(loaded.vocab_size, getattr(loaded, "output_size", 0))
        return model, "fitted to the data, as train builds it"
    if cfg.model.vocab_size:
        return cfg.model, "model.vocab_size"
    if data.tokenizer == "bpe":
        return cfg.sized_model(), "data.bpe_vocab: the BPE, trained when the run starts, may stop below it"
    return cfg.sized_model(), "at most: train fits it to the corpus, which is not downloaded here"
