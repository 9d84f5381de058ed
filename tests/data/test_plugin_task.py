"""A task from outside attnlab, imported as a plugin is: its settings are typed as data.task_options.<task>, as a
mixer's are as model.mixer_options.<mixer>, and `attnlab eval --task` runs its measurement with the typed
settings of its flags."""

import sys

import pytest
import yaml

from attnlab import plugins
from attnlab.cli import main
from attnlab.data import tasks

PLUGIN = '''
from dataclasses import dataclass
from typing import Literal

import torch

from attnlab.data import Task, register_task
from attnlab.data.examples import FixedExamples
from attnlab.data.tokenizer import IdTokenizer
from attnlab.errors import ConfigError


@dataclass
class RepeatConfig:
    foo: int = 1  # the token every sequence repeats
    order: Literal["same", "shifted"] = "same"

    def validate(self):
        if not 0 < self.foo < 8:
            raise ConfigError(f"data.task_options.repeat.foo={self.foo} must be a token id from 1 to 7")


@dataclass
class RepeatEval:
    samples: int = 1


class RepeatData(FixedExamples):
    vocab_size = 8

    def __init__(self, cfg, seq_len):
        self.tokenizer = IdTokenizer(self.vocab_size)
        tokens = torch.full((16, seq_len), cfg.foo)
        self.train = self.val = self.test = (tokens, tokens)

    def describe(self):
        return "one token repeated"


def measure(run, options):
    print(f"repeat foo={run.config.data.task_config().foo} samples={options.samples}")


register_task(Task("repeat", lambda cfg, seq_len: RepeatData(cfg, seq_len), RepeatConfig, vocab_size=lambda cfg: 8,
                   evaluate=measure, eval_options=RepeatEval))
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A .py file that registers the task 'repeat', and forget(), which unloads it as a new process would not
    have it."""
    path = tmp_path / "repeat_task.py"
    path.write_text(PLUGIN)
    built_in = dict(tasks.TASKS)
    monkeypatch.setattr(plugins, "_files", {})
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)

    def forget():
        tasks.TASKS.clear()
        tasks.TASKS.update(built_in)
        plugins._files.clear()
        for name in [m for m in sys.modules if m.startswith("attnlab_plugin_repeat_task")]:
            del sys.modules[name]

    yield path, forget
    forget()


def tiny(tmp_path) -> list[str]:
    return ["--quiet", "name=rep", f"out_dir={tmp_path / 'runs'}", "data.source=repeat", "model.d_model=16",
            "model.n_layers=1", "model.n_heads=2", "train.steps=2", "train.batch_size=4", "train.seq_len=8",
            "train.eval_batches=1", "train.ckpt_every=2"]


def test_a_plugin_task_trains_and_evaluates_with_its_typed_settings(plugin, tmp_path, capsys):
    path, forget = plugin
    assert main(["--import", str(path), "train", "demo", *tiny(tmp_path), "data.task_options.repeat.foo=3"]) == 0
    run = tmp_path / "runs" / "rep"
    saved = yaml.safe_load(next(run.glob("step-*/config.yaml")).read_text())
    assert saved["data"]["task_options"] == {"repeat": {"foo": 3, "order": "same"}}  # every setting, typed
    assert saved["imports"] == [str(path.resolve())]
    forget()
    capsys.readouterr()
    assert main(["eval", str(run), "--task", "repeat", "--samples", "2"]) == 0  # the run's config imports the task
    assert capsys.readouterr().out.strip() == "repeat foo=3 samples=2"
    forget()
    assert main(["eval", str(run), "--task", "repeat", "--kind", "uuid"]) == 2
    assert "--kind applies to --task niah, not to --task repeat; drop it" in capsys.readouterr().err


@pytest.mark.parametrize("setting, message", [
    ("data.task_options.repeat.fo=3", "unknown field 'data.task_options.repeat.fo'; did you mean "
                                      "'data.task_options.repeat.foo'?"),
    ("data.task_options.repeat.foo=many", "data.task_options.repeat.foo='many' must be of type int"),
    ("data.task_options.repeat.foo=9", "data.task_options.repeat.foo=9 must be a token id from 1 to 7"),
    ("data.task_options.repeat.order=shifed", "unknown data.task_options.repeat.order 'shifed'; did you mean "
                                              "'shifted'? Known: same, shifted"),
    ("data.task_options.repeta.foo=3", "data.task_options: unknown task 'repeta'; did you mean 'repeat'?"),
])
def test_a_bad_setting_of_a_plugin_task_is_one_line_naming_it(plugin, tmp_path, capsys, setting, message):
    path, _ = plugin
    assert main(["--import", str(path), "train", "demo", *tiny(tmp_path), setting]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()
