"""Every module imports on its own: no import cycle hides behind the order in which modules happen to load."""

import subprocess
import sys

# In one fresh interpreter: for each attnlab module, forget every attnlab module and import that one first.
# Third-party packages stay loaded (a cycle can only run through attnlab's own modules), which keeps this
# to seconds instead of one interpreter start per module. A module that its package's import already loads (most
# of them: with transformers loaded, attnlab's __init__ loads attnlab.hf and with it the model and its mixers) would
# import exactly as its package did, Python importing the package first and then finding the module loaded: its
# turn would repeat its package's, so it is not taken again (those repeats were three quarters of the test's time).
SCRIPT = """
import importlib, pkgutil, sys, traceback
import attnlab
names = sorted(m.name for m in pkgutil.walk_packages(attnlab.__path__, "attnlab."))


def first(name):
    for loaded in [m for m in sys.modules if m == "attnlab" or m.startswith("attnlab.")]:
        del sys.modules[loaded]
    importlib.import_module(name)
    return {m for m in sys.modules if m == "attnlab" or m.startswith("attnlab.")}


loads = {"attnlab": first("attnlab")}  # the attnlab modules that importing each module first loaded
failed = []
for name in names:  # sorted: each package before its modules
    package = name.rpartition(".")[0]
    if name in loads[package]:
        loads[name] = loads[package]
        continue
    try:
        loads[name] = first(name)
    except Exception:
        loads[name] = set()
        failed.append(name + ": " + traceback.format_exc().strip().splitlines()[-1])
print(len(names))
print("\\n".join(failed))
"""


def test_every_module_imports_first_in_a_fresh_interpreter():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    count, *failed = out.strip().splitlines()
    assert int(count) > 50  # every module was found
    assert failed == []


# --help and argument parsing import only the standard library's argparse and attnlab's light modules: the
# commands import torch, the experiments and their plots when they run
HELP = """
import sys
import attnlab.cli
attnlab.cli.build_parser()
for argv in (["--help"], ["reproduce", "--help"], ["bench", "--help"], ["train", "--help"]):
    try:
        attnlab.cli.main(argv)
    except SystemExit:
        pass
print(" ".join(name for name in ("torch", "scipy", "matplotlib", "numpy") if name in sys.modules), file=sys.stderr)
"""


def test_help_and_parsing_import_no_heavy_package():
    done = subprocess.run([sys.executable, "-c", HELP], capture_output=True, text=True, check=True)
    assert done.stderr.strip() == ""
    assert "reproduce" in done.stdout and "--import MODULE_OR_FILE" in done.stdout


# the core (what trains, evaluates and stores a model) stands below the lab: nothing it imports, directly or through
# other attnlab modules, is the bench, the figures, the experiments or the command line
CORE = ["attnlab.train", "attnlab.model", "attnlab.evaluate", "attnlab.checkpoint", "attnlab.data", "attnlab.step_cost"]
LAB = ("attnlab.bench", "attnlab.plots", "attnlab.papers", "attnlab.cli", "attnlab.commands")


def _attnlab_imports(module: str) -> set[str]:
    """The attnlab modules that `module`'s source imports (at any depth of its code, lazily or not)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    tree = ast.parse(open(spec.origin).read())
    package = module if spec.submodule_search_locations else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            relative = "." * node.level + (node.module or "")
            base = importlib.util.resolve_name(relative, package) if node.level else node.module
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name.startswith("attnlab") and _is_module(name)}


def _is_module(name: str) -> bool:
    """Whether name is a module rather than something imported from one (attnlab.model.Decoder)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent is a module, not a package
        return False


def test_the_core_imports_nothing_of_the_lab():
    seen, todo = set(), list(CORE)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for imported in _attnlab_imports(module):
            assert not imported.startswith(LAB), f"{module} imports {imported}"
            todo.append(imported)
