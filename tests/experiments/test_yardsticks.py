"""The yardsticks suite covers every mixer, and the tracking metric measures a word problem at each tested length."""

from attnlab.config import load_config
from attnlab.experiments import get_suite, yardsticks
from attnlab.experiments.metrics import get_metric
from attnlab.experiments.state_size import accuracy_key
from attnlab.experiments.store import Record, Results, RunKey
from attnlab.mixers import list_mixers, mixer_class
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
            assert set(yardsticks.MIXERS) <= set(labels) and len(labels) == len(set(labels))
    parity = get_suite("yardsticks").experiments[0]
    negative = next(arm for arm in parity.arms if arm.label == yardsticks.NEGATIVE)
    cfg = load_config(negative.preset, negative.overrides)
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
    results.records[RunKey("parity", "gdn", seed=0)] = Record({"acc@16": 0.7, "acc@32": 0.6, "state_bytes": 8})
    assert accuracy_key(experiment, results) == "acc@16"
