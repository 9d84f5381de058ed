"""Hugging Face `datasets` file builders (hf:json, hf:csv, hf:parquet, ...) read data.path and nothing else."""

import json

import pytest

from attnlab.config import DataConfig
from attnlab.data import load_corpus
from attnlab.data.hf import FILE_BUILDERS
from attnlab.errors import ConfigError, UserError

datasets = pytest.importorskip("datasets", reason="the hf extra is not installed: pip install 'attnlab[hf]'")

ROWS = ["first row of the real file", "second row"]


def write_json(path, rows):
    path.write_text(json.dumps([{"text": r} for r in rows]))


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))


def write_csv(path, rows):
    path.write_text("id,text\n" + "".join(f"{i},{r}\n" for i, r in enumerate(rows)))


def write_parquet(path, rows):
    pa = pytest.importorskip("pyarrow", reason="pyarrow (a dependency of datasets) is not installed")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": rows}), path)


FORMATS = [("json", "data.json", write_json), ("json", "data.jsonl", write_jsonl), ("csv", "data.csv", write_csv),
           ("parquet", "data.parquet", write_parquet)]


@pytest.fixture
def decoy_workdir(tmp_path, monkeypatch):
    """A working directory holding files of every format (and a checkpoint) that must never be read."""
    work = tmp_path / "work"
    work.mkdir()
    for _, name, write in FORMATS:
        write(work / f"decoy-{name}", ["DECOY"])
    (work / "train_state.pt").write_bytes(b"PK\x03\x04\0\0binary")
    monkeypatch.chdir(work)
    return work


def corpus_text(tmp_path, source, path, cache="cache"):
    corpus = load_corpus(DataConfig(source=source, path=str(path), cache_dir=str(tmp_path / cache)))
    return corpus.tokenizer.decode(corpus.tokens)


@pytest.mark.parametrize("builder, name, write", FORMATS, ids=[name for _, name, _ in FORMATS])
def test_a_file_builder_reads_data_path_and_not_the_working_directory(builder, name, write, tmp_path,
                                                                      decoy_workdir):
    (tmp_path / "data").mkdir()
    write(tmp_path / "data" / name, ROWS)
    assert corpus_text(tmp_path, f"hf:{builder}", tmp_path / "data" / name) == "\n\n".join(ROWS)


def test_a_file_builder_reads_every_visible_file_of_a_folder(tmp_path, decoy_workdir):
    folder = tmp_path / "data"
    (folder / ".cache").mkdir(parents=True)
    write_jsonl(folder / "a.jsonl", ROWS[:1])
    write_jsonl(folder / "b.jsonl", ROWS[1:])
    (folder / ".cache" / "index").write_bytes(b"\0\1")  # hidden: never read
    assert corpus_text(tmp_path, "hf:json", folder) == "\n\n".join(ROWS)


def test_an_edited_data_file_is_prepared_again(tmp_path):
    path = tmp_path / "data.jsonl"
    write_jsonl(path, ROWS)
    assert corpus_text(tmp_path, "hf:json", path) == "\n\n".join(ROWS)
    write_jsonl(path, ["an edited row, longer than the first file's rows together"])
    assert corpus_text(tmp_path, "hf:json", path) == "an edited row, longer than the first file's rows together"


def test_a_file_builder_needs_data_path():
    with pytest.raises(ConfigError, match=r"data.source=hf:json needs data.path=<a file or a folder of them>"):
        DataConfig(source="hf:json").validate()


def test_a_file_that_the_builder_cannot_parse_is_one_line(tmp_path):
    (tmp_path / "notes.jsonl").write_text("plain words, not JSON\n")
    with pytest.raises(UserError, match=r"could not read data.path=.*notes.jsonl with data.source=hf:json: .*; "
                                        "point data.path at files of that format"):
        corpus_text(tmp_path, "hf:json", tmp_path / "notes.jsonl")


def test_every_packaged_builder_of_datasets_is_a_file_builder():
    """Given no data files, a packaged builder reads the working directory: each must get data.path's."""
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    assert set(FILE_BUILDERS) == set(_PACKAGED_DATASETS_MODULES)


def test_hf_text_strips_a_byte_order_mark(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffWindows notepad text.\n".encode())
    corpus = load_corpus(DataConfig(source="hf:text", path=str(path), cache_dir=str(tmp_path / "cache")))
    assert corpus.tokenizer.decode(corpus.tokens) == "Windows notepad text.\n"
    assert "\ufeff" not in corpus.tokenizer.chars
