from collections import Counter

import numpy as np
import pytest
import torch

from attnlab.config import DataConfig
from attnlab.data import load_corpus
from attnlab.data.corpus import DOC_SEPARATOR, pack_rows
from attnlab.errors import ConfigError, UserError

SEQ_LEN = 16
# file name -> length; each file is one letter followed by digits, so a sequence names its document
LENGTHS = {"a.txt": 30, "b.txt": 5, "c.txt": 12, "d.txt": 50, "e.txt": 8}


def _file_text(index: int, length: int) -> str:
    return chr(ord("A") + index) + "".join(str(i % 10) for i in range(length - 1))


@pytest.fixture
def texts():
    return [_file_text(i, n) for i, n in enumerate(LENGTHS.values())]


@pytest.fixture
def corpus(tmp_path, texts):
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, text in zip(LENGTHS, texts, strict=True):
        (folder / name).write_text(text)
    # byte tokens: one per character; tokens 0..78 are training (d straddles the cut), 79..112 validation
    cfg = DataConfig(source="text", path=str(folder), tokenizer="byte", val_fraction=0.3, cache_dir=str(tmp_path / "c"))
    return load_corpus(cfg)


def _documents(corpus, split):
    """The split's documents as token lists, from the plain split and its known document lengths."""
    data = corpus.split(split).tolist()
    bounds = corpus.document_bounds(split)
    return [data[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _sequences(x, cu):
    """The flattened batch cut at cu_seqlens: (start, tokens) of every sequence."""
    flat = x.flatten().tolist()
    return [(a, flat[a:b]) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)]


def _check_layout(x, y, cu, batch_size):
    """cu_seqlens valid, every target within its sequence, padding unscored; the non-padding sequences."""
    assert x.dtype == y.dtype == cu.dtype == torch.int64 and x.shape == y.shape == (batch_size, SEQ_LEN)
    assert cu.dim() == 1 and cu[0] == 0 and cu[-1] == batch_size * SEQ_LEN and bool((cu.diff() > 0).all())
    assert set(range(0, batch_size * SEQ_LEN, SEQ_LEN)) <= set(cu.tolist())  # no sequence spans two rows
    flat_y = y.flatten().tolist()
    sequences = []
    for start, tokens in _sequences(x, cu):
        targets = flat_y[start : start + len(tokens)]
        if not any(tokens):  # padding (byte 0 never occurs in text) runs to the end of its row
            assert all(t == -100 for t in targets) and (start + len(tokens)) % SEQ_LEN == 0
            continue
        assert targets == tokens[1:] + [-100]  # the last token predicts nothing: no target crosses a boundary
        sequences.append(tokens)
    return sequences


def _owner(sequence, documents):
    """The index of the one document the sequence is whole or a row-sized piece (or the tail) of."""
    for i, doc in enumerate(documents):
        if sequence == doc:
            return i
        inside = any(doc[j : j + len(sequence)] == sequence for j in range(len(doc)))
        if len(doc) > SEQ_LEN and inside and (len(sequence) == SEQ_LEN or doc[-len(sequence):] == sequence):
            return i
    raise AssertionError(f"{bytes(sequence)!r} is neither a document nor a piece of one")


def test_doc_starts_match_the_documents(corpus, texts):
    starts = np.cumsum([0, *(len(t) + len(DOC_SEPARATOR) for t in texts[:-1])])
    starts[1:] -= len(DOC_SEPARATOR)  # the second document onwards opens with its separator
    assert corpus.doc_starts.dtype == np.int64 and corpus.doc_starts.tolist() == starts.tolist()
    decoded = [corpus.tokenizer.decode(np.array(d)) for d in _documents(corpus, "train") + _documents(corpus, "val")]
    n_train_of_d = corpus.n_train - starts[3]
    assert decoded[:3] == [texts[0], DOC_SEPARATOR + texts[1], DOC_SEPARATOR + texts[2]]
    assert decoded[3] + decoded[4] == DOC_SEPARATOR + texts[3] and len(decoded[3]) == n_train_of_d  # cut at n_train
    assert decoded[5:] == [DOC_SEPARATOR + texts[4]]


def test_doc_starts_stop_at_max_chars(tmp_path, corpus, texts):
    cfg = DataConfig(source="text", path=str(tmp_path / "docs"), tokenizer="byte", max_chars=40,
                     cache_dir=str(tmp_path / "short"))
    short = load_corpus(cfg)
    assert short.doc_starts.tolist() == [0, 30, 37]  # c's separator and first character are the last 3 tokens
    assert short.tokenizer.decode(short.tokens) == DOC_SEPARATOR.join(texts)[:40]


@pytest.mark.parametrize("split", ["train", "val"])
def test_packed_split_scores_every_within_document_pair_once(corpus, split):
    x, y, cu = corpus.packed_split(split, SEQ_LEN)
    documents = _documents(corpus, split)
    sequences = _check_layout(x, y, cu, len(x))
    assert [_owner(s, documents) for s in sequences] == sorted(_owner(s, documents) for s in sequences)
    scored = Counter(zip(x[y != -100].tolist(), y[y != -100].tolist(), strict=True))
    within = Counter(pair for doc in documents for pair in zip(doc[:-1], doc[1:], strict=False))
    assert scored == within


def test_packed_batch_rows_hold_whole_documents_or_pieces(corpus):
    x, y, cu = corpus.packed_batch("train", 8, SEQ_LEN, torch.Generator().manual_seed(0))
    documents = _documents(corpus, "train")
    owners = [_owner(s, documents) for s in _check_layout(x, y, cu, 8)]
    first_pass = [i for j, i in enumerate(owners) if j == 0 or owners[j - 1] != i][: len(documents)]
    assert sorted(first_pass) == list(range(len(documents)))  # every document before any repeats


def test_packed_batch_is_deterministic_given_the_generator(corpus):
    def batch(seed):
        return corpus.packed_batch("train", 4, SEQ_LEN, torch.Generator().manual_seed(seed))

    for a, b in zip(batch(3), batch(3), strict=True):
        assert torch.equal(a, b)
    assert len({tuple(batch(seed)[0].flatten().tolist()) for seed in range(6)}) > 1  # the order is drawn


def test_pack_rows_cuts_long_documents_and_starts_a_row_for_what_does_not_fit():
    # pieces of a long document overlap by one token, so the piece after keeps its first target
    assert list(pack_rows([(0, 40)], 16)) == [[(0, 16)], [(15, 16)], [(30, 10)]]
    assert list(pack_rows([(0, 10), (10, 6), (16, 7), (23, 9)], 16)) == [[(0, 10), (10, 6)], [(16, 7), (23, 9)]]
    assert list(pack_rows([(0, 10), (10, 7), (17, 20)], 16)) == [[(0, 10)], [(10, 7)], [(17, 16)], [(32, 5)]]


def test_pack_is_refused_for_tasks_in_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        DataConfig(source="mqar", pack=True).validate()
    assert "\n" not in str(err.value) and str(err.value).startswith("data.pack=True applies only to text corpora")
    DataConfig(source="text", path=str(tmp_path), pack=True).validate()


def test_packing_refuses_rows_too_short_to_score(corpus):
    with pytest.raises(UserError, match="seq_len of at least 2"):
        corpus.packed_split("val", 1)


def test_cache_without_doc_starts_is_rebuilt(corpus):
    (corpus.folder / "doc_starts.npy").unlink()
    rebuilt = load_corpus(DataConfig(source="text", path=str(corpus.folder.parents[2] / "docs"), tokenizer="byte",
                                     val_fraction=0.3, cache_dir=str(corpus.folder.parents[1])))
    assert rebuilt.folder == corpus.folder and (rebuilt.folder / "doc_starts.npy").is_file()
    assert rebuilt.doc_starts.tolist() == corpus.doc_starts.tolist()
    assert np.array_equal(rebuilt.tokens, corpus.tokens)
