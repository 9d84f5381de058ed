"""attnlab export: a run as a Hugging Face transformers folder."""

from __future__ import annotations

import os
import tempfile

from .. import plugins
from ..arguments import RUN, require_extra
from ..errors import UserError
from ..paths import user_path


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="a run as a Hugging Face transformers folder (AutoModelForCausalLM)")
    p.add_argument("checkpoint", help=RUN)
    p.add_argument("folder", help="a new or empty folder for config.json, the weights and the tokenizer")
    p.set_defaults(func=main, check=check)


def check(args) -> None:
    """The output folder, before the run is read: new or empty, in a place where a folder can be made."""
    folder = user_path(args.folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UserError(f"the output folder {args.folder} already exists and is not an empty folder; export into a "
                        "new one")
    existing = next(path for path in (folder, *folder.parents) if path.exists())
    if not existing.is_dir():
        raise UserError(f"the output folder {args.folder} cannot be made: {existing} is a file; give a folder path")
    try:  # a folder made and removed at once: what the export will make there, tried before minutes of work
        os.rmdir(tempfile.mkdtemp(prefix=".attnlab-export-", dir=existing))
    except OSError as err:
        raise UserError(f"the output folder {args.folder} cannot be made in {existing} ({err.strerror}); give a "
                        "folder where you can write") from None


def main(args) -> None:
    require_extra("transformers", "attnlab export", "hf")
    from ..checkpoint import resolve_checkpoint
    from ..hf.export import export

    checkpoint = resolve_checkpoint(args.checkpoint)  # once: a damaged newer checkpoint is said to be skipped once
    _check_built_in_mixers(checkpoint)
    folder = export(checkpoint, args.folder)
    print(f"{folder}: AutoModelForCausalLM.from_pretrained and AutoTokenizer.from_pretrained load it after "
          "import attnlab, or with trust_remote_code=True without it")


def _check_built_in_mixers(folder) -> None:
    """The exported folder carries attnlab's code (for trust_remote_code) and so only attnlab's own mixers."""
    from ..checkpoint import load_config
    from ..config import RunConfig
    from ..mixers import mixer_class
    from ..typed import from_dict

    config = from_dict(RunConfig, load_config(folder)).validate()
    for name in config.mixers():
        module = mixer_class(name).__module__
        if module.split(".")[0] != "attnlab":
            origin = plugins.source_of(mixer_class(name)) or module
            raise UserError(f"attnlab export: mixer '{name}' comes from {origin}, not attnlab, and an exported "
                            "folder can carry attnlab's mixers only; export a run of built-in mixers")
