"""The house rules over src/attnlab, read from its source with ast (nothing of it is imported: a second at most).

- No function or method is longer than 50 lines, from its `def` line to its last (decorators not counted).
- No import circle: no two modules import each other, directly or through others, function-local imports
  included (an import under `if TYPE_CHECKING:` never runs, so it does not count).
- Every module has a docstring whose first sentence is under 20 words: the sentence the layout lists.
- The layout in docs/development.md names every module as the tree holds it (scripts/layout.py writes it).
- No module that every mechanism shares (the context-parallel scan, the mixer protocol, the backend routing) names
  a mechanism: what is a mechanism's own (its statistics' layout, its routing rule) lives in its own files.

Each rule is a function over a package folder, so it is also run on a small tree planted in a temporary folder,
where a violation must be found: a rule that could never fail would keep nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "attnlab"
MAX_LINES = 50
MAX_LAB_FILE = 500  # lines: a lab module a reader carries whole to change one rule
MAX_WORDS = 19  # a first sentence of 20 words or more is too long for the one line the layout gives it
# the modules every mechanism shares, which name none of them
SHARED = ("ops/cp.py", "mixers/base.py", "mixers/backends.py", "mixers/registry.py", "mixers/attention.py")
SHARED_OPS = {"__init__", "cp", "fla", "packing"}  # the op modules that are no mechanism's
# words of the mechanisms' names that are also plain words of the trade: a function, a backend, a baseline
GENERIC = {"attention", "linear", "nonlinear", "softmax", "sigmoid", "q", "qk", "field", "triton", "delta", "rule",
           "ridge"}


layout = load_script("layout")  # the layout's writer


def _where(path: Path, source: Path) -> str:
    return path.relative_to(source.parent).as_posix()


# --- functions ----------------------------------------------------------------------------------------------


def _functions(node: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and method below `node`, nested ones included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = prefix + child.name
            if not isinstance(child, ast.ClassDef):
                yield name, child
            yield from _functions(child, name + ".")
        else:
            yield from _functions(child, prefix)


def long_functions(source: Path, limit: int = MAX_LINES) -> list[str]:
    """'file:function is N lines' for every function longer than `limit`; a node's lineno is its `def` line."""
    found = []
    for path in layout.modules(source).values():
        for name, function in _functions(ast.parse(path.read_text(), str(path))):
            length = function.end_lineno - function.lineno + 1
            if length > limit:
                found.append(f"{_where(path, source)}:{name} is {length} lines")
    return found


# --- imports ------------------------------------------------------------------------------------------------


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(nodes):
    """Every import statement in `nodes`, at any depth, except those that only a type checker runs."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif _is_type_checking(node):
            yield from _import_nodes(node.orelse)
        else:
            yield from _import_nodes(ast.iter_child_nodes(node))


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: dict) -> list[str]:
    """The modules of `known` that one import statement names. `import a.b.c` names a.b.c alone: Python imports
    the package a.b first, but counting that would make a circle of every package that imports its own modules."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in known]
    base = node.module or ""
    if node.level:  # relative: from the module's package, one package up for each dot after the first
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    # `from pkg import name` imports the submodule pkg.name when there is one, and otherwise takes name from pkg
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
            for alias in node.names if f"{base}.{alias.name}" in known or base in known]


def import_graph(source: Path) -> dict[str, dict[str, list[str]]]:
    """module -> {module it imports: ['file:line' of each import statement that does]}."""
    known = layout.modules(source)
    graph = {}
    for module, path in known.items():
        edges = graph.setdefault(module, {})
        for node in _import_nodes([ast.parse(path.read_text(), str(path))]):
            where = f"{_where(path, source)}:{node.lineno}"
            for target in _targets(node, module, path.name == "__init__.py", known):
                if target != module and where not in edges.setdefault(target, []):
                    edges[target].append(where)
    return graph


def strongly_connected(graph: dict[str, dict]) -> list[list[str]]:
    """Tarjan's strongly connected components of the graph, each sorted; a module outside any circle is alone."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            components.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return sorted(components)


def import_circles(source: Path) -> list[str]:
    """Each circle, as its modules and the import lines that join them."""
    graph = import_graph(source)
    found = []
    for component in strongly_connected(graph):
        if len(component) > 1:
            edges = [f"    {a} -> {b}: {', '.join(lines)}" for a in component
                     for b, lines in graph[a].items() if b in component]
            found.append(f"circle of {len(component)} modules: {', '.join(component)}\n" + "\n".join(edges))
    return found


# --- docstrings ---------------------------------------------------------------------------------------------


def docstring_faults(source: Path, limit: int = MAX_WORDS) -> list[str]:
    """Every module without a docstring, and every one whose first sentence has more than `limit` words."""
    found = []
    for path in layout.modules(source).values():
        text = layout.docstring(path)
        if not text:
            found.append(f"{_where(path, source)} has no module docstring")
            continue
        words = len(layout.first_sentence(text).split())
        if words > limit:
            found.append(f"{_where(path, source)}: the docstring's first sentence is {words} words: "
                         f"{layout.first_sentence(text)!r}")
    return found


# --- mechanism names ----------------------------------------------------------------------------------------


def mechanisms(source: Path) -> set[str]:
    """The words of every registered mixer's name (`@register_mixer("...")`) and of every mechanism's op module,
    less the generic ones."""
    registered = re.findall(r'@register_mixer\("([^"]+)"\)',
                            "".join(path.read_text() for path in sorted((source / "mixers").glob("*.py"))))
    ops = [path.stem for path in (source / "ops").glob("*.py") if path.stem not in SHARED_OPS]
    return {word for name in registered + ops for word in re.split(r"[-_]", name.lower())} - GENERIC


def named_mechanisms(source: Path, shared=SHARED) -> list[str]:
    """'file:line names word' for every word of a mechanism's name (any case) in a shared module, in an identifier
    too (ccq_shard: an underscore parts words)."""
    words = "|".join(sorted(map(re.escape, mechanisms(source))))
    pattern = re.compile(rf"(?<![a-z0-9])({words})(?![a-z0-9])", re.IGNORECASE)
    found = []
    for name in shared:
        for number, line in enumerate((source / name).read_text().splitlines(), 1):
            found += [f"{source.name}/{name}:{number} names {match[0]}" for match in pattern.finditer(line)]
    return found


# --- the rules over src/attnlab -----------------------------------------------------------------------------


def test_no_function_is_longer_than_50_lines():
    found = long_functions(SOURCE)
    assert not found, "split these into functions of one job each:\n" + "\n".join(found)


def long_files(folder: Path, limit: int = MAX_LAB_FILE) -> list[str]:
    """The modules under folder longer than limit lines."""
    lengths = {path: len(path.read_text().splitlines()) for path in sorted(folder.rglob("*.py"))}
    return [f"{_where(path, folder)} is {n} lines" for path, n in lengths.items() if n > limit]


def test_no_file_in_the_lab_is_longer_than_500_lines():
    assert not long_files(SOURCE / "lab"), "\n".join(long_files(SOURCE / "lab"))


def test_a_long_file_is_found(tmp_path):
    lab = plant(tmp_path, {"a.py": "x = 1\n" * 501, "b.py": "x = 1\n" * 500})
    assert long_files(lab) == ["pkg/a.py is 501 lines"]


def test_no_import_circle():
    found = import_circles(SOURCE)
    assert not found, "\n".join(found)


def test_every_module_docstring_starts_with_a_short_sentence():
    found = docstring_faults(SOURCE)
    assert not found, "\n".join(found)


def test_no_shared_module_names_a_mechanism():
    assert {"ccq", "boltzmann", "ising", "interdomain", "gla", "gdn", "s4d", "stick"} <= mechanisms(SOURCE)
    found = named_mechanisms(SOURCE)
    assert not found, "move what is the mechanism's own into its own files:\n" + "\n".join(found)


def test_the_layout_in_development_md_is_current():
    document = layout.DOCUMENT.read_text()
    assert layout.committed(document) == layout.section(SOURCE), (
        "docs/development.md's layout is out of date: run python scripts/layout.py")


# --- each rule finds what is planted ------------------------------------------------------------------------


def plant(root: Path, files: dict[str, str]) -> Path:
    """A package `pkg` under `root` with these files (paths relative to the package, contents as given)."""
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def _function(lines: int, decorated: bool = False) -> str:
    """A function of `lines` lines from its def, under a decorator if asked."""
    return ("@staticmethod\n" if decorated else "") + "def f():\n" + "    x = 1\n" * (lines - 2) + "    return x\n"


def test_a_long_function_is_found(tmp_path):
    source = plant(tmp_path, {"__init__.py": '"""A package."""\n', "short.py": _function(50, decorated=True),
                              "long.py": "class C:\n" + "\n".join("    " + line for line in
                                                                   _function(51).splitlines())})
    assert long_functions(source) == ["pkg/long.py:C.f is 51 lines"]


def test_an_import_circle_is_found_through_a_function_local_import(tmp_path):
    source = plant(tmp_path, {
        "__init__.py": "from . import a\n",  # a package importing its module is no circle: `import pkg.b` below
        "a.py": "from pkg import b\n",
        "b.py": "import pkg.sub.c\n",
        "sub/__init__.py": "",
        "sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n"
                    "def f():\n    from ..a import f\n",
        "d.py": "import pkg.a\n"})
    found = import_circles(source)
    assert len(found) == 1
    assert found[0].splitlines() == ["circle of 3 modules: pkg.a, pkg.b, pkg.sub.c",
                                     "    pkg.a -> pkg.b: pkg/a.py:1",
                                     "    pkg.b -> pkg.sub.c: pkg/b.py:1",
                                     "    pkg.sub.c -> pkg.a: pkg/sub/c.py:5"]
    (source / "sub" / "c.py").write_text("def f():\n    from pkg import sub\n")  # the package, not a module
    assert import_circles(source) == []


def test_a_missing_or_long_docstring_is_found(tmp_path):
    long = " ".join(["word"] * 20)
    source = plant(tmp_path, {"__init__.py": '"""A package, after Arora et al. 2023, where q . k is a dot. More."""\n',
                              "bare.py": "x = 1\n", "long.py": f'"""{long}. Short enough."""\n'})
    assert layout.first_sentence("A read (Le et al. 2026), q . k, e.g. one.\n\n1. A list.") == \
        "A read (Le et al. 2026), q . k, e.g. one."
    assert layout.first_sentence("Before scoring. q moves.") == "Before scoring."
    assert docstring_faults(source) == ["pkg/bare.py has no module docstring",
                                        f"pkg/long.py: the docstring's first sentence is 20 words: '{long}.'"]


def test_the_layout_names_every_module_with_its_first_sentence(tmp_path):
    source = plant(tmp_path, {"__init__.py": '"""The package.\n\nMore."""\n', "a.py": '"""Module `a`. More."""\n',
                              "sub/__init__.py": '"""A subpackage."""\n', "sub/b.py": '"""Module b."""\n'})
    assert layout.section(source).splitlines() == ["```", "pkg/      The package.", "  a.py    Module a.",
                                                   "  sub/    A subpackage.", "    b.py  Module b.", "```"]
    document = f"# Title\n\n{layout.START}\nstale\n{layout.END}\nkept\n"
    rewritten = layout.rewrite(document, layout.section(source))
    assert layout.committed(rewritten) == layout.section(source)
    assert rewritten.startswith("# Title\n\n") and rewritten.endswith(f"{layout.END}\nkept\n")


def test_a_shared_module_that_names_a_mechanism_is_found(tmp_path):
    source = plant(tmp_path, {"mixers/widget.py": '@register_mixer("widget-net")\nclass W: ...\n',
                              "ops/gizmo_rule.py": "", "ops/cp.py": '"""A scan."""\n',
                              "mixers/base.py": "# the Widget's rule: a linear map, and gizmo_shard\n"})
    assert mechanisms(source) == {"widget", "net", "gizmo"}
    assert named_mechanisms(source, ("ops/cp.py", "mixers/base.py")) == ["pkg/mixers/base.py:1 names Widget",
                                                                           "pkg/mixers/base.py:1 names gizmo"]
