"""Load a trained model back from a checkpoint, for evaluation and sampling."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from . import checkpoint
from .config import RunConfig
from .data import load_data, tokenizer_from_dict
from .devices import pick_device
from .errors import ConfigError
from .model import Decoder
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
                 num_samples: int | None = None,
                 on_text: Callable[[list[str]], None] | None = None) -> str | list[str]:
        """The prompt followed by up to `tokens` sampled tokens, decoded to text; the sampling options are
        Decoder.generate's. The model sees at most `context` tokens at once (default: its training length;
        None: unbounded).

        stop: a string or several; a sample ends where its continuation first holds one, and its text is
        cut just before it. num_samples: None gives one text; n gives a list of n independent samples.
        on_text: called with the new text of every sample (a list, "" where a sample has none) as it is sampled,
        first the prompt's, last what was held back (the start of a possible stop string, a character still
        arriving), also when generation is interrupted: each sample's pieces join into its text.
        """
        if context == -1:
            context = self.config.train.seq_len
        stops = [stop] if isinstance(stop, str) else list(stop)
        if "" in stops:
            raise ConfigError("stop strings must not be empty; give the text that ends a sample")
        ids = torch.as_tensor(self.tokenizer.encode(prompt), device=self.device)[None]
        start = len(self._text(ids[0]))  # where the continuation's text begins
        streams = [TextStream(self._text, ids[0], stops) for _ in range(num_samples or 1)]
        last = [ids.expand(len(streams), -1)]  # the rows as they were last seen

        def pieces(rows: torch.Tensor, final: bool = False) -> list[str]:
            last[0] = rows
            return [stream.piece(row, final) for stream, row in zip(streams, rows, strict=True)]

        def on_token(rows: torch.Tensor) -> None:
            new = pieces(rows)
            if on_text is not None:
                on_text(new)

        def finished(rows: torch.Tensor) -> torch.Tensor:
            return torch.tensor([stream.stopped for stream in streams])

        if on_text is not None:
            on_text([stream.prompt_text for stream in streams])
        generator = torch.Generator(self.device).manual_seed(seed)
        try:
            out = self.model.generate(ids, tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                      repetition_penalty=repetition_penalty, num_samples=len(streams),
                                      generator=generator, context=context, finished=finished if stops else None,
                                      on_token=on_token if stops or on_text else None)
        finally:  # interrupted too: what was held back, for the caller to keep
            if on_text is not None:
                on_text(pieces(last[0], final=True))
        texts = [text[: _stop_at(text, stops, start)] for text in map(self._text, out)]
        return texts[0] if num_samples is None else texts

    def _text(self, ids: torch.Tensor) -> str:
        return self.tokenizer.decode(ids.tolist())


class TextStream:
    """The text of a growing row of token ids, piece by piece, decoding only its newest tokens (decoding the whole
    row at every token would cost time quadratic in its length). A piece is cut before a stop string, and holds
    back the end of the text while it may be the start of one, or a character whose bytes are still arriving."""

    def __init__(self, decode: Callable[[torch.Tensor], str], prompt: torch.Tensor, stops: list[str]):
        self.decode, self.stops = decode, stops
        self.prompt_text = decode(prompt)
        self.anchor = max(len(prompt) - 1, 0)  # decode from one token back: id vocabularies put spaces between ids
        self.taken = len(decode(prompt[self.anchor :]))  # characters of that tail already in the text
        self.held = ""
        self.stopped = False

    def piece(self, row: torch.Tensor, final: bool = False) -> str:
        """The text the row's tokens [T] after the last call add; final: with nothing held back."""
        if self.stopped:
            return ""
        tail = self.decode(row[self.anchor :])
        if not tail.endswith("\ufffd") or final:  # else a character's bytes are still arriving: wait for them
            self.held += tail[self.taken :]
            self.anchor = len(row) - 1
            self.taken = len(self.decode(row[self.anchor :]))
        cut = min((i for stop in self.stops if (i := self.held.find(stop)) >= 0), default=None)
        if cut is not None:
            self.stopped = True
            piece, self.held = self.held[:cut], ""
            return piece
        # keep back the longest end of the text that a stop string begins with
        keep = 0 if final else max((n for stop in self.stops for n in range(1, len(stop))
                                    if self.held.endswith(stop[:n])), default=0)
        piece, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep :]
        return piece


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
