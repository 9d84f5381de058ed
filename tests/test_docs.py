"""The documentation's examples run, and its links lead somewhere.

A fenced Python or shell block in README.md, docs/, a paper's README or results/README.md that has the line
`<!-- runnable -->` just before it is run as it stands, each in a fresh temporary folder with a timeout, all at
once in separate processes (the whole module takes seconds): only quick ones are marked, never one that trains
for minutes, needs a GPU or a network. Every relative link in those files must name a file of the checkout and,
into a Markdown file, one of its headings; and every link of the site that mkdocs builds (the pages of docs/ and
the repository files that scripts/mkdocs_hooks.py adds to it, as it rewrites their links) must lead to a page or
file of the site."""

from __future__ import annotations

import os
import posixpath
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- runnable -->"
TIMEOUT = 180  # seconds for them all, side by side: a guard against a hang, never a measure of speed
COMMANDS = {"python": [sys.executable], "bash": ["bash", "-e"], "sh": ["bash", "-e"], "shell": ["bash", "-e"]}


def documents() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "results" / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "src" / "attnlab" / "papers").glob("*/README.md"))]
    return [f for f in files if f.is_file()]


def test_the_documents_hold_every_papers_notes():
    """A paper's notes beside its suite are read and checked here: a path that moved would leave them unchecked."""
    papers = [p for p in (ROOT / "src" / "attnlab" / "papers").iterdir() if (p / "__init__.py").is_file()]
    notes = {p.parent.name for p in documents() if p.name == "README.md" and p.parent.parent.name == "papers"}
    assert notes == {p.name for p in papers if (p / "README.md").is_file()} and len(notes) >= 4, notes


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # of the opening fence, from 1
    language: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.line}"


def snippets(path: Path) -> list[Snippet]:
    """The marked blocks of one file: the fence right after the mark, up to its closing fence."""
    lines = path.read_text().splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        fence = lines[i + 1] if i + 1 < len(lines) else ""
        if not fence.startswith("```"):
            raise ValueError(f"{path}:{i + 1}: {MARK} is not followed by a fenced block")
        language = fence[3:].strip()
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        found.append(Snippet(path, i + 2, language, "\n".join(lines[i + 2:end]) + "\n"))
    return found


class _Run:
    """One snippet running in its folder, in a fresh interpreter (Python) or bash (shell), with this interpreter's
    attnlab first on PATH and one thread each, since they run side by side. A fresh process, never a fork of this
    one: a child forked after torch's OpenMP pool has run hangs at its first parallel op. Output goes to a file, so
    a talkative snippet never blocks on a pipe."""

    def __init__(self, snippet: Snippet, folder: Path):
        if snippet.language not in COMMANDS:
            raise ValueError(f"{snippet.name}: a runnable block must be one of {sorted(COMMANDS)}, not "
                             f"{snippet.language!r}")
        self.log = folder / "output.txt"
        script = folder / ("snippet.py" if snippet.language == "python" else "snippet.sh")
        script.write_text(snippet.code)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        with open(self.log, "w") as log:
            self.process = subprocess.Popen([*COMMANDS[snippet.language], script.name], cwd=folder, env=env,
                                            stdout=log, stderr=subprocess.STDOUT)

    def finish(self, deadline: float) -> tuple[int | None, str]:
        """(exit code, output); None for a snippet still running at the deadline, which is killed."""
        try:
            code = self.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            code = None
        return code, self.log.read_text()


def run_all(marked: list[Snippet], timeout: float = TIMEOUT) -> dict[str, tuple[int | None, str]]:
    """Every snippet in its own fresh temporary folder, all at once; name -> (exit code, output)."""
    with tempfile.TemporaryDirectory() as tmp:
        folders = [Path(tmp) / str(i) for i in range(len(marked))]
        for folder in folders:
            folder.mkdir()
        runs = [_Run(s, folder) for s, folder in zip(marked, folders, strict=True)]
        deadline = time.monotonic() + timeout
        return {s.name: run.finish(deadline) for s, run in zip(marked, runs, strict=True)}


MARKED = [s for path in documents() for s in snippets(path)]


@pytest.fixture(scope="module")
def outcomes():
    return run_all(MARKED)


def test_the_readme_and_the_docs_have_runnable_examples():
    names = {s.path.name for s in MARKED}
    assert "README.md" in names and "mixers.md" in names, names
    assert all(s.language in COMMANDS for s in MARKED), [(s.name, s.language) for s in MARKED]


@pytest.mark.parametrize("snippet", MARKED, ids=[s.name for s in MARKED])
def test_a_runnable_snippet_runs(snippet, outcomes):
    code, output = outcomes[snippet.name]
    assert code is not None, f"{snippet.name} did not finish in {TIMEOUT} s:\n{output}"
    assert code == 0, f"{snippet.name} failed with exit code {code}:\n{snippet.code}\n--- output ---\n{output}"


def test_a_broken_snippet_fails(tmp_path):
    """The runner itself can fail: an error, a failing shell command and a hang are each caught."""
    page = tmp_path / "page.md"
    page.write_text(f"{MARK}\n```python\nraise SystemExit('broken')\n```\n\n{MARK}\n```bash\nfalse\necho never\n```\n\n"
                    f"{MARK}\n```python\nimport time\ntime.sleep(60)\n```\n\n```python\nnot marked: never run\n```\n")
    found = [Snippet(ROOT / "page.md", s.line, s.language, s.code) for s in snippets(page)]
    assert [s.language for s in found] == ["python", "bash", "python"]
    results = run_all(found, timeout=2)
    assert [code for code, _ in results.values()] == [1, 1, None]
    assert "broken" in results[found[0].name][1] and "never" not in results[found[1].name][1]


def slug(heading: str) -> str:
    """A heading's anchor as GitHub and mkdocs' toc make it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def prose(text: str) -> str:
    """text without its fenced blocks and inline code, where brackets are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in prose(path.read_text()).splitlines() if re.match(r"#{1,6} ", line)}


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("path", documents(), ids=[p.relative_to(ROOT).as_posix() for p in documents()])
def test_every_relative_link_leads_to_a_file_and_heading(path):
    broken = []
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        destination = (path.parent / file).resolve() if file else path
        if not destination.exists():
            broken.append(f"{target}: no {destination.relative_to(ROOT) if ROOT in destination.parents else file}")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: {destination.name} has no heading #{anchor}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


hooks = load_script("mkdocs_hooks")  # adds the repository files the docs link to to the site


def test_mkdocs_fails_on_a_broken_link_and_adds_the_repository_files_the_docs_link_to():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["docs_dir"] == hooks.DOCS and config["strict"] is True
    assert set(config["validation"].values()) == {"warn"}, config["validation"]  # a warning fails --strict
    assert config["hooks"] == ["scripts/mkdocs_hooks.py"]


def test_every_link_of_the_site_leads_to_a_page_or_file_of_the_site():
    """The site as mkdocs builds it: the docs' pages and the repository files the hooks add. Each page's links,
    as the hooks rewrite them, are resolved from the page's place in the site as mkdocs resolves them."""
    reached = hooks.reached(ROOT)
    assert {"results/README.md", "examples/ema_mixer.py", "src/attnlab/papers/ccq/README.md"} <= reached
    pages = [p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")]
    pages += sorted(p for p in reached if p.endswith(".md"))
    site = {hooks.site_path(p, ROOT): p for p in [*pages, *reached]}
    broken = []
    for page in pages:
        here = posixpath.dirname(hooks.site_path(page, ROOT))
        for target in hooks.links(hooks.rewrite((ROOT / page).read_text(), page, ROOT)):
            file, _, anchor = target.partition("#")
            found = site.get(posixpath.normpath(posixpath.join(here, file)))
            if found is None:
                broken.append(f"{page}: {target} is no file of the site")
            elif anchor and found.endswith(".md") and anchor not in anchors(ROOT / found):
                broken.append(f"{page}: {target}: {found} has no heading #{anchor}")
    assert not broken, "; ".join(broken)


def test_a_link_out_of_docs_is_followed_into_the_site_and_a_broken_one_is_left_to_fail(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("# A\n\n[back](../docs/index.md#top) and [figure](f.png)\n")
    (tmp_path / "notes" / "f.png").write_bytes(b"")
    page = "[notes](../notes/a.md#a), [the folder](../notes/), [gone](../nowhere.md) and `[code](../x.md)`\n"
    (tmp_path / "docs" / "index.md").write_text("# Top\n\n" + page)
    assert hooks.reached(tmp_path) == {"notes/a.md", "notes/f.png", "notes"}
    assert hooks.rewrite(page, "docs/index.md", tmp_path) == ("[notes](notes/a.md#a), [the folder](notes/index.md), "
                                                              "[gone](../nowhere.md) and `[code](../x.md)`\n")
    assert hooks.rewrite((tmp_path / "notes" / "a.md").read_text(), "notes/a.md", tmp_path) == \
        "# A\n\n[back](../index.md#top) and [figure](f.png)\n"
    assert hooks.folder_page(tmp_path, "notes") == "# notes/\n\n- [a.md](a.md)\n- [f.png](f.png)\n"
