"""Every module imports on its own: no import cycle hides behind the order in which modules happen to load."""

import subprocess
import sys

# In one fresh interpreter: for each attnlab module, forget every attnlab module and import that one first.
# Third-party packages stay loaded (a cycle can only run through attnlab's own modules), which keeps this
# to seconds instead of one interpreter start per module.
SCRIPT = """
import importlib, pkgutil, sys, traceback
import attnlab
names = sorted(m.name for m in pkgutil.walk_packages(attnlab.__path__, "attnlab."))
failed = []
for name in names:
    for loaded in [m for m in sys.modules if m == "attnlab" or m.startswith("attnlab.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
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
