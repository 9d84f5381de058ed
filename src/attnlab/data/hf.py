"""Hugging Face `datasets` as a text source: data.source=hf:<dataset>[/<config>].

hf:wikitext/wikitext-103-raw-v1 reads dataset "wikitext" with config "wikitext-103-raw-v1"; a dataset under
an organisation takes three parts, hf:<org>/<name>/<config> (or hf:<org>/<name>/ without a config).
A file builder of the library (hf:text, hf:json, hf:csv, hf:parquet, ...) reads data.path, a file or a
folder of them, and needs no network.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from ..errors import UserError
from .files import listed_files, text_files

# datasets' packaged builders: each reads the files it is given, never the Hub. Without data files they
# would read whatever lies in the working directory, so they always get data.path's.
FILE_BUILDERS = ("text", "json", "csv", "parquet", "arrow", "pandas", "xml", "conll", "webdataset", "hdf5",
                 "lance", "vortex", "tsfile", "iceberg", "eval", "harbor", "fasta", "fastq", "genbank", "pdb",
                 "mmcif", "imagefolder", "audiofolder", "videofolder", "meshfolder", "pdffolder", "niftifolder")


def parse_source(source: str) -> tuple[str, str | None]:
    parts = source.removeprefix("hf:").split("/")
    if len(parts) == 1:
        return parts[0], None
    if len(parts) == 2:
        return parts[0], parts[1] or None
    return "/".join(parts[:-1]), parts[-1] or None


def reads_files(source: str) -> bool:
    """Whether data.source names a file builder (hf:json, ...), which reads data.path."""
    return source.startswith("hf:") and parse_source(source)[0] in FILE_BUILDERS


def local_files(path: str, source: str) -> list[Path]:
    """The files a file builder reads from data.path: text files for hf:text, any files for the others."""
    return text_files(path) if parse_source(source)[0] == "text" else listed_files(path)


def wikitext_article(row: str) -> bool:
    """Whether a WikiText row opens an article: its title line, ' = Title = ' (sections have two or more '=')."""
    return re.fullmatch(r" = [^=].* = \n?", row) is not None


# datasets whose rows are pieces of documents, with the rule that tells which row opens a document (the rows of
# any other dataset are documents each): packed rows (data.pack) then hold whole documents, not their pieces
DOCUMENT_OPENERS = {"wikitext": wikitext_article}


def hf_documents(cfg) -> Iterator[list[str]]:
    """The non-empty `text` fields of the train split's rows, grouped into documents (DOCUMENT_OPENERS)."""
    opens = DOCUMENT_OPENERS.get(parse_source(cfg.source)[0], lambda row: True)
    document: list[str] = []
    for row in _texts(cfg):
        if document and opens(row):
            yield document
            document = []
        document.append(row)
    if document:
        yield document


def _texts(cfg) -> Iterator[str]:
    """The `text` field of every non-empty row of the train split."""
    try:
        import datasets
    except ImportError:
        raise UserError("data.source=hf:... needs the datasets package: pip install 'attnlab[hf]'") from None
    try:
        dataset = _train_split(datasets, cfg)
    except (FileNotFoundError, ConnectionError, ValueError) as err:
        raise UserError(f"could not load {cfg.source}: {err}. Remote datasets need a network; local files load "
                        "with data.source=hf:<builder> (hf:text, hf:json, ...) data.path=<file or folder>") from None
    except datasets.exceptions.DatasetGenerationError as err:
        raise UserError(f"could not read data.path={cfg.path} with data.source={cfg.source}: {err.__cause__ or err}; "
                        "point data.path at files of that format") from None
    if "text" not in dataset.column_names:
        raise UserError(f"{cfg.source} has no 'text' column (columns: {', '.join(dataset.column_names)})")
    for row in dataset:
        if row["text"]:
            yield row["text"]


def _train_split(datasets, cfg):
    name, config = parse_source(cfg.source)
    if not reads_files(cfg.source):
        return datasets.load_dataset(name, config, split="train")
    data_files = {"train": [str(p) for p in local_files(cfg.path, cfg.source)]}
    if name == "text":  # each file one document, as data.source=text reads them, and without a byte-order mark
        return datasets.load_dataset(name, data_files=data_files, split="train", sample_by="document",
                                     encoding="utf-8-sig")
    return datasets.load_dataset(name, config, data_files=data_files, split="train")
