"""The one-line module every saved attnlab folder carries, so that transformers loads it with
trust_remote_code=True. It serves a process that never imported attnlab (the lm-eval command line, pipelines).

It imports the classes from the installed attnlab rather than copying attnlab's code into the folder: a
saved model stays tied to the reference implementation, not to a frozen copy of it.
"""

from __future__ import annotations

from pathlib import Path

MODULE = "attnlab_remote"
MODEL_AUTO_MAP = {"AutoConfig": f"{MODULE}.AttnlabConfig", "AutoModelForCausalLM": f"{MODULE}.AttnlabForCausalLM"}
TOKENIZER_AUTO_MAP = {"AutoTokenizer": [f"{MODULE}.AttnlabTokenizer", None]}
CODE = '''"""Loads this model with trust_remote_code=True: the classes come from the installed attnlab."""

from attnlab.hf import AttnlabConfig, AttnlabForCausalLM, AttnlabTokenizer

__all__ = ["AttnlabConfig", "AttnlabForCausalLM", "AttnlabTokenizer"]
'''


def write_module(folder) -> None:
    (Path(folder) / f"{MODULE}.py").write_text(CODE)


class SavesRemoteModule:
    """Mixed into the config, model and tokenizer classes: they never register for an Auto class themselves.

    transformers would otherwise copy the source file of a class loaded through remote code into the next
    save (register_for_auto_class), where its relative imports break. The folder's own attnlab_remote.py
    and auto_map, written by the config's and the slow tokenizer's save_pretrained, are what it should find."""

    @classmethod
    def register_for_auto_class(cls, auto_class=None):
        pass
