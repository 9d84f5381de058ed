"""Text that every machine has: Python's own source files and documentation, and a mix of them with Shakespeare's
plays. The mix is heterogeneous, for experiments on how an effect depends on the corpus."""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

from ..errors import ConfigError
from .files import read_play, shakespeare_files, strip_licence

SOURCES = ("plays", "python", "docs")
DEFAULT_MIXED_CHARS = 3_000_000  # asked for when data.max_chars is unset; cut to what the sources hold


def python_source_files() -> list[Path]:
    """The standard library's own .py files (not site-packages, not tests), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts
                  and "tests" not in p.parts)


def python_docs_text() -> str:
    """The English documentation topics shipped inside the standard library (what help() shows)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def source_text(name: str, limit: int) -> str:
    """Up to `limit` characters of one source, read in a fixed order."""
    if name == "docs":
        return python_docs_text()[:limit]
    if name == "plays":
        texts = (strip_licence(read_play(path)) for path in shakespeare_files())
    else:
        texts = (path.read_text(encoding="utf-8", errors="replace") for path in python_source_files())
    parts, size = [], 0
    for text in texts:
        parts.append(text)
        size += len(text)
        if size >= limit:
            break
    return "\n\n".join(parts)[:limit]


def heterogeneous_text(total_chars: int | None, weights: dict[str, float], chunk_chars: int, seed: int) -> str:
    """Shuffled chunks of chunk_chars characters from the sources in proportion to weights.

    total_chars None takes as much as the smallest source allows at these proportions (the documentation
    topics, about 0.5M characters, are the usual limit); a total beyond that is an error, not a silent cut.
    """
    if not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError("weights must be non-negative and not all zero")
    norm = sum(weights.values())
    want = {name: round((total_chars or DEFAULT_MIXED_CHARS) * w / norm) for name, w in weights.items() if w > 0}
    texts = {name: source_text(name, n) for name, n in want.items()}
    short = {name: len(texts[name]) * norm / weights[name] for name in want if len(texts[name]) < want[name]}
    if short:
        limit = int(min(short.values()))
        if total_chars is not None:
            name = min(short, key=short.get)
            raise ConfigError(
                f"data.max_chars={total_chars:,} asks for {want[name]:,} characters of {name}, which has only "
                f"{len(texts[name]):,} here; use data.max_chars={limit:,} or less, or lower data.mix.{name}"
            )
        return heterogeneous_text(limit, weights, chunk_chars, seed)
    chunks = []
    for name, text in texts.items():
        chunks += [text[i : i + chunk_chars] for i in range(0, want[name], chunk_chars)]
    random.Random(seed).shuffle(chunks)
    return "".join(chunks)
