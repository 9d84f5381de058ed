"""Corpora, tokenizers and (later) synthetic tasks."""

from .corpus import TokenCorpus, load_corpus
from .tokenizer import ByteTokenizer, CharTokenizer, tokenizer_from_dict

__all__ = ["ByteTokenizer", "CharTokenizer", "TokenCorpus", "load_corpus", "tokenizer_from_dict"]
