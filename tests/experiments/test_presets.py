"""The presets are functions; the configs they build, and every arm's built on them, are those the YAML presets
they replaced gave (fingerprints.json holds what those YAML files fingerprinted to): no run's identity moved."""

import json
import os
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from attnlab import plugins, presets
from attnlab.config import list_presets, load_config
from attnlab.errors import ConfigError
from attnlab.lab.configs import fingerprint
from attnlab.papers import SUITES, get_suite

EXPECTED = json.loads((Path(__file__).parent / "fingerprints.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED["presets"]))
def test_each_preset_builds_the_config_its_yaml_file_did(name):
    cfg = load_config(name)
    assert cfg.name == name and fingerprint(cfg) == EXPECTED["presets"][name]


def test_every_arm_of_every_suite_keeps_its_fingerprint():
    arms = {f"{name}/{tier}/{experiment.name}/{arm.label}": arm for name, paper in SUITES.items()
            for tier in paper.tiers for experiment in get_suite(name, tier).experiments for arm in experiment.arms}
    assert sorted(arms) == sorted(EXPECTED["arms"])
    moved = [key for key, arm in arms.items()
             if fingerprint(load_config(arm.preset, arm.changes)) != EXPECTED["arms"][key]]
    assert moved == []


def test_every_preset_is_registered_and_a_yaml_file_loads_by_path(tmp_path):
    assert list_presets() == sorted(EXPECTED["presets"])
    own = tmp_path / "mine.yaml"
    own.write_text("name: mine\nmodel: {mixer: gla, d_model: 64}\ntrain: {steps: 10}\n")
    cfg = load_config(str(own), ["train.steps=20"])
    assert (cfg.name, cfg.model.mixer, cfg.model.d_model, cfg.train.steps) == ("mine", "gla", 64, 20)
    with pytest.raises(ConfigError, match="unknown config preset or file 'dem'; did you mean 'demo'"):
        load_config("dem")


def test_a_papers_preset_loads_by_name_from_plain_python():
    """attnlab's papers are an installed entry point (attnlab.papers): load_config finds their presets with no
    import of attnlab.papers first."""
    script = ("import sys; from attnlab.config import load_config; assert 'attnlab.papers' not in sys.modules; "
              "print(load_config('coupled-qk-char').model.mixer)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "coupled-qk"


def test_an_installed_paper_packages_presets_load_by_name(tmp_path, monkeypatch):
    (tmp_path / "outside_paper.py").write_text(
        "from attnlab.presets import register_preset\n"
        "from attnlab.config import RunConfig, ModelConfig\n"
        "register_preset('outside-tiny')(lambda: RunConfig(name='outside-tiny', model=ModelConfig(d_model=32)))\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # where the package would be installed
    point = EntryPoint(name="outside", value="outside_paper", group=plugins.PAPER_ENTRY_POINTS)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [point] if group == plugins.PAPER_ENTRY_POINTS else [])
    monkeypatch.setattr(plugins, "_papers_loaded", False)
    monkeypatch.setattr(presets, "PRESETS", dict(presets.PRESETS))  # the registration is undone after the test
    assert load_config("outside-tiny").model.d_model == 32
