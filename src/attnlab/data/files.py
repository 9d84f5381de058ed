"""Where a corpus's text lies on disk: Shakespeare's plays, shipped with attnlab, and the user's files."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

from ..errors import UserError
from ..paths import user_path

# the modern-spelling plays of the `shakespeare` package, gzip-compressed (plays/NOTICE.txt)
PLAYS_DIR = Path(__file__).parent / "plays"


def strip_licence(text: str) -> str:
    """Keep only the body of a Project Gutenberg text: what lies between its START and END markers."""
    start = text.find("*** START OF")
    if start >= 0:
        text = text[text.find("\n", start) + 1:]
    end = text.find("*** END OF")
    if end >= 0:
        text = text[:end]
    return text.strip("\n") + "\n"


# the first play of Tiny Shakespeare (Karpathy's char-rnn corpus), which its first 100K characters come from
DIALOGUE_FIRST = "coriolanus"
ORDINALS = {"FIRST", "SECOND", "THIRD", "FOURTH", "FIFTH", "SIXTH", "SEVENTH", "ALL", "BOTH"}


def dialogue(text: str) -> str:
    """A Gutenberg play as Tiny Shakespeare lays it out: only the speeches, each a line "Speaker:" then its
    verse, a blank line between speeches; no front matter, act or scene headings, or stage directions.
    Named speakers keep their capitals (MENENIUS:), roles are title-cased (First Citizen:, All:)."""
    body = strip_licence(text)
    body = body[body.find("\nACT I") + 1 :] if "\nACT I" in body else body
    body = re.sub(r"\[[^\]]*\]", "", body)  # stage directions, also across lines
    speeches, lines = [], []
    for raw in body.splitlines():
        line = raw.strip()
        if re.fullmatch(r"(ACT|SCENE) [IVXLC]+\..*", line) or line.startswith(("ACT ", "SCENE ", "Epilogue")):
            continue
        if re.fullmatch(r"[A-Z][A-Z' ]*[A-Z]\.", line):  # a speaker's name: a new speech
            if lines:
                speeches.append("\n".join(lines))
            name = line[:-1]
            lines = [(name.title() if name.split()[0] in ORDINALS else name) + ":"]
        elif line and lines:
            lines.append(line)
    if lines:
        speeches.append("\n".join(lines))
    return "\n\n".join(s for s in speeches if "\n" in s) + "\n"


def dialogue_files() -> list[Path]:
    """The plays in the order of the dialogue corpus: Coriolanus first (as in Tiny Shakespeare), then the rest."""
    return sorted(shakespeare_files(), key=lambda p: (not p.stem.startswith(DIALOGUE_FIRST), p.name))


def shakespeare_files() -> list[Path]:
    """The plays in the corpus's order: sorted by file name."""
    plays = sorted(PLAYS_DIR.glob("*.txt.gz"))
    if not plays:
        raise UserError(f"no play texts found in {PLAYS_DIR}; reinstall attnlab (pip install --force-reinstall "
                        "attnlab)")
    return plays


def read_play(path: Path) -> str:
    """One play's text (a file of shakespeare_files)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read()


def listed_files(path: str) -> list[Path]:
    """The file, or every file under the folder but hidden ones (.git, .DS_Store), whatever its name."""
    root = user_path(path)
    if root.is_file():
        return [root]
    files = sorted(p for p in root.rglob("*") if p.is_file())
    visible = [p for p in files if not _hidden(p.relative_to(root))]
    if not visible and files:
        raise UserError(f"data.path={path} holds only hidden files, which are skipped (such as "
                        f"{files[0].relative_to(root)}); rename them or point data.path at visible files")
    if not visible:
        raise UserError(f"data.path={path} holds no files; point it at a text file or a folder of them")
    return visible


def text_files(path: str) -> list[Path]:
    """The listed files of data.path, each checked to be text."""
    files = listed_files(path)
    for file in files:
        _check_text(file)
    return files


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def _check_text(path: Path) -> None:
    """Refuse a binary file at once, not after a long first pass (a NUL byte never occurs in text)."""
    with open(path, "rb") as f:
        if b"\0" in f.read(8192):
            raise UserError(f"{path} is a binary file, not UTF-8 text; point data.path at text files only")
