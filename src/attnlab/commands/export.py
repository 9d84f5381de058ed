"""attnlab export: a run as a Hugging Face transformers folder."""

from __future__ import annotations

from .. import plugins
from ..arguments import RUN, require_extra
from ..errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="a run as a Hugging Face transformers folder (AutoModelForCausalLM)")
    p.add_argument("checkpoint", help=RUN)
    p.add_argument("folder", help="a new or empty folder for config.json, the weights and the tokenizer")
    p.set_defaults(func=main)


def main(args) -> None:
    require_extra("transformers", "attnlab export", "hf")
    from ..hf.export import export

    _check_built_in_mixers(args.checkpoint)
    folder = export(args.checkpoint, args.folder)
    print(f"{folder}: AutoModelForCausalLM.from_pretrained and AutoTokenizer.from_pretrained load it after "
          "import attnlab, or with trust_remote_code=True without it")


def _check_built_in_mixers(path: str) -> None:
    """The exported folder carries attnlab's code (for trust_remote_code) and so only attnlab's own mixers."""
    from .. import checkpoint
    from ..config import RunConfig
    from ..mixers import mixer_class
    from ..typed import from_dict

    config = from_dict(RunConfig, checkpoint.load_config(checkpoint.resolve_checkpoint(path))).validate()
    for name in config.mixers():
        module = mixer_class(name).__module__
        if module.split(".")[0] != "attnlab":
            origin = plugins.source_of(mixer_class(name)) or module
            raise UserError(f"attnlab export: mixer '{name}' comes from {origin}, not attnlab, and an exported "
                            "folder can carry attnlab's mixers only; export a run of built-in mixers")
