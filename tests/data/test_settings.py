"""A data setting that the chosen source never reads is refused with one line naming it, not silently ignored."""

import pytest

from attnlab.config import DataConfig, load_config
from attnlab.errors import ConfigError

FILES = r"applies only to data.source=text and the file builders of Hugging Face datasets \(hf:text, hf:json"
CORPORA = r"applies only to text corpora \(data.source=shakespeare, shakespeare-dialogue, text, mixed or hf:...\)"

UNREAD = [
    (dict(source="mqar", path="x.txt"), rf"data.path=x.txt {FILES}.*, not to data.source=mqar; remove it"),
    (dict(source="shakespeare", path="x.txt"), rf"data.path=x.txt {FILES}.*, not to data.source=shakespeare"),
    (dict(source="mixed", path="x.txt"), rf"data.path=x.txt {FILES}.*, not to data.source=mixed"),
    (dict(source="hf:wikitext/wikitext-2-raw-v1", path="x.txt"), rf"data.path=x.txt {FILES}"),
    (dict(source="mqar", tokenizer="bpe"), rf"data.tokenizer=bpe {CORPORA}, not to data.source=mqar; remove it"),
    (dict(source="brackets", tokenizer="byte"), rf"data.tokenizer=byte {CORPORA}, not to data.source=brackets"),
    (dict(source="niah", tokenizer="byte"), rf"data.tokenizer=byte {CORPORA}, not to data.source=niah"),
    (dict(source="shakespeare", bpe_vocab=8000), r"data.bpe_vocab=8000 applies only to data.tokenizer=bpe on a text "
                                                 r"corpus, not to data.source=shakespeare with data.tokenizer=char"),
    (dict(source="mqar", max_chars=1000), rf"data.max_chars=1000 {CORPORA}, not to data.source=mqar"),
    (dict(source="brackets", val_fraction=0.2), rf"data.val_fraction=0.2 {CORPORA}, not to data.source=brackets"),
    (dict(source="shakespeare", seed=1), r"data.seed=1 applies only to data.source=mixed, not to data.source=shak"),
    (dict(source="text", path=".", chunk_chars=64), r"data.chunk_chars=64 applies only to data.source=mixed"),
    (dict(source="shakespeare", mix={"plays": 1.0}), r"data.mix=\{'plays': 1.0\} applies only to data.source=mixed"),
    (dict(source="shakespeare", task_options={"mqar": {"pairs": 2}}),
     r"data.task_options.mqar.\* applies only to data.source=mqar, not to data.source=shakespeare; remove it"),
    (dict(source="mqar", task_options={"brackets": {"balanced": True}}),
     r"data.task_options.brackets.\* applies only to data.source=brackets"),
    (dict(source="brackets", task_options={"niah": {"kind": "uuid"}}),
     r"data.task_options.niah.\* applies only to data.source=niah"),
]


@pytest.mark.parametrize("fields, message", UNREAD, ids=[f"{f['source']}-{list(f)[-1]}" for f, _ in UNREAD])
def test_a_setting_the_source_does_not_read_is_refused(fields, message):
    with pytest.raises(ConfigError, match=message):
        DataConfig(**fields).validate()


READ = [dict(source="text", path=".", tokenizer="bpe", bpe_vocab=300, max_chars=10, val_fraction=0.2),
        dict(source="hf:json", path=".", tokenizer="byte"),
        dict(source="hf:wikitext/wikitext-2-raw-v1", tokenizer="bpe", bpe_vocab=8000, max_chars=10),
        dict(source="mixed", mix={"plays": 1.0}, chunk_chars=64, seed=3, tokenizer="byte"),
        dict(source="shakespeare-dialogue", max_chars=100_000),
        dict(source="mqar", task_options={"mqar": {"pairs": 2}}, cache_dir="somewhere"),
        dict(source="brackets", task_options={"brackets": {"balanced": True}}),
        dict(source="niah", task_options={"niah": {"kind": "uuid"}}, path=None, tokenizer="char"),
        dict(source="shakespeare", task_options={"mqar": {"pairs": 4}, "niah": {}})]  # other tasks' defaults


@pytest.mark.parametrize("fields", READ, ids=[f["source"] for f in READ])
def test_settings_the_source_reads_are_accepted(fields):
    DataConfig(**fields).validate()


def test_an_override_of_a_preset_is_refused_when_its_source_does_not_read_it():
    with pytest.raises(ConfigError, match=rf"data.path=notes.txt {FILES}.*, not to data.source=mqar; remove it"):
        load_config("mqar", ["data.path=notes.txt"])
