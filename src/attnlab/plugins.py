"""Mixers from outside attnlab: modules or .py files that register mixers (``@register_mixer``) when imported.

Every command imports them from four places: installed packages' entry points in the group ``attnlab.mixers``,
``attnlab --import MODULE_OR_FILE`` (repeatable), the environment variable ATTNLAB_IMPORT
(``module,other.module,path/to/file.py``) and a config's ``imports`` list. A run saves the plugins its mixers
come from in its config's ``imports``, so that eval, generate and the rest import them again when they load it.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import os
import sys
from importlib.metadata import entry_points
from pathlib import Path

from .errors import UserError, unknown_name
from .paths import user_path

ENV_VAR = "ATTNLAB_IMPORT"
ENTRY_POINTS = "attnlab.mixers"
PAPER_ENTRY_POINTS = "attnlab.papers"  # packages of paper suites: attnlab's own, and any other installed one
HINT = f"pass --import <module or file.py> (before the command) or set {ENV_VAR}"

_files: dict[Path, str] = {}  # a .py file imported by its path -> the name of its module
IMPORTED: list[str] = []  # what import_plugin imported, as another process imports it again (a suite's workers)
_entry_points_loaded = False
_papers_loaded = False


def import_plugin(spec: str, where: str) -> None:
    """Import a module by name, or a .py file by path, once; `where` says in errors who asked for it."""
    if _is_file(spec):
        _import_file(Path(absolute(spec)), where)
    else:
        _import(spec, where, lambda: importlib.import_module(spec))
    if absolute(spec) not in IMPORTED:
        IMPORTED.append(absolute(spec))


def import_installed() -> None:
    """The plugins named outside any config: the installed entry points (loaded once) and ATTNLAB_IMPORT's."""
    global _entry_points_loaded
    if not _entry_points_loaded:
        _entry_points_loaded = True
        for point in entry_points(group=ENTRY_POINTS):
            _import(point.value, f"the entry point '{point.name}' of {ENTRY_POINTS}", point.load)
    for spec in os.environ.get(ENV_VAR, "").split(","):
        if spec.strip():
            import_plugin(spec.strip(), f"{ENV_VAR} entry")


def import_papers() -> None:
    """The installed paper packages (entry points in the group attnlab.papers), loaded once: each registers its
    Paper manifest, so that its presets load by name without an import of the package first."""
    global _papers_loaded
    if not _papers_loaded:
        _papers_loaded = True
        for point in entry_points(group=PAPER_ENTRY_POINTS):
            _import(point.value, f"the entry point '{point.name}' of {PAPER_ENTRY_POINTS}", point.load)


def absolute(spec: str) -> str:
    """A .py file's spec as its absolute path (which imports it from any folder); a module's as it is."""
    return str(user_path(spec).resolve()) if _is_file(spec) else spec


def source_of(mixer_class) -> str | None:
    """What imports a mixer's module again in another process, for a run to record (module_source)."""
    return module_source(mixer_class.__module__)


def module_source(name: str) -> str | None:
    """What imports module `name` again in another process, for a run or a suite's results to record: None for
    attnlab's own and for a script's (__main__, which importing would run again); a single file's absolute path
    (it may have been found through a search path that the other process lacks); else the module's name."""
    if name == "__main__" or name.split(".")[0] == "attnlab":
        return None
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    if "." not in name and file and not hasattr(module, "__path__"):
        return str(Path(file).resolve())
    return name


def unknown_mixer(name: str, known) -> str:
    """The message for a mixer name that nothing registered: the likely typo, or how to import its plugin."""
    if difflib.get_close_matches(name, list(known), n=1):
        return unknown_name("mixer", name, known)
    return (f"unknown mixer '{name}': it is not built in and no imported module registered it; {HINT} to the "
            f"module that registers it (known: {', '.join(sorted(known))})")


def _is_file(spec: str) -> bool:
    return spec.endswith(".py") or user_path(spec).is_file()


def _import_file(path: Path, where: str) -> None:
    if not path.is_file():
        raise UserError(f"{where} {path}: no such file; give the path of a .py file that registers mixers, or a "
                        "module name")
    same = getattr(sys.modules.get(path.stem), "__file__", None)  # the file imported by its plain name, if it was
    if path in _files or (same and Path(same).resolve() == path):
        return
    # a name of its own, so that a file called random.py cannot stand in for the standard library's module
    name = f"attnlab_plugin_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        _import(str(path), where, lambda: spec.loader.exec_module(module))
    except UserError:
        del sys.modules[name]
        raise
    _files[path] = name


def _import(spec: str, where: str, load) -> None:
    """load(), with whatever it raises as one line naming the plugin (--debug shows the traceback)."""
    try:
        load()
    except UserError:
        raise
    except ModuleNotFoundError as err:
        if err.name and (spec == err.name or spec.startswith(err.name + ".")):
            raise UserError(f"{where} {spec}: no module of that name here; give an importable module or a .py "
                            "file's path") from None
        raise UserError(f"{where} {spec}: importing it raised ModuleNotFoundError: {err}; install what it "
                        "needs") from err
    except Exception as err:
        raise UserError(f"{where} {spec}: importing it raised {type(err).__name__}: {err}; fix the module or "
                        "leave it out") from err
