import numpy as np
import pytest
import torch

from attnlab.config import DataConfig
from attnlab.data import ByteTokenizer, CharTokenizer, load_corpus
from attnlab.data.files import strip_licence
from attnlab.data.tokenizer import IdTokenizer
from attnlab.errors import UserError


def test_char_tokenizer_round_trip_and_unknown_characters():
    tok = CharTokenizer("hello world")
    assert tok.vocab_size == 8 and tok.chars == " dehlorw"
    ids = tok.encode("hold")
    assert ids.tolist() == [3, 5, 4, 1] and tok.decode(ids) == "hold"
    with pytest.raises(UserError, match=r"\['z'\] are not in this model's vocabulary"):
        tok.encode("zoo")
    with pytest.raises(UserError, match=r"\['\\udce9'\] are not in"):  # a command-line byte that was not UTF-8
        tok.encode("h\udce9")


def test_id_tokenizer_refuses_text_and_ids_outside_the_vocabulary():
    tok = IdTokenizer(20)
    assert tok.encode(" 3 1\t19 ").tolist() == [3, 1, 19]
    for text in ("hello", "3 20", "-1", "٣"):
        with pytest.raises(UserError, match="this model reads token ids, not text: give integers from 0 to 19"):
            tok.encode(text)


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    text = "naïve — ok"
    assert tok.decode(tok.encode(text)) == text and tok.encode(text).max() < 256
    assert tok.encode("caf\udce9").tolist() == list(b"caf\xe9")  # command-line bytes that were not UTF-8


def test_strip_licence_keeps_the_body():
    text = "Header\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\nBody line.\n*** END OF THE PROJECT X ***\nFooter"
    assert strip_licence(text) == "Body line.\n"
    assert strip_licence("Plain text.\n") == "Plain text.\n"


def test_text_file_split_is_deterministic_and_complete(text_file, tmp_path):
    cfg = DataConfig(source="text", path=str(text_file), cache_dir=str(tmp_path / "a"))
    a = load_corpus(cfg)
    b = load_corpus(DataConfig(source="text", path=str(text_file), cache_dir=str(tmp_path / "b")))
    text = text_file.read_text()
    assert np.array_equal(a.tokens, b.tokens)
    assert a.tokenizer.decode(a.tokens) == text
    n_train = round(len(text) * 0.9)
    assert len(a.split("train")) == n_train and len(a.split("val")) == len(text) - n_train
    assert a.tokenizer.decode(a.split("val")) == text[n_train:]  # validation is the end of the corpus


def test_prepared_corpus_is_cached_and_memory_mapped(text_file, tmp_path):
    cfg = DataConfig(source="text", path=str(text_file), cache_dir=str(tmp_path))
    first = load_corpus(cfg)
    assert isinstance(first.tokens, np.memmap) and first.tokens.dtype == np.uint8
    assert load_corpus(cfg).folder == first.folder
    assert load_corpus(DataConfig(**{**cfg.__dict__, "max_chars": 100})).folder != first.folder


def test_max_chars_caps_the_corpus(text_file, tmp_path):
    corpus = load_corpus(DataConfig(source="text", path=str(text_file), max_chars=1000, cache_dir=str(tmp_path)))
    assert len(corpus.tokens) == 1000


def test_folder_of_files_and_bad_encoding(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("first document")
    (folder / "b.txt").write_text("second one")
    corpus = load_corpus(DataConfig(source="text", path=str(folder), cache_dir=str(tmp_path / "c")))
    assert corpus.tokenizer.decode(corpus.tokens) == "first document\n\nsecond one"
    (folder / "c.txt").write_bytes(b"caf\xe9")
    with pytest.raises(UserError, match="c.txt is not UTF-8 text"):
        load_corpus(DataConfig(source="text", path=str(folder), cache_dir=str(tmp_path / "d")))


def test_any_text_file_is_read_and_a_binary_one_refused(tmp_path):
    folder = tmp_path / "notes"
    (folder / ".git").mkdir(parents=True)
    (folder / "README.md").write_text("# notes")
    (folder / "script.py").write_text("print(1)")
    (folder / ".git" / "index").write_bytes(b"DIRC\0\0\0\2")  # hidden: never read
    corpus = load_corpus(DataConfig(source="text", path=str(folder), cache_dir=str(tmp_path / "c")))
    assert corpus.tokenizer.decode(corpus.tokens) == "# notes\n\nprint(1)"
    (folder / "photo.jpg").write_bytes(b"\xff\xd8\xff\xe0\0\x10JFIF\0")
    with pytest.raises(UserError, match="photo.jpg is a binary file, not UTF-8 text; point data.path at text"):
        load_corpus(DataConfig(source="text", path=str(folder), cache_dir=str(tmp_path / "d")))


def test_batches_are_shifted_windows(text_file, tmp_path):
    corpus = load_corpus(DataConfig(source="text", path=str(text_file), cache_dir=str(tmp_path)))
    x, y = corpus.batch("train", 4, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(UserError, match="too few for windows of train.seq_len=100000"):
        corpus.batch("val", 1, 100_000, torch.Generator())


def test_shakespeare_corpus(tmp_path):
    corpus = load_corpus(DataConfig(max_chars=200_000, cache_dir=str(tmp_path)))
    text = corpus.tokenizer.decode(corpus.tokens[:200_000])
    assert len(corpus.tokens) == 200_000 and "Gutenberg" not in text
    assert corpus.tokenizer.kind == "char" and 60 <= corpus.tokenizer.vocab_size <= 90


def test_a_folder_of_only_hidden_files_says_they_are_skipped(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / ".draft.txt").write_text("a hidden draft")
    with pytest.raises(UserError, match=r"holds only hidden files, which are skipped \(such as \.draft\.txt\); "
                                        "rename them or point data.path at visible files"):
        load_corpus(DataConfig(source="text", path=str(folder), cache_dir=str(tmp_path / "c")))
    (folder / ".draft.txt").unlink()
    with pytest.raises(UserError, match="holds no files; point it at a text file or a folder of them"):
        load_corpus(DataConfig(source="text", path=str(folder), cache_dir=str(tmp_path / "c")))


def test_a_byte_order_mark_is_not_a_character_of_the_corpus(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_bytes("\ufeffSaved by Notepad.\n".encode())
    (folder / "b.txt").write_bytes("\ufeffAnd this one.\n".encode())
    corpus = load_corpus(DataConfig(source="text", path=str(folder), cache_dir=str(tmp_path / "c")))
    assert corpus.tokenizer.decode(corpus.tokens) == "Saved by Notepad.\n\n\nAnd this one.\n"
    assert "\ufeff" not in corpus.tokenizer.chars
