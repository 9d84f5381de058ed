"""Load a trained model back from a checkpoint, for evaluation and sampling."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from . import checkpoint
from .config import RunConfig
from .data import load_data, tokenizer_from_dict
from .errors import ConfigError
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
                 seed: int = 0, context: int | None = -1, top_p: float | None = None,
                 repetition_penalty: float = 1.0, stop: str | list[str] = (),
                 num_samples: int | None = None) -> str | list[str]:
        """The prompt followed by up to `tokens` sampled tokens, decoded to text; the sampling options are
        Decoder.generate's. The model sees at most `context` tokens at once (default: its training length;
        None: unbounded).

        stop: a string or several; a sample ends where its continuation first holds one, and its text is
        cut just before it. num_samples: None gives one text; n gives a list of n independent samples.
        """
        if context == -1:
            context = self.config.train.seq_len
        stops = [stop] if isinstance(stop, str) else list(stop)
        if "" in stops:
            raise ConfigError("stop strings must not be empty; give the text that ends a sample")
        ids = torch.as_tensor(self.tokenizer.encode(prompt), device=self.device)[None]
        start = len(self._text(ids[0]))  # where the continuation's text begins

        def finished(rows: torch.Tensor) -> torch.Tensor:
            return torch.tensor([_stop_at(text, stops, start) < len(text) for text in map(self._text, rows)])

        generator = torch.Generator(self.device).manual_seed(seed)
        out = self.model.generate(ids, tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                  repetition_penalty=repetition_penalty,
                                  num_samples=1 if num_samples is None else num_samples, generator=generator,
                                  context=context, finished=finished if stops else None)
        texts = [text[: _stop_at(text, stops, start)] for text in map(self._text, out)]
        return texts[0] if num_samples is None else texts

    def _text(self, ids: torch.Tensor) -> str:
        return self.tokenizer.decode(ids.tolist())


def _stop_at(text: str, stops: list[str], start: int) -> int:
    """Where the first stop string in text[start:] begins; len(text) if none is there."""
    return min((i for stop in stops if (i := text.find(stop, start)) >= 0), default=len(text))


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
