"""The documentation's examples run, and its links lead somewhere.

A fenced Python or shell block in README.md, docs/, a paper's README or results/README.md that has the line
`<!-- runnable -->` just before it is run as it stands, each in a fresh temporary folder with a timeout, all at
once in separate processes (the whole module takes seconds): only quick ones are marked, never one that trains
for minutes, needs a GPU or a network. Every relative link in those files must name a file of the checkout and,
into a Markdown file, one of its headings."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- runnable -->"
TIMEOUT = 180  # seconds for them all, side by side: a guard against a hang, never a measure of speed
COMMANDS = {"python": [sys.executable], "bash": ["bash", "-e"], "sh": ["bash", "-e"], "shell": ["bash", "-e"]}


def documents() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "results" / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "src" / "attnlab" / "experiments").glob("*/README.md"))]
    return [f for f in files if f.is_file()]


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
