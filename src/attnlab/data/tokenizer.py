"""Character- and byte-level tokenizers. Both turn text into small-integer numpy arrays and back."""

from __future__ import annotations

import numpy as np

from ..errors import UserError


class NotInVocabulary(UserError):
    """Text holds characters that a fixed vocabulary (a trained model's) lacks."""

    def __init__(self, characters: list[str], vocab_size: int):
        self.characters, self.vocab_size = characters, vocab_size
        super().__init__(f"characters {characters!r} are not in this model's vocabulary of {vocab_size} characters "
                         "(those of its training text)")


def _code_points(text: str) -> np.ndarray:
    # surrogatepass: command-line text may hold lone surrogates (bytes that were not UTF-8), which are then
    # simply characters outside the vocabulary
    return np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)


class CharTokenizer:
    """One id per distinct character of the corpus, ids in code-point order (vocab 65 on Tiny Shakespeare)."""

    kind = "char"

    def __init__(self, chars: str):
        self.chars = "".join(sorted(set(chars)))
        self._codes = _code_points(self.chars)  # sorted, so ids come from a binary search

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        codes = _code_points(text)
        ids = np.searchsorted(self._codes, codes)
        unknown = (ids >= len(self._codes)) | (self._codes[np.minimum(ids, len(self._codes) - 1)] != codes)
        if unknown.any():
            bad = sorted({chr(c) for c in codes[unknown]})
            raise NotInVocabulary(bad, self.vocab_size)
        return ids.astype(np.int64)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "chars": self.chars}


class ByteTokenizer:
    """The UTF-8 bytes of the text: a fixed vocabulary of 256 that needs no fitting."""

    kind = "byte"
    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        # surrogateescape gives back the original bytes of command-line text that was not UTF-8
        return np.frombuffer(text.encode("utf-8", errors="surrogateescape"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def to_dict(self) -> dict:
        return {"kind": self.kind}


class BPETokenizer:
    """Byte-level BPE trained locally with the `tokenizers` library (no download)."""

    kind = "bpe"

    def __init__(self, model):
        self.model = model

    @classmethod
    def train(cls, texts, vocab_size: int) -> BPETokenizer:
        try:
            from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        except ImportError:
            raise UserError("data.tokenizer=bpe needs the tokenizers package: pip install 'attnlab[hf]'") from None
        model = Tokenizer(models.BPE())
        model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        model.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        model.train_from_iterator(texts, trainer=trainer)
        return cls(model)

    @property
    def vocab_size(self) -> int:
        return self.model.get_vocab_size()

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.model.encode(text).ids, dtype=np.int64)

    def decode(self, ids) -> str:
        return self.model.decode([int(i) for i in ids])

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model.to_str()}


class IdTokenizer:
    """For synthetic tasks whose tokens are plain ids: decoding prints them."""

    kind = "ids"

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> np.ndarray:
        words = text.split()
        if not all(w.isascii() and w.isdigit() and int(w) < self.vocab_size for w in words):
            raise UserError(f"this model reads token ids, not text: give integers from 0 to {self.vocab_size - 1} "
                            "separated by spaces, e.g. '3 1 4'")
        return np.asarray([int(w) for w in words], dtype=np.int64)

    def decode(self, ids) -> str:
        return " ".join(str(int(i)) for i in ids)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "vocab_size": self.vocab_size}


def tokenizer_from_dict(values: dict):
    if values["kind"] == "char":
        return CharTokenizer(values["chars"])
    if values["kind"] == "byte":
        return ByteTokenizer()
    if values["kind"] == "bpe":
        from tokenizers import Tokenizer

        return BPETokenizer(Tokenizer.from_str(values["model"]))
    if values["kind"] == "ids":
        return IdTokenizer(values["vocab_size"])
    raise ValueError(f"unknown tokenizer kind {values['kind']!r}")


def describe(values: dict) -> str:
    """'bpe, vocabulary of 512': a tokenizer (as to_dict gives it) in words."""
    return f"{values['kind']}, vocabulary of {tokenizer_from_dict(values).vocab_size}"


def difference(ours: dict, theirs: dict) -> str | None:
    """What differs between two tokenizers (as to_dict gives them), ours the data's and theirs a checkpoint's, in
    words; None when they are the same."""
    if ours == theirs:
        return None
    if ours["kind"] != theirs["kind"]:
        return f"the data's tokenizer ({describe(ours)}) is not the checkpoint's ({describe(theirs)})"
    a, b = tokenizer_from_dict(ours), tokenizer_from_dict(theirs)
    if a.kind == "char":
        extra, missing = sorted(set(a.chars) - set(b.chars)), sorted(set(b.chars) - set(a.chars))
        parts = [f"the data has characters {extra!r} that the checkpoint's vocabulary lacks"] if extra else []
        parts += [f"the checkpoint's vocabulary has characters {missing!r} that the data lacks"] if missing else []
        return " and ".join(parts)
    if a.kind == "bpe":
        va, vb = a.model.get_vocab(), b.model.get_vocab()
        differ = sorted(t for t in va.keys() | vb.keys() if va.get(t) != vb.get(t))
        return (f"the data's BPE ({describe(ours)}) and the checkpoint's ({describe(theirs)}) give {len(differ):,} "
                f"tokens other ids or none (e.g. {differ[0]!r}): they were trained on other text")
    return f"the data's token ids ({describe(ours)}) are not the checkpoint's ({describe(theirs)})"


def token_dtype(vocab_size: int):
    """The smallest unsigned integer type that holds every id."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size <= np.iinfo(dtype).max + 1:
            return dtype
    raise ValueError(f"vocabulary of {vocab_size} is too large")
