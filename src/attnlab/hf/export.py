"""`attnlab export`: a trained run as a folder that transformers loads (after `import attnlab`, or with
trust_remote_code=True without it: see remote.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import UserError
from ..inference import load_run
from .modeling import AttnlabConfig, AttnlabForCausalLM
from .tokenization import hf_tokenizer


def export(run: str | Path, folder: str | Path) -> Path:
    """Write the run's model (its best checkpoint if it stopped early, else its newest) and tokenizer."""
    folder = Path(folder).expanduser()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UserError(f"{folder} already exists and is not an empty folder; export into a new one")
    loaded = load_run(run, device="cpu")
    window = loaded.config.train.seq_len
    config = AttnlabConfig(attnlab=dataclasses.asdict(loaded.config.model), max_position_embeddings=window)
    model = AttnlabForCausalLM(config)
    model.model.load_state_dict(loaded.model.state_dict())
    model.save_pretrained(folder)
    hf_tokenizer(loaded.tokenizer).save_pretrained(folder)
    return folder
