"""`attnlab export`: a trained run as a folder that transformers loads. It loads after `import attnlab`, or with
trust_remote_code=True without it (see remote.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import UserError
from ..inference import load_run
from ..paths import user_path
from ..permissions import follow_umask
from .modeling import AttnlabConfig, AttnlabForCausalLM
from .tokenization import hf_tokenizer


def export(run: str | Path, folder: str | Path) -> Path:
    """Write the run's model (its best checkpoint if it stopped early, else its newest) and tokenizer."""
    folder = user_path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UserError(f"{folder} already exists and is not an empty folder; export into a new one")
    loaded = load_run(run, device="cpu")
    tokenizer = hf_tokenizer(loaded.tokenizer)
    special = {f"{kind}_token_id": getattr(tokenizer, f"{kind}_token_id") for kind in ("bos", "eos", "pad")}
    config = AttnlabConfig(attnlab=dataclasses.asdict(loaded.config.model),
                           max_position_embeddings=loaded.config.train.seq_len, **special)
    model = AttnlabForCausalLM(config)
    model.model.load_state_dict(loaded.model.state_dict())
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    follow_umask(folder)  # safetensors writes 0600, which would keep others from loading it
    return folder
