"""attnlab: four new attention mechanisms and their baselines, with a lab to train and compare them.

Importing attnlab registers its models with Hugging Face transformers' Auto classes, at once if transformers
is loaded and otherwise the moment it is: importing transformers here would add seconds to every command.
"""

import importlib.abc
import importlib.util
import sys


class _RegisterWithTransformers(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when transformers is imported, runs attnlab.hf's registration after it. A spec
    asked for without importing (availability checks call find_spec) changes nothing: the finder stays in
    place until transformers' module actually runs."""

    def __init__(self):
        self.asking = False  # set while it asks the other finders

    def find_spec(self, name, path=None, target=None):
        if name != "transformers" or self.asking:
            return None
        self.asking = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.asking = False
        if spec is not None and spec.loader is not None:
            run_module = spec.loader.exec_module

            def run_then_register(module):
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                run_module(module)
                importlib.import_module("attnlab.hf")

            spec.loader.exec_module = run_then_register
        return spec


if "transformers" in sys.modules:
    importlib.import_module("attnlab.hf")
elif importlib.util.find_spec("transformers") is not None:
    sys.meta_path.insert(0, _RegisterWithTransformers())
