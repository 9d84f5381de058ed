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
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import UserError
from ..permissions import follow_umask
from .files import dialogue, dialogue_files, read_play, shakespeare_files, strip_licence, text_files
from .hf import hf_documents, local_files, reads_files
from .texts import heterogeneous_text
from .tokenizer import BPETokenizer, ByteTokenizer, CharTokenizer, token_dtype, tokenizer_from_dict

if TYPE_CHECKING:
    from ..config import DataConfig

FORMAT_VERSION = 2
READ_CHUNK = 1 << 22  # characters per read when streaming a file
DOC_SEPARATOR = "\n\n"


def source_files(cfg: DataConfig) -> list[Path]:
    """The files a corpus is read from (none for the generated mixed corpus or remote datasets)."""
    if cfg.source == "shakespeare":
        return shakespeare_files()
    if cfg.source == "shakespeare-dialogue":
        return dialogue_files()
    if cfg.source == "text":
        return text_files(cfg.path)
    if reads_files(cfg.source):
        return local_files(cfg.path, cfg.source)
    return []


def read_text(cfg: DataConfig) -> Iterator[str]:
    """The corpus as a stream of text pieces: documents joined by a blank line, cut at max_chars."""
    budget = cfg.max_chars if cfg.max_chars is not None else float("inf")
    for piece in _documents(cfg):
        if budget <= 0:
            return
        piece = piece[: int(min(len(piece), budget))]
        budget -= len(piece)
        yield piece


def _documents(cfg: DataConfig) -> Iterator[str]:
    if cfg.source == "mixed":
        yield heterogeneous_text(cfg.max_chars, cfg.mix, cfg.chunk_chars, cfg.seed)
        return
    if cfg.source.startswith("hf:"):
        first = True
        for document in hf_documents(cfg):
            yield document if first else DOC_SEPARATOR + document
            first = False
        return
    for i, path in enumerate(source_files(cfg)):
        if i:
            yield DOC_SEPARATOR
        if cfg.source == "shakespeare-dialogue":
            yield dialogue(read_play(path))
        elif cfg.source == "shakespeare":
            yield strip_licence(read_play(path))
        else:
            yield from _file_pieces(path)


def _file_pieces(path: Path) -> Iterator[str]:
    try:
        # utf-8-sig: a byte-order mark that opens the file marks its encoding; it is not a character of the text
        with open(path, encoding="utf-8-sig", newline=None) as f:
            while piece := f.read(READ_CHUNK):
                yield piece
    except UnicodeDecodeError as err:
        raise UserError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); convert it to UTF-8") from None


@dataclass
class TokenCorpus:
    """Memory-mapped token ids split into train and validation, and the tokenizer that made them."""

    tokens: np.memmap
    n_train: int
    tokenizer: CharTokenizer | ByteTokenizer
    folder: Path

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def describe(self) -> str:
        return f"{len(self.split('train')):,} training tokens, {self.tokenizer.kind} vocabulary of {self.vocab_size}"

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


def cache_key(cfg: DataConfig) -> str:
    """A hash of everything that determines the token array."""
    identity = {
        "format": FORMAT_VERSION,
        "source": cfg.source,
        "tokenizer": cfg.tokenizer,
        "bpe_vocab": cfg.bpe_vocab if cfg.tokenizer == "bpe" else None,
        "max_chars": cfg.max_chars,
        "val_fraction": cfg.val_fraction,
        "files": [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in source_files(cfg)],
    }
    if cfg.source == "mixed":
        identity.update(mix=cfg.mix, chunk_chars=cfg.chunk_chars, seed=cfg.seed, python=sys.version)
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def load_corpus(cfg: DataConfig) -> TokenCorpus:
    """Prepare the corpus once (cached) and memory-map it."""
    cache = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else default_cache_dir()
    folder = cache / "corpora" / cache_key(cfg)
    if not (folder / "meta.json").is_file():
        _prepare(cfg, folder)
    meta = json.loads((folder / "meta.json").read_text())
    tokens = np.memmap(folder / "tokens.bin", dtype=meta["dtype"], mode="r")
    return TokenCorpus(tokens, meta["n_train"], tokenizer_from_dict(meta["tokenizer"]), folder)


def _fit_tokenizer(cfg: DataConfig):
    """A first pass over the text: the tokenizer (fitted where it needs to be) and the character count."""
    n_chars, chars = 0, set()
    for piece in read_text(cfg):
        n_chars += len(piece)
        if cfg.tokenizer == "char":
            chars.update(piece)
    if n_chars == 0:
        raise UserError(f"the corpus (data.source={cfg.source}) is empty")
    if cfg.tokenizer == "char":
        return CharTokenizer("".join(chars))
    if cfg.tokenizer == "bpe":
        return BPETokenizer.train(read_text(cfg), cfg.bpe_vocab)
    return ByteTokenizer()


def _prepare(cfg: DataConfig, folder: Path) -> None:
    tokenizer = _fit_tokenizer(cfg)
    dtype = token_dtype(tokenizer.vocab_size)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    try:
        n_tokens = 0
        with open(tmp / "tokens.bin", "wb") as out:
            for piece in read_text(cfg):
                ids = tokenizer.encode(piece).astype(dtype)
                out.write(ids.tobytes())
                n_tokens += len(ids)
        meta = {
            "dtype": np.dtype(dtype).name,
            "n_tokens": n_tokens,
            "n_train": int(round(n_tokens * (1 - cfg.val_fraction))),
            "tokenizer": tokenizer.to_dict(),
            "source": cfg.source,
        }
        (tmp / "meta.json").write_text(json.dumps(meta))
        follow_umask(tmp)  # mkdtemp makes it 0700: a shared cache is read by others
        try:
            os.replace(tmp, folder)
        except OSError:  # another process finished the same corpus first; theirs is identical
            if not (folder / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
