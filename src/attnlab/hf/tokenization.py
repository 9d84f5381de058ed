"""attnlab's tokenizers for transformers: character, byte and id vocabularies as a slow tokenizer, the BPE as a fast
one. The slow one is a `PreTrainedTokenizer` that encodes with attnlab's own tokenizer; the BPE is the fast
tokenizer it is.

The vocabularies have no token of their own for the end of a text, and adding one would change the
model's vocabulary; the newline, the document boundary of attnlab's corpora (which join documents by a
blank line), is the bos, eos and pad token instead, so that transformers can pad batches."""

from __future__ import annotations

from transformers import PreTrainedTokenizer, PreTrainedTokenizerFast

from ..data.tokenizer import BPETokenizer, tokenizer_from_dict
from ..errors import UserError
from .remote import TOKENIZER_AUTO_MAP, SavesRemoteModule, write_module


class AttnlabTokenizer(SavesRemoteModule, PreTrainedTokenizer):
    """Ids come from attnlab's tokenizer (`attnlab_tokenizer`: its to_dict()), so they are the ones the model
    was trained on. Each id has one token string, for display: the character, the byte as a Latin-1
    character, or the id's digits."""

    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, attnlab_tokenizer: dict, **kwargs):
        self.inner = tokenizer_from_dict(attnlab_tokenizer)
        self.attnlab_tokenizer = attnlab_tokenizer
        self.tokens = _token_strings(self.inner)
        self.ids = {token: i for i, token in enumerate(self.tokens)}
        kwargs.setdefault("clean_up_tokenization_spaces", False)  # decoding gives back the text, spaces as they were
        super().__init__(attnlab_tokenizer=attnlab_tokenizer, **kwargs)

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return {**self.ids, **self.added_tokens_encoder}

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return [self.tokens[i] for i in self.inner.encode(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self.ids[token]

    def _convert_id_to_token(self, index: int) -> str:
        return self.tokens[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self.inner.decode([self.ids[t] for t in tokens])

    def save_pretrained(self, save_directory, *args, **kwargs):
        self.init_kwargs["auto_map"] = TOKENIZER_AUTO_MAP
        saved = super().save_pretrained(save_directory, *args, **kwargs)
        write_module(save_directory)
        return saved

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        return ()  # the vocabulary is in tokenizer_config.json (attnlab_tokenizer)


def _token_strings(tokenizer) -> list[str]:
    if tokenizer.kind == "char":
        return list(tokenizer.chars)
    if tokenizer.kind == "byte":
        return [chr(b) for b in range(256)]
    return [str(i) for i in range(tokenizer.vocab_size)]


def newline_id(tokenizer) -> int | None:
    """The id of the newline where the vocabulary has it as one token (not the id vocabularies of synthetic
    tasks, nor a character vocabulary whose text had no line breaks)."""
    try:
        ids = tokenizer.encode("\n")
    except UserError:  # a character vocabulary without it
        return None
    return int(ids[0]) if len(ids) == 1 else None


def special_tokens(tokenizer) -> dict[str, str]:
    """bos, eos and pad token: the newline's token string, or none where the vocabulary has no newline."""
    newline = newline_id(tokenizer)
    if newline is None:
        return {}
    token = tokenizer.model.id_to_token(newline) if isinstance(tokenizer, BPETokenizer) else "\n"
    return {"bos_token": token, "eos_token": token, "pad_token": token}


def hf_tokenizer(tokenizer):
    """The transformers tokenizer of an attnlab tokenizer, with the newline as its special tokens."""
    special = special_tokens(tokenizer)
    if isinstance(tokenizer, BPETokenizer):
        return PreTrainedTokenizerFast(tokenizer_object=tokenizer.model, clean_up_tokenization_spaces=False, **special)
    return AttnlabTokenizer(tokenizer.to_dict(), **special)
