"""Text sources: the heterogeneous mix, Hugging Face datasets on local files, and the BPE tokenizer."""

import pytest

from attnlab.config import DataConfig
from attnlab.data import hf, load_corpus
from attnlab.data.files import dialogue, dialogue_files, shakespeare_files
from attnlab.data.hf import parse_source
from attnlab.data.texts import heterogeneous_text, python_docs_text, source_text
from attnlab.errors import ConfigError


def test_heterogeneous_corpus_holds_each_source_in_proportion():
    weights = {"plays": 2.0, "python": 1.0, "docs": 1.0}
    text = heterogeneous_text(40_000, weights, chunk_chars=500, seed=0)
    assert len(text) == 40_000
    originals = {name: source_text(name, 20_000) for name in weights}
    chunks = [text[i : i + 500] for i in range(0, len(text), 500)]
    counts = {name: sum(chunk in originals[name] for chunk in chunks) for name in weights}
    assert counts == {"plays": 40, "python": 20, "docs": 20}  # 2 : 1 : 1 of 80 chunks
    assert heterogeneous_text(40_000, weights, 500, seed=0) == text != heterogeneous_text(40_000, weights, 500, seed=1)


def test_python_documentation_is_prose():
    docs = python_docs_text()
    assert len(docs) > 100_000 and "The " in docs


def test_mixed_source_builds_a_corpus(tmp_path):
    corpus = load_corpus(DataConfig(source="mixed", max_chars=30_000, cache_dir=str(tmp_path)))
    assert len(corpus.tokens) == 30_000 and corpus.tokenizer.vocab_size > 60


def test_hf_path_loads_a_local_text_dataset_with_a_bpe_tokenizer(text_file, tmp_path):
    pytest.importorskip("datasets")
    pytest.importorskip("tokenizers")
    cfg = DataConfig(source="hf:text", path=str(text_file), tokenizer="bpe", bpe_vocab=300, cache_dir=str(tmp_path))
    corpus = load_corpus(cfg)
    text = text_file.read_text()
    assert corpus.tokenizer.kind == "bpe" and 256 < corpus.tokenizer.vocab_size <= 300
    assert corpus.tokenizer.decode(corpus.tokens) == text
    assert len(corpus.tokens) < len(text)  # merges were learned


def test_hf_source_names():
    assert parse_source("hf:wikitext/wikitext-103-raw-v1") == ("wikitext", "wikitext-103-raw-v1")
    assert parse_source("hf:roneneldan/TinyStories/") == ("roneneldan/TinyStories", None)
    assert parse_source("hf:text") == ("text", None)


def test_mixed_corpus_takes_what_the_smallest_source_allows_or_says_which_field_to_lower():
    docs = len(python_docs_text())
    weights = {"plays": 1.0, "docs": 1.0}
    assert len(heterogeneous_text(None, weights, 512, seed=0)) == 2 * docs
    with pytest.raises(ConfigError, match=r"data\.max_chars=.*docs.*lower data\.mix\.docs"):
        heterogeneous_text(2 * docs + 10, weights, 512, seed=0)


def test_dialogue_keeps_only_the_speeches_in_tiny_shakespeares_layout():
    play = ("*** START OF THE PROJECT ***\nTHE TRAGEDY OF X\n\nPERSONS REPRESENTED.\n\nMENENIUS, a friend\n\n"
            "ACT I.\n\nSCENE I. Rome. A street.\n\n[Enter citizens, with staves,\nand clubs.]\n\nFIRST CITIZEN.\n"
            "Before we proceed any further,  \nhear me speak. [Aside.]\n\nALL.\nSpeak, speak.\n\nMENENIUS.\n"
            "Why, masters.\n\n[Exeunt.]\n\nSCENE II. Corioli.\n\nMENENIUS.\nAgain.\n*** END OF THE PROJECT ***\n")
    assert dialogue(play) == ("First Citizen:\nBefore we proceed any further,\nhear me speak.\n\nAll:\nSpeak, speak."
                              "\n\nMENENIUS:\nWhy, masters.\n\nMENENIUS:\nAgain.\n")


def test_the_dialogue_corpus_starts_with_coriolanus_as_tiny_shakespeare_does():
    files = dialogue_files()
    assert files[0].stem.startswith("coriolanus") and sorted(files) == sorted(shakespeare_files())


WIKITEXT_ROWS = ["", " = Valkyria Chronicles III = \n", "", " Senjō no Valkyria 3 is a game .\n", "",
                 " = = Gameplay = = \n", "", " The game is played in turns .\n", " = Tower Building = \n",
                 " The tower is tall .\n"]


def test_wikitext_rows_are_grouped_into_articles_with_the_same_text(tmp_path, monkeypatch):
    """WikiText's rows are lines of articles: an article opens at its ' = Title = ' row (a section's heading
    has '= ='), so packed rows hold whole articles; the token stream is what one document a row gave."""
    class Rows(list):
        column_names = ["text"]

    monkeypatch.setattr(hf, "_train_split", lambda datasets, cfg: Rows({"text": r} for r in WIKITEXT_ROWS))
    cfg = DataConfig(source="hf:wikitext/wikitext-103-raw-v1", tokenizer="byte", val_fraction=0.5,
                     cache_dir=str(tmp_path))
    assert [len(d) for d in hf.hf_documents(cfg)] == [4, 2]
    corpus = load_corpus(cfg)
    text = bytes(corpus.tokens.tolist()).decode()
    assert text == "\n\n".join(r for r in WIKITEXT_ROWS if r)  # as when every row was a document
    starts = corpus.doc_starts.tolist()
    assert starts == [0, len(text[: text.index(" = Tower") - 2].encode())]  # with its separator, as every document
    plain = DataConfig(source="hf:other/config", tokenizer="byte", val_fraction=0.5, cache_dir=str(tmp_path))
    assert [len(d) for d in hf.hf_documents(plain)] == [1] * 6  # any other dataset: a document a row
