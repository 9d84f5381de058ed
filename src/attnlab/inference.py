"""Load a trained model back from a checkpoint, for evaluation and sampling."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from . import checkpoint
from .config import RunConfig
from .data import load_data, tokenizer_from_dict
from .model import Decoder
from .train import pick_device
from .typed import from_dict


@dataclass
class LoadedRun:
    config: RunConfig
    model: Decoder
    tokenizer: object
    device: torch.device
    folder: Path

    def corpus(self):
        return load_data(self.config.data, self.config.train.seq_len)

    def complete(self, prompt: str, tokens: int, temperature: float = 0.8, top_k: int | None = None,
                 seed: int = 0, context: int | None = -1) -> str:
        """The prompt followed by `tokens` sampled tokens, decoded to text. The model sees at most
        `context` tokens at once (default: its training length; None: unbounded)."""
        if context == -1:
            context = self.config.train.seq_len
        ids = torch.as_tensor(self.tokenizer.encode(prompt), device=self.device)[None]
        generator = torch.Generator(self.device).manual_seed(seed)
        out = self.model.generate(ids, tokens, temperature=temperature, top_k=top_k, generator=generator,
                                  context=context)
        return self.tokenizer.decode(out[0].tolist())


def load_run(path: str | Path, device: str = "auto") -> LoadedRun:
    """A run folder (its best checkpoint when it trained with early stopping, else its newest intact one) or
    a step-XXXXXXXX checkpoint folder."""
    folder = checkpoint.resolve_checkpoint(path)
    config = from_dict(RunConfig, checkpoint.load_config(folder)).validate()
    dev = pick_device(device)
    model = Decoder(config.model)
    checkpoint.load_weights(model, folder)
    model.to(dev).eval()
    tokenizer = tokenizer_from_dict(checkpoint.load_tokenizer_dict(folder))
    return LoadedRun(config, model, tokenizer, dev, folder)
