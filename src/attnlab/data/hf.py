"""Hugging Face `datasets` as a text source: data.source=hf:<dataset>[/<config>].

hf:wikitext/wikitext-103-raw-v1 reads dataset "wikitext" with config "wikitext-103-raw-v1"; a dataset under
an organisation takes three parts, hf:<org>/<name>/<config> (or hf:<org>/<name>/ without a config).
hf:text with data.path reads local text files through the same library, which needs no network.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import UserError
from .files import text_files


def parse_source(source: str) -> tuple[str, str | None]:
    parts = source.removeprefix("hf:").split("/")
    if len(parts) == 1:
        return parts[0], None
    if len(parts) == 2:
        return parts[0], parts[1] or None
    return "/".join(parts[:-1]), parts[-1] or None


def hf_documents(cfg) -> Iterator[str]:
    """The `text` field of every row of the train split."""
    try:
        import datasets
    except ImportError:
        raise UserError("data.source=hf:... needs the datasets package: pip install datasets") from None
    name, config = parse_source(cfg.source)
    try:
        if name == "text":
            files = [str(p) for p in text_files(cfg.path)]
            dataset = datasets.load_dataset("text", data_files={"train": files}, split="train", sample_by="document")
        else:
            dataset = datasets.load_dataset(name, config, split="train")
    except (FileNotFoundError, ConnectionError, ValueError) as err:
        raise UserError(f"could not load {cfg.source}: {err}. Remote datasets need a network; local text files "
                        "load with data.source=hf:text data.path=<file or folder>") from None
    if "text" not in dataset.column_names:
        raise UserError(f"{cfg.source} has no 'text' column (columns: {', '.join(dataset.column_names)})")
    for row in dataset:
        if row["text"]:
            yield row["text"]
