"""Text corpora turned into memory-mapped token arrays with a deterministic train/validation split.

Preparing a corpus reads its text as a stream, so a file larger than memory is fine: a first pass
counts characters and collects the character vocabulary, a second pass writes the token ids into one
``tokens.bin`` array. The first ``1 - val_fraction`` of the tokens are the training split, the rest
the validation split (nanoGPT's 90/10 convention). Prepared arrays are cached by a key of everything
that affects them, and written to a temporary folder that is renamed into place when complete.

Preparing also records in ``doc_starts.npy`` the token offset where every document starts (the first is
0). Documents are joined by DOC_SEPARATOR in the token stream, and a document's tokens open with the
separator that precedes it (the first document has none): the separator is then the context its first
token is predicted from, and the stream is the same whether batches are windows or packed documents.

The functions here take `cfg`, the run's data config (attnlab.config.DataConfig).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..paths import user_path
from ..permissions import follow_umask
from .files import dialogue, dialogue_files, read_play, shakespeare_files, strip_licence, text_files
from .hf import DOCUMENT_OPENERS, hf_documents, local_files, parse_source, reads_files
from .texts import heterogeneous_text
from .tokenizer import BPETokenizer, ByteTokenizer, CharTokenizer, token_dtype, tokenizer_from_dict

FORMAT_VERSION = 3  # 3: doc_starts.npy
READ_CHUNK = 1 << 22  # characters per read when streaming a file
DOC_SEPARATOR = "\n\n"
IGNORE = -100  # the target of a position that is not scored
# the local text corpora: the plays as printed, their speeches in Tiny Shakespeare's layout (Coriolanus first),
# data.path's files, and the plays mixed with Python's source and documentation; hf:<dataset> names the others
TEXT_SOURCES = ("shakespeare", "shakespeare-dialogue", "text", "mixed")


def is_text(source: str) -> bool:
    """Whether data.source names a text corpus (not a synthetic task)."""
    return source in TEXT_SOURCES or source.startswith("hf:")


def source_files(cfg) -> list[Path]:
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


def read_text(cfg) -> Iterator[str]:
    """The corpus as a stream of text pieces: documents joined by a blank line, cut at max_chars."""
    for _, piece in read_pieces(cfg):
        yield piece


def read_pieces(cfg) -> Iterator[tuple[bool, str]]:
    """The pieces of read_text, each with whether it opens a document."""
    budget = cfg.max_chars if cfg.max_chars is not None else float("inf")
    for document in _documents(cfg):
        for i, piece in enumerate(document):
            if budget <= 0:
                return
            piece = piece[: int(min(len(piece), budget))]
            budget -= len(piece)
            yield i == 0, piece


def _documents(cfg) -> Iterator[Iterable[str]]:
    """Every document as a stream of pieces; each after the first opens with DOC_SEPARATOR."""
    if cfg.source == "mixed":
        yield [heterogeneous_text(cfg.max_chars, cfg.mix, cfg.chunk_chars, cfg.seed)]
        return
    if cfg.source.startswith("hf:"):  # rows joined by DOC_SEPARATOR as ever; a document of several opens once
        for i, rows in enumerate(hf_documents(cfg)):
            yield [DOC_SEPARATOR + row if i or j else row for j, row in enumerate(rows)]
        return
    for i, path in enumerate(source_files(cfg)):
        yield _file_document(cfg, path, DOC_SEPARATOR if i else "")


def _file_document(cfg, path: Path, separator: str) -> Iterator[str]:
    if separator:
        yield separator
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
    """Memory-mapped token ids split into train and validation, where each document starts, and the tokenizer
    that made them."""

    tokens: np.memmap
    n_train: int
    tokenizer: CharTokenizer | ByteTokenizer
    folder: Path
    doc_starts: np.ndarray  # int64 token offsets, the first 0

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def describe(self) -> str:
        return f"{len(self.split('train')):,} training tokens, {self.tokenizer.kind} vocabulary of {self.vocab_size}"

    def split(self, name: str) -> np.ndarray:
        if name not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {name!r}")
        return self.tokens[: self.n_train] if name == "train" else self.tokens[self.n_train:]

    def document_bounds(self, name: str) -> np.ndarray:
        """Offsets into split(name): document i is split(name)[b[i]:b[i + 1]]. A document that straddles the
        train/validation cut is cut there, so the validation split's first document starts at 0."""
        lo, hi = (0, self.n_train) if name == "train" else (self.n_train, len(self.tokens))
        inside = self.doc_starts[(self.doc_starts > lo) & (self.doc_starts < hi)] - lo
        return np.unique(np.concatenate([[0], inside, [hi - lo]])).astype(np.int64)

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

    def packed_batch(self, split: str, batch_size: int, seq_len: int, generator: torch.Generator):
        """batch_size rows of whole documents packed by pack_rows, as rows_to_tensors gives them: (inputs,
        targets, cu_seqlens). Each call packs the documents in a new order drawn from the generator, every
        document once before any repeats."""
        documents = self._documents(split, seq_len)
        rows = pack_rows(_shuffled(documents, generator), seq_len)
        return rows_to_tensors(self.split(split), [next(rows) for _ in range(batch_size)], seq_len)

    def packed_split(self, split: str, seq_len: int):
        """The whole split's documents in order, packed by pack_rows, for evaluation: every token with a
        predecessor in its own document is scored exactly once. (inputs, targets, cu_seqlens) for all rows."""
        rows = list(pack_rows(self._documents(split, seq_len), seq_len))
        return rows_to_tensors(self.split(split), rows, seq_len)

    def _documents(self, split: str, seq_len: int) -> list[tuple[int, int]]:
        """(start, length) of the split's documents, for rows of seq_len tokens."""
        if seq_len < 2:
            raise UserError(f"packed rows need train.seq_len of at least 2 (a token and its target), got {seq_len}")
        bounds = self.document_bounds(split)
        if len(bounds) < 2:
            raise UserError(f"the {split} split is empty; use more text (data.max_chars) or a larger data.val_fraction")
        return list(zip(bounds[:-1].tolist(), np.diff(bounds).tolist(), strict=True))


def _shuffled(documents: list[tuple[int, int]], generator: torch.Generator) -> Iterator[tuple[int, int]]:
    """Every document in a random order, then again in a new order, without end."""
    while True:
        for i in torch.randperm(len(documents), generator=generator).tolist():
            yield documents[i]


def pack_rows(documents: Iterable[tuple[int, int]], seq_len: int) -> Iterator[list[tuple[int, int]]]:
    """Greedy packing of (start, length) documents into rows of seq_len tokens, each row a list of its
    sequences as (start, length). A document that does not fit in what is left of a row starts the next row
    (the rest is padding). One longer than a row is cut into row-sized pieces, each its own sequence; a piece
    starts at the last token of the piece before, so that every target of the document is still scored once."""
    row, free = [], seq_len
    for start, length in documents:
        if length > free and row:
            yield row
            row, free = [], seq_len
        while length > seq_len:
            yield [(start, seq_len)]
            start, length = start + seq_len - 1, length - seq_len + 1
        row.append((start, length))
        free -= length
    if row:
        yield row


def rows_to_tensors(data: np.ndarray, rows: list[list[tuple[int, int]]], seq_len: int):
    """Inputs and targets, int64 [len(rows), seq_len], and cu_seqlens for the flattened batch.

    Targets are the inputs shifted by one within each sequence; a sequence's last token and padding (id 0)
    have target IGNORE, so the loss never predicts across a boundary. cu_seqlens (int64) is 0, then the end of
    every sequence, a padding run counting as one, ending with len(rows) * seq_len."""
    inputs = np.zeros((len(rows), seq_len), dtype=np.int64)
    targets = np.full((len(rows), seq_len), IGNORE, dtype=np.int64)
    ends = [0]
    for r, row in enumerate(rows):
        at = 0
        for start, length in row:
            inputs[r, at : at + length] = data[start : start + length]
            targets[r, at : at + length - 1] = data[start + 1 : start + length]
            at += length
            ends.append(r * seq_len + at)
        if at < seq_len:
            ends.append((r + 1) * seq_len)
    return torch.from_numpy(inputs), torch.from_numpy(targets), torch.tensor(ends, dtype=torch.int64)


def packed_rows(inputs: torch.Tensor, targets: torch.Tensor, cu_seqlens: torch.Tensor, rows: slice):
    """Rows of a packed batch (as rows_to_tensors gives it) as one packed row: inputs and targets
    [1, n_rows * seq_len] and the boundaries of its sequences (every row start is one, so any rows cut
    cleanly)."""
    seq_len = inputs.shape[1]
    x, y = inputs[rows], targets[rows]
    first = (rows.start or 0) * seq_len
    inside = cu_seqlens[(cu_seqlens >= first) & (cu_seqlens <= first + x.numel())]
    return x.reshape(1, -1), y.reshape(1, -1), inside - first


def default_cache_dir() -> Path:
    return Path(os.environ.get("ATTNLAB_CACHE", Path.home() / ".cache" / "attnlab"))


def cache_key(cfg) -> str:
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
    if cfg.source.startswith("hf:") and parse_source(cfg.source)[0] in DOCUMENT_OPENERS:
        identity["documents"] = "grouped rows"  # where documents start (the tokens are the same)
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def load_corpus(cfg, tokenizer=None) -> TokenCorpus:
    """Prepare the corpus once (cached) and memory-map it. With a tokenizer (a trained model's, which a run
    resumed or fine-tuned reads its text with) the text is read with it: the corpus it fits to itself where that
    is the same tokenizer, else one cached by the tokenizer's contents too."""
    cache = user_path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
    folder = cache / "corpora" / cache_key(cfg)
    if tokenizer is not None and not (_complete(folder) and _meta(folder)["tokenizer"] == tokenizer.to_dict()):
        identity = json.dumps(tokenizer.to_dict(), sort_keys=True).encode()
        folder = folder.with_name(f"{folder.name}-{hashlib.sha256(identity).hexdigest()[:12]}")
    if not _complete(folder):
        _prepare(cfg, folder, tokenizer)
    meta = _meta(folder)
    tokens = np.memmap(folder / "tokens.bin", dtype=meta["dtype"], mode="r")
    doc_starts = np.load(folder / "doc_starts.npy")
    return TokenCorpus(tokens, meta["n_train"], tokenizer_from_dict(meta["tokenizer"]), folder, doc_starts)


def _meta(folder: Path) -> dict:
    return json.loads((folder / "meta.json").read_text())


def _complete(folder: Path) -> bool:
    return (folder / "meta.json").is_file() and (folder / "doc_starts.npy").is_file()


def _fit_tokenizer(cfg):
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


def _prepare(cfg, folder: Path, tokenizer=None) -> None:
    tokenizer = tokenizer or _fit_tokenizer(cfg)
    dtype = token_dtype(tokenizer.vocab_size)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    try:
        n_tokens, doc_starts = 0, [0]
        with open(tmp / "tokens.bin", "wb") as out:
            for opens_document, piece in read_pieces(cfg):
                if opens_document:
                    doc_starts.append(n_tokens)
                ids = tokenizer.encode(piece).astype(dtype)
                out.write(ids.tobytes())
                n_tokens += len(ids)
        if n_tokens == 0:  # a given tokenizer skips the first pass, which finds an empty corpus
            raise UserError(f"the corpus (data.source={cfg.source}) is empty")
        doc_starts = np.unique(doc_starts)  # an empty document starts where the next one does
        np.save(tmp / "doc_starts.npy", doc_starts[doc_starts < n_tokens].astype(np.int64))
        meta = {
            "dtype": np.dtype(dtype).name,
            "n_tokens": n_tokens,
            "n_train": int(round(n_tokens * (1 - cfg.val_fraction))),
            "tokenizer": tokenizer.to_dict(),
            "source": cfg.source,
        }
        (tmp / "meta.json").write_text(json.dumps(meta))
        follow_umask(tmp)  # mkdtemp makes it 0700: a shared cache is read by others
        if folder.is_dir() and not _complete(folder):  # a cache from before doc_starts.npy: rebuilt
            shutil.rmtree(folder, ignore_errors=True)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process finished the same corpus first; theirs is identical
            if not _complete(folder):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
