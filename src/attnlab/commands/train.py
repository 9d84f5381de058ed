"""attnlab train: a model from a preset or YAML file plus dotted overrides."""

from __future__ import annotations

import argparse
import os
import sys

from ..arguments import non_empty
from ..errors import UserError
from ..paths import user_path

EPILOG = """\
overrides set any field of the config's dataclasses (attnlab/config.py: model, data, train), e.g.
  attnlab train demo model.mixer=sigmoid train.steps=500
  attnlab train demo model.layers=[softmax,gla,softmax,gla]            (a hybrid: one mixer per layer)
and a mixer's own fields with model.mixer_options.<mixer>.<field>=<value>, e.g.
  attnlab train demo model.mixer=gla model.mixer_options.gla.chunk_size=32
attnlab list <mixer> shows a mixer's fields with their types, defaults and meaning."""


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a model from a preset or YAML file plus dotted overrides",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", help="preset name (attnlab list) or path to a YAML file (e.g. "
                   "examples/train.yaml; one without name: trains into runs/<its stem>/)")
    p.add_argument("overrides", nargs="*", help="section.field=value, e.g. model.mixer=sigmoid train.steps=500")
    p.add_argument("--resume", type=non_empty,
                   help="'auto' (newest intact checkpoint of the run) or a checkpoint folder")
    p.add_argument("--quiet", action="store_true", help="no progress bar (there is none when stderr is not a "
                   "terminal: logs get the validation lines only)")
    p.set_defaults(func=main, check=check)


def check(args) -> None:
    if args.resume not in (None, "auto") and not user_path(args.resume).exists():
        raise UserError(f"--resume {args.resume} does not exist; give auto or a run or checkpoint folder")


def main(args) -> None:
    from ..config import load_config, overridden, refuse_unused_options
    from ..train import train

    cfg = load_config(args.config, args.overrides)
    refuse_unused_options(cfg.model, overridden(args.overrides))
    # a bar redraws in place on a terminal; written to a file or a pipe it would be one line per refresh
    progress = not args.quiet and sys.stderr.isatty()
    summary = train(cfg, resume=args.resume, progress=progress, overrides=args.overrides)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, rank 0 speaks for all
        print(f"done: val loss {summary['val_loss']:.4f}, perplexity {summary['val_ppl']:.2f}, "
              f"checkpoints in {summary['run_dir']}")
