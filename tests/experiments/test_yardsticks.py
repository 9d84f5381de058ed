"""The yardsticks suite covers every mixer, the tracking metric measures a word problem at each tested length, and
the matched presets give every mixer one state budget."""

from dataclasses import replace

import pytest

from attnlab.config import load_config
from attnlab.errors import ConfigError
from attnlab.lab.metrics import get_metric
from attnlab.lab.state_size import accuracy_key
from attnlab.lab.store import Record, Results, RunKey
from attnlab.mixers import list_mixers, mixer_class
from attnlab.papers import get_suite, yardsticks
from attnlab.papers.yardsticks import presets
from attnlab.train import train

TINY = ["model.d_model=16", "model.n_layers=1", "train.steps=2", "train.batch_size=4", "train.eval_every=2",
        "train.eval_batches=1", "train.ckpt_every=2", "train.warmup_steps=1",
        "data.task_options.parity.train_examples=64", "data.task_options.parity.test_examples=8",
        "data.task_options.parity.test_lengths=[2,4]"]


def test_the_yardsticks_run_every_registered_mixer_and_gdn_with_negative_eigenvalues():
    built_in = [name for name in list_mixers() if mixer_class(name).__module__.startswith("attnlab.mixers.")]
    assert sorted(yardsticks.MIXERS) == built_in  # (the tests register mixers of their own beside them)
    for tier in yardsticks.TIERS:
        for experiment in get_suite("yardsticks", tier).experiments:
            labels = [arm.label for arm in experiment.arms]
            every = yardsticks.MATCHED if experiment.name == "mqar-matched" else yardsticks.MIXERS
            assert set(every) <= set(labels) and len(labels) == len(set(labels))
    parity = get_suite("yardsticks").experiments[0]
    negative = next(arm for arm in parity.arms if arm.label == yardsticks.NEGATIVE)
    cfg = load_config(negative.preset, negative.changes)
    assert cfg.model.mixer == "gdn" and cfg.model.mixer_options["gdn"]["negative_eigenvalues"] is True


def test_tracking_measures_each_length_the_model_can_read_and_the_state_in_bytes(tmp_path):
    experiment = get_suite("yardsticks").experiments[0]
    for mixer, positions, lengths in (("gla", 0, [16, 32, 64]), ("ccq-gla", 0, [16, 32, 64]),
                                      ("softmax", 40, [16, 32])):  # 64 bits lie past 40 learned positions
        cfg = load_config("state-tracking", [f"model.mixer={mixer}", f"model.positions={positions}", *TINY,
                                             f"out_dir={tmp_path}", f"name={mixer}"])
        train(cfg, log=lambda *_: None)
        record = get_metric("tracking").measure(experiment, tmp_path / mixer)
        assert [k for k in record if k.startswith("acc@")] == [f"acc@{n}" for n in lengths]
        assert all(0.0 <= record[f"acc@{n}"] <= 1.0 for n in lengths)
        ablated = [k for k in record if k.startswith("ablated_")]  # CCQ's correction removed; GLA has none
        assert ablated == ([f"ablated_acc@{n}" for n in lengths] if mixer == "ccq-gla" else [])
        assert record["state_bytes"] > 0
    softmax = get_metric("tracking").measure(experiment, tmp_path / "softmax")
    assert softmax["state_bytes"] == 2 * 16 * 16 * 4  # keys and values of 16 positions, 16 channels, fp32


def test_a_reports_state_size_reads_a_word_problems_accuracy_at_the_training_length():
    experiment = get_suite("yardsticks").experiments[0]
    results = Results({"suite": "yardsticks", "runs": {}})
    record = Record.from_json({"acc@16": 0.7, "acc@32": 0.6, "state_bytes": 8})
    results.records[RunKey("parity", "gdn", seed=0)] = record
    assert accuracy_key(experiment, results) == "acc@16"


def test_each_matched_preset_takes_the_widest_model_whose_state_fits_the_budget(monkeypatch):
    budget = presets.STATE_BUDGET
    for mixer in yardsticks.MIXERS:
        cfg = load_config(f"matched-{mixer}")
        assert cfg.model.mixer == mixer and cfg.data.source == "mqar"
        assert presets.state_bytes(cfg.model, cfg.train.seq_len) <= budget
        wider = replace(cfg.model, d_model=cfg.model.d_model + 8)
        assert cfg.model.d_model == presets.WIDTHS[-1] or presets.state_bytes(wider, cfg.train.seq_len) > budget
    assert load_config("matched-softmax").model.d_model == 64  # the budget is the mqar preset's own cache
    assert load_config("matched-boltzmann").model.mixer_options["boltzmann"]["couplings"] == "distance"
    monkeypatch.setattr(presets, "STATE_BUDGET", 100)
    with pytest.raises(ConfigError, match="no d_model from 16 to 256 gives gla a state of at most 100 bytes"):
        load_config("matched-gla")
