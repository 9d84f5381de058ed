"""mkdocs hooks (mkdocs.yml `hooks:`): the repository files that the docs link to outside docs/ become part of the site.

A page of docs/ links to a file beside docs/ by its place in the repository (../results/README.md), so that the link
works where the repository is read; mkdocs serves docs/ alone, and such a link would lead nowhere in the site. These
hooks add every such file to the site at its repository path (results/README.md), then the files that those link to
in turn (a report, its figures), and rewrite each link of the docs' pages and of the added pages to where its target
lies in the site: a link back into docs/ leads to that page, and a link to a folder to a page listing its files. A
link to something that exists nowhere is left as written, for mkdocs to report (a warning: `mkdocs build --strict`
fails on it).

The functions below the mkdocs events use the standard library alone, so tests/test_docs.py checks with them, without
mkdocs, that every link of the docs leads to a file of the site.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = "docs"  # mkdocs.yml's docs_dir, relative to ROOT
FOLDER_PAGE = "index.md"  # the page that lists a linked folder's files, in that folder of the site
LINK = re.compile(r"(\]\()([^)\s]+)(\))")  # [text](target) and ![alt](target)
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)  # fenced blocks: code, where brackets are not links


# --- mkdocs events ----------------------------------------------------------------------------------------------


def on_files(files, config):
    """The docs' pages with the repository files they reach, each added at its repository path, not in the nav."""
    from mkdocs.structure.files import File, InclusionLevel

    for path in sorted(reached(ROOT)):
        if (ROOT / path).is_dir():
            files.append(File.generated(config, posixpath.join(path, FOLDER_PAGE), content=folder_page(ROOT, path),
                                        inclusion=InclusionLevel.NOT_IN_NAV))
        else:
            files.append(File(path, str(ROOT), config.site_dir, config.use_directory_urls,
                              inclusion=InclusionLevel.NOT_IN_NAV))
    return files


def on_page_markdown(markdown, page, config, files):
    """A page's links rewritten to where their targets lie in the site (a generated folder page has none to)."""
    if page.file.abs_src_path is None:
        return markdown
    return rewrite(markdown, Path(page.file.abs_src_path).resolve().relative_to(ROOT).as_posix(), ROOT)


# --- the site's files and links -----------------------------------------------------------------------------------


def links(markdown: str) -> list[str]:
    """The relative link targets of a page, outside its fenced blocks and inline code."""
    return [target for text in _prose(markdown) for _, target, _ in LINK.findall(text) if _relative(target)]


def reached(root: Path) -> set[str]:
    """The repository paths outside docs/ that the docs' pages reach through links, followed through the Markdown
    files among them; a folder stands for itself and its files. Paths that exist nowhere are left out."""
    queue = sorted(p.relative_to(root).as_posix() for p in (root / DOCS).rglob("*.md"))
    found: set[str] = set()
    while queue:
        page = queue.pop()
        for target in links((root / page).read_text()):
            path = _target(page, target)
            if path is None or path in found or _in_docs(path) or not (root / path).exists():
                continue
            found.add(path)
            if (root / path).is_dir():
                found |= {posixpath.join(path, f.name) for f in (root / path).iterdir() if f.is_file()}
            elif path.endswith(".md"):
                queue.append(path)
    return found


def site_path(path: str, root: Path) -> str:
    """Where the repository path lies in the site: a page of docs/ at its place in docs/, a folder as the page
    listing it, anything else at its repository path."""
    if _in_docs(path):
        return posixpath.relpath(path, DOCS)
    return posixpath.join(path, FOLDER_PAGE) if (root / path).is_dir() else path


def rewrite(markdown: str, page: str, root: Path) -> str:
    """The page (its repository path) with every relative link that leaves its folder of the site pointed at
    where its target lies in the site; links to what exists nowhere are kept as written."""
    here = posixpath.dirname(site_path(page, root)) or "."

    def relink(match: re.Match) -> str:
        target = match[2]
        path = _target(page, target) if _relative(target) else None
        if path is None or not (root / path).exists():
            return match[0]
        anchor = target.partition("#")[1] + target.partition("#")[2]
        return f"{match[1]}{posixpath.relpath(site_path(path, root), here)}{anchor}{match[3]}"

    pieces, last = [], 0
    for block in FENCE.finditer(markdown):  # code blocks kept as they are
        pieces += [_outside_code(markdown[last:block.start()], relink), block[0]]
        last = block.end()
    return "".join([*pieces, _outside_code(markdown[last:], relink)])


def folder_page(root: Path, path: str) -> str:
    """The page of a linked folder: its files, each a link."""
    names = sorted(f.name for f in (root / path).iterdir() if f.is_file())
    return f"# {path}/\n\n" + "".join(f"- [{name}]({name})\n" for name in names)


def _outside_code(text: str, relink) -> str:
    """text with its links rewritten, its inline code spans kept as they are."""
    parts = re.split(r"(`[^`\n]*`)", text)
    return "".join(part if part.startswith("`") else LINK.sub(relink, part) for part in parts)


def _prose(markdown: str) -> list[str]:
    return re.split(r"`[^`\n]*`", FENCE.sub("", markdown))


def _relative(target: str) -> bool:
    """A link to a file of the repository: no address (https:, mailto:) and not an anchor of the same page."""
    return not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith(("#", "/"))


def _target(page: str, target: str) -> str | None:
    """The repository path a page's link leads to; None where it leaves the repository."""
    path = posixpath.normpath(posixpath.join(posixpath.dirname(page), target.partition("#")[0]))
    return None if path == ".." or path.startswith("../") else path


def _in_docs(path: str) -> bool:
    return path == DOCS or path.startswith(DOCS + "/")
