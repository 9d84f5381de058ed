"""Rewrite the layout in docs/development.md from the source tree: every package and module of src/attnlab.

Each is listed with the first sentence of its module docstring, so the guide names what exists and says what
the module itself says it is. The section between the two markers is replaced; the rest of the page is kept.
tests/test_house_rules.py fails when the committed section differs from what this script writes.

    python scripts/layout.py            # rewrite docs/development.md
    python scripts/layout.py --check    # exit 1 if it is out of date, changing nothing

Only the standard library and ast: nothing of attnlab is imported, so it runs without torch.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "attnlab"
DOCUMENT = ROOT / "docs" / "development.md"
START = "<!-- layout: start (written by scripts/layout.py) -->"
END = "<!-- layout: end -->"
WIDTH = 120  # the line length of the code, so the tree reads the same in an editor

# A sentence ends at a period (or ! or ?) that closes a word and is followed by a space or the end, unless the
# word is one of these abbreviations: "(Arora et al. 2023)" stays one sentence, and so does "q_i . k_j" (a dot).
SENTENCE_END = re.compile(r"(?<!\bal)(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)(?<!\bcf)(?<!\bFig)(?<=\S)[.!?](?=\s|$)")


def modules(source: Path) -> dict[str, Path]:
    """Every module under the package folder `source`, by dotted name (a package by its own name), sorted."""
    found = {}
    for path in source.rglob("*.py"):
        parts = path.relative_to(source.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return dict(sorted(found.items(), key=lambda item: item[0].split(".")))


def docstring(path: Path) -> str | None:
    return ast.get_docstring(ast.parse(path.read_text(), str(path)))


def first_sentence(text: str) -> str:
    """The first sentence of a docstring: within its first paragraph, up to the first period that ends one."""
    paragraph = " ".join(text.strip().split("\n\n")[0].split())
    end = SENTENCE_END.search(paragraph)
    return paragraph[:end.end()] if end else paragraph


def _entries(source: Path) -> list[tuple[int, str, str]]:
    """(depth, name as listed, first sentence) for every module, each package before what it holds."""
    entries = []
    for name, path in modules(source).items():
        parts = name.split(".")
        label = parts[-1] + ("/" if path.name == "__init__.py" else ".py")
        if len(parts) == 1 and source.is_relative_to(ROOT):
            label = f"{source.relative_to(ROOT).as_posix()}/"  # the top package, with the folder it sits in
        # backticks mark code in a docstring; inside the section's code block they would only be clutter
        sentence = first_sentence(docstring(path) or "").replace("`", "")
        entries.append((len(parts) - 1, label, sentence))
    return entries


def section(source: Path = SOURCE) -> str:
    """The layout as a code block: a tree of names, each followed by its sentence, wrapped under the sentences."""
    entries = _entries(source)
    column = max(2 * depth + len(label) for depth, label, _ in entries) + 2
    lines = ["```"]
    for depth, label, sentence in entries:
        name = " " * (2 * depth) + label
        wrapped = textwrap.wrap(sentence, WIDTH - column, break_on_hyphens=False) or [""]
        lines.append(f"{name:<{column}}{wrapped[0]}".rstrip())
        lines += [" " * column + more for more in wrapped[1:]]
    lines.append("```")
    return "\n".join(lines) + "\n"


def rewrite(document: str, layout: str) -> str:
    """The document with the text between its markers replaced by `layout`."""
    before, start, rest = document.partition(START)
    _, end, after = rest.partition(END)
    if not start or not end:
        raise ValueError(f"the document must hold the markers {START!r} and {END!r}, in that order")
    return f"{before}{START}\n{layout}{END}{after}"


def committed(document: str) -> str:
    """The layout as the document holds it now, between its markers."""
    return document.partition(START)[2].partition(END)[0].removeprefix("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the layout is out of date, changing nothing")
    args = parser.parse_args(argv)
    document = DOCUMENT.read_text()
    updated = rewrite(document, section())
    if updated == document:
        return 0
    if args.check:
        print(f"{DOCUMENT.relative_to(ROOT)}: the layout is out of date; run python scripts/layout.py",
              file=sys.stderr)
        return 1
    DOCUMENT.write_text(updated)
    print(f"rewrote the layout in {DOCUMENT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
