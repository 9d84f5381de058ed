"""Corpora, tokenizers and synthetic tasks, behind one entry point: `load_data`.

Every data source offers ``batch(split, batch_size, seq_len, generator) -> (inputs, targets)`` (targets
of -100 are not scored), ``vocab_size``, ``tokenizer`` and ``describe()``; tasks with a pointer head
also set ``output_size``. Text corpora also serve whole documents packed into rows, with their boundaries:
``packed_batch`` for training and ``packed_split`` for evaluation.
"""

from __future__ import annotations

from .brackets import BracketData
from .corpus import TokenCorpus, load_corpus
from .mqar import MQARData
from .niah import NOISE, NIAHData
from .texts import python_docs_text, source_text
from .tokenizer import ByteTokenizer, CharTokenizer, IdTokenizer, tokenizer_from_dict

__all__ = ["ByteTokenizer", "CharTokenizer", "TokenCorpus", "load_corpus", "load_data", "tokenizer_from_dict"]


def load_data(cfg, seq_len: int):
    """The data source named by cfg.source (a DataConfig), for sequences of seq_len tokens."""
    if cfg.source == "mqar":
        data = MQARData(cfg.mqar, seq_len)
        data.tokenizer = IdTokenizer(data.vocab_size)
        return data
    if cfg.source == "brackets":
        data = BracketData(cfg.brackets, seq_len)
        data.tokenizer = IdTokenizer(data.vocab_size)
        return data
    if cfg.source == "niah":
        haystacks, tokenizer = niah_haystacks(cfg.niah.prose)
        return NIAHData(cfg.niah, seq_len, haystacks, tokenizer)
    return load_corpus(cfg)


def niah_haystacks(prose: str):
    """Train/validation haystack text (first 90% / last 10%) and a character tokenizer covering it and
    every needle and question."""
    text = source_text("plays", 10**9) if prose == "plays" else python_docs_text()
    cut = int(len(text) * 0.9)
    extra = NOISE + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-:?.\n "
    return {"train": text[:cut], "val": text[cut:]}, CharTokenizer(text + extra)
