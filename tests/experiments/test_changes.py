"""An arm's changes: typed by the config's dataclasses when loaded, joined in order, usable as a cache key."""

import pytest

from attnlab.config import load_config
from attnlab.errors import ConfigError
from attnlab.lab.spec import PATIENT_LM, QUICK, Arm, Changes, Experiment


def test_changes_apply_in_order_by_section_and_leave_the_rest_of_the_preset():
    changes = (Changes.mixer("coupled-qk", steps=3) | Changes.task("mqar", pairs=8, test_pairs=[8])
               | Changes.train(steps=400) | Changes.train(steps=500))  # the later one wins
    cfg = load_config("mqar", changes)
    assert (cfg.model.mixer, cfg.train.steps) == ("coupled-qk", 500)
    assert cfg.model.mixer_options["coupled-qk"]["steps"] == 3
    task = cfg.data.task_options["mqar"]
    assert (task["pairs"], task["test_pairs"], task["vocab_size"]) == (8, [8], 256)  # the preset's vocabulary stays


def test_changes_are_values_a_plan_can_cache_on():
    a, b = Changes.task("mqar", test_pairs=[1, 2]), Changes.task("mqar", test_pairs=[1, 2])
    assert a == b and hash(a) == hash(b) and a != Changes.task("mqar", test_pairs=[1, 3])
    assert list(a) == [("data.task_options.mqar.test_pairs", [1, 2])]


def test_a_field_that_does_not_exist_or_a_wrong_type_is_refused_with_its_key():
    with pytest.raises(ConfigError, match="train.stepz"):
        load_config("demo", Changes.train(stepz=3))
    with pytest.raises(ConfigError, match="train.steps"):
        load_config("demo", Changes.train(steps="many"))
    with pytest.raises(ValueError, match="'optim.lr'"):
        Changes.section("optim", lr=1e-3)
    with pytest.raises(TypeError, match="Changes.train"):
        Arm("softmax", "demo", ["train.steps=3"])


def test_the_patient_protocol_decays_over_a_fifth_of_its_cap_which_a_smoke_run_shortens_with_it():
    patient = load_config("demo", PATIENT_LM).train
    assert (patient.schedule, patient.patience, patient.steps, patient.decay_length) == ("wsd", 4, 8000, 1600)
    quick = load_config("demo", PATIENT_LM | QUICK).train  # a decay of its own length would be refused here
    assert (quick.steps, quick.decay_length) == (20, 4)


def test_a_sensitivity_run_applies_its_change_after_the_arms_own_changes():
    from attnlab.lab.spec import sensitivity

    protocol = Experiment("lm", "lm", "val_ppl", [Arm("softmax", "demo"),
                                                  Arm("gla", "demo", Changes.mixer("gla") | Changes.train(lr=1e-3))],
                          "softmax")
    changed = sensitivity("lm-fast", "faster", protocol, "gla", Changes.train(lr=5e-3))
    assert [arm.label for arm in changed.arms] == ["softmax", "gla"]
    assert load_config(changed.arms[1].preset, changed.arms[1].changes).train.lr == 5e-3  # the change wins


def test_a_swept_rate_scales_the_schedules_floor_with_it():
    from pathlib import Path

    from attnlab.lab.configs import Settings, configured

    arm = Arm("gla", "demo", Changes.mixer("gla"))
    base = load_config("demo").train
    for lr in (4e-3, 1e-5):  # above the preset's rate (the value itself), and far below it
        cfg, _ = configured(Experiment("lm", "lm", "val_ppl", [arm], "gla"), arm, 0, lr, Settings(Path("runs")))
        assert cfg.train.lr == lr and cfg.train.min_lr == pytest.approx(lr * base.min_lr / base.lr)
