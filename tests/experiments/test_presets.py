"""The presets are functions; the configs they build, and every arm's built on them, are those the YAML presets
they replaced gave (fingerprints.json holds what those YAML files fingerprinted to): no run's identity moved."""

import json
from pathlib import Path

import pytest

from attnlab.config import list_presets, load_config
from attnlab.errors import ConfigError
from attnlab.experiments import SUITES, get_suite
from attnlab.experiments.plan import fingerprint

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
             if fingerprint(load_config(arm.preset, arm.overrides)) != EXPECTED["arms"][key]]
    assert moved == []


def test_every_preset_is_registered_and_a_yaml_file_loads_by_path(tmp_path):
    assert list_presets() == sorted(EXPECTED["presets"])
    own = tmp_path / "mine.yaml"
    own.write_text("name: mine\nmodel: {mixer: gla, d_model: 64}\ntrain: {steps: 10}\n")
    cfg = load_config(str(own), ["train.steps=20"])
    assert (cfg.name, cfg.model.mixer, cfg.model.d_model, cfg.train.steps) == ("mine", "gla", 64, 20)
    with pytest.raises(ConfigError, match="unknown config preset or file 'dem'; did you mean 'demo'"):
        load_config("dem")
