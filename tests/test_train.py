import json
import math

import pytest
import torch
from safetensors.torch import load_file

from attnlab import checkpoint
from attnlab.config import ModelConfig, TrainConfig, load_config
from attnlab.devices import pick_device
from attnlab.errors import ConfigError, UserError
from attnlab.mixers import build_mixer, list_mixers
from attnlab.model import Decoder
from attnlab.nn import set_optim
from attnlab.starting_point import resume_point
from attnlab.train import lr_multiplier, param_groups, train
from helpers import Crash, crash_after_checkpoint


def tiny_config(text_file, tmp_path, name="run", extra=(), **train):
    settings = dict(steps=12, batch_size=4, seq_len=32, warmup_steps=2, eval_every=6, eval_batches=2,
                    log_every=1, ckpt_every=6, keep_last=0) | train
    overrides = [f"name={name}", f"out_dir={tmp_path / 'runs'}", "data.source=text", f"data.path={text_file}",
                 f"data.cache_dir={tmp_path / 'cache'}", "model.d_model=32", "model.n_layers=2",
                 "model.n_heads=4", "model.mixer=softmax"]
    overrides += [f"train.{k}={v}" for k, v in settings.items()] + list(extra)
    return load_config("demo", overrides)


def losses(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("loss"), r.get("val_loss")) for r in records]


def test_resume_reproduces_an_uninterrupted_run(text_file, tmp_path, monkeypatch):
    straight = train(tiny_config(text_file, tmp_path, "straight"), progress=False, log=lambda *_: None)

    recover = crash_after_checkpoint(monkeypatch, 6)  # the process dies right after its first checkpoint
    with pytest.raises(Crash):
        train(tiny_config(text_file, tmp_path, "stopped"), progress=False, log=lambda *_: None)
    recover()
    spent = checkpoint.load_state(tmp_path / "runs" / "stopped" / "step-00000006" / "train_state.pt")["train_seconds"]
    messages = []
    resumed = train(tiny_config(text_file, tmp_path, "stopped"), resume="auto", progress=False,
                    log=messages.append)

    assert any("resuming" in m and "step-00000006" in m for m in messages)
    runs = tmp_path / "runs"
    assert losses(runs / "stopped") == losses(runs / "straight")
    assert len(losses(runs / "straight")) == 12 + 2  # every step logged once, two evaluations
    a = load_file(runs / "straight" / "step-00000012" / "model.safetensors")
    b = load_file(runs / "stopped" / "step-00000012" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["val_loss"] == straight["val_loss"]
    assert straight["earlier_seconds"] == 0 and resumed["earlier_seconds"] == spent > 0  # the time steps 1-6 took
    assert resumed["train_seconds"] > spent


def test_training_lowers_the_loss(text_file, tmp_path):
    summary = train(tiny_config(text_file, tmp_path, steps=30, lr=3e-3, eval_every=30, ckpt_every=30),
                    progress=False, log=lambda *_: None)
    history = [loss for _, loss, _ in losses(tmp_path / "runs" / "run") if loss is not None]
    assert history[-1] < history[0] - 1.0
    assert summary["val_loss"] < history[0]


def test_corrupt_newest_checkpoint_falls_back(text_file, tmp_path):
    cfg = tiny_config(text_file, tmp_path, steps=12, ckpt_every=4)
    train(cfg, progress=False, log=lambda *_: None)
    run_dir = tmp_path / "runs" / "run"
    assert [s for s, _ in checkpoint.list_checkpoints(run_dir)] == [4, 8, 12]
    weights = run_dir / "step-00000012" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10] + b"0123456789")
    warnings = []
    assert checkpoint.latest_checkpoint(run_dir, warn=warnings.append).name == "step-00000008"
    assert warnings == [f"skipping checkpoint {run_dir / 'step-00000012'}: model.safetensors does not match "
                        "its checksum"]
    (run_dir / "step-00000008" / "manifest.json").unlink()  # as if killed before the write finished
    assert checkpoint.latest_checkpoint(run_dir, warn=warnings.append).name == "step-00000004"


def test_keep_last_prunes_old_checkpoints(text_file, tmp_path):
    train(tiny_config(text_file, tmp_path, steps=12, ckpt_every=3, keep_last=2), progress=False,
          log=lambda *_: None)
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path / "runs" / "run")] == [9, 12]
    run_dir = tmp_path / "runs" / "run"
    (run_dir / "step-00000012" / "manifest.json").unlink()  # the newest is damaged: 9 is the only good one
    checkpoint.prune_checkpoints(run_dir, keep_last=1)
    assert [s for s, _ in checkpoint.list_checkpoints(run_dir)] == [9, 12]  # kept, and the damaged one left


def test_existing_run_needs_resume_or_new_name(text_file, tmp_path):
    cfg = tiny_config(text_file, tmp_path, steps=2, ckpt_every=2)
    train(cfg, progress=False, log=lambda *_: None)
    with pytest.raises(UserError, match="already holds checkpoints; pass --resume auto"):
        train(cfg, progress=False, log=lambda *_: None)


def test_resume_refuses_a_different_model(text_file, tmp_path):
    train(tiny_config(text_file, tmp_path, steps=2, ckpt_every=2), progress=False, log=lambda *_: None)
    other = tiny_config(text_file, tmp_path, steps=4)
    other.model.d_model = 64
    with pytest.raises(UserError, match="model.d_model=64 differs from the checkpoint's model.d_model=32; repeat"):
        train(other, resume="auto", progress=False, log=lambda *_: None)


def test_param_groups_skip_decay_on_norms_biases_embeddings():
    model = Decoder(ModelConfig(vocab_size=20, d_model=16, n_layers=1, n_heads=2))
    special = set_optim(model.blocks[0].mixer.qkv.weight, lr=0.5, weight_decay=0.0)
    groups = param_groups(model, TrainConfig(lr=1e-3, weight_decay=0.1))
    by_id = {id(p): (g["peak_lr"], g["weight_decay"]) for g in groups for p in g["params"]}
    assert by_id[id(model.embed.weight)] == (1e-3, 0.0)  # also the tied head
    assert by_id[id(model.blocks[0].mixer_norm.weight)] == (1e-3, 0.0)
    assert by_id[id(model.blocks[0].mlp.up.weight)] == (1e-3, 0.1)
    assert by_id[id(special)] == (0.5, 0.0)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_lr_schedule_warms_up_then_decays_to_min():
    cfg = TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr=1e-4)
    values = [lr_multiplier(s, cfg) for s in range(100)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(values[9:], values[10:], strict=False))
    assert lr_multiplier(100, cfg) == pytest.approx(0.1)


def test_wsd_warms_up_holds_the_peak_then_decays_linearly_to_min_lr_over_its_last_decay_steps():
    cfg = TrainConfig(steps=20, warmup_steps=4, lr=1e-3, min_lr=1e-4, schedule="wsd", decay_steps=5)
    values = [lr_multiplier(s, cfg) for s in range(22)]
    assert values[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])  # the warmup
    assert values[4:15] == [1.0] * 11  # stable until the decay's first step, 20 - 5
    assert values[15:20] == pytest.approx([0.82, 0.64, 0.46, 0.28, 0.1])  # linear, at min_lr / lr on the last step
    assert values[20:] == pytest.approx([0.1, 0.1])  # the floor
    early = [lr_multiplier(s, cfg, decay_start=8) for s in range(22)]  # where patience started the decay
    assert early[:8] == values[:8] and early[8:13] == pytest.approx([0.82, 0.64, 0.46, 0.28, 0.1])
    assert early[13:] == pytest.approx([0.1] * 9)
    assert TrainConfig(steps=2000, schedule="wsd").decay_length == 400  # by default one fifth of train.steps
    cosine = TrainConfig(steps=20, warmup_steps=4)
    assert [lr_multiplier(s, cosine, decay_start=8) for s in range(20)] == [lr_multiplier(s, cosine) for s in range(20)]


@pytest.mark.parametrize("overrides, message", [
    (["train.schedule=linear"], "unknown train.schedule 'linear'. Known: cosine, wsd"),
    (["train.schedule=wsd", "train.decay_steps=-1"], "train.decay_steps=-1 must be >= 0 (0: one fifth of train.steps)"),
    (["train.decay_steps=100"], "train.decay_steps=100 applies to train.schedule=wsd only; set train.schedule=wsd or "
                                "leave train.decay_steps out"),
    (["train.schedule=wsd", "train.steps=50", "train.decay_steps=60"],
     "train.decay_steps=60 is more than train.steps=50; lower it (0: one fifth of train.steps)")])
def test_a_bad_schedule_or_decay_length_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config("demo", overrides)
    assert str(err.value) == message


def final_weights(run_dir, step):
    return load_file(run_dir / checkpoint.step_dir_name(step) / "model.safetensors")


def test_gradient_accumulation_matches_one_large_batch(text_file, tmp_path):
    whole = tiny_config(text_file, tmp_path, "whole", steps=3, ckpt_every=3, grad_clip=0)
    split = tiny_config(text_file, tmp_path, "split", steps=3, ckpt_every=3, grad_clip=0, grad_accum=2)
    for cfg in (whole, split):
        train(cfg, progress=False, log=lambda *_: None)
    a, b = final_weights(tmp_path / "runs" / "whole", 3), final_weights(tmp_path / "runs" / "split", 3)
    for key in a:  # the same windows, summed in two halves: equal up to float rounding
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-5)
    for (_, loss_a, val_a), (_, loss_b, val_b) in zip(losses(tmp_path / "runs" / "whole"),
                                                      losses(tmp_path / "runs" / "split"), strict=True):
        assert loss_a == pytest.approx(loss_b, rel=1e-5) if loss_a is not None else loss_b is None
        # validation reads the same windows however the batch is split: the same weights score the same
        assert val_a == pytest.approx(val_b, rel=1e-5) if val_a is not None else val_b is None


def test_bf16_autocast_trains(text_file, tmp_path):
    cfg = tiny_config(text_file, tmp_path, steps=10, lr=3e-3, eval_every=10, ckpt_every=10, precision="bf16")
    summary = train(cfg, progress=False, log=lambda *_: None)
    weights = final_weights(tmp_path / "runs" / "run", 10)
    assert all(w.dtype == torch.float32 for w in weights.values())  # parameters stay fp32
    history = [loss for _, loss, _ in losses(tmp_path / "runs" / "run") if loss is not None]
    assert history[-1] < history[0] and summary["val_loss"] < history[0]


def poison_gradient_at(monkeypatch, name, steps):
    """Make the gradient of parameter `name` nan during the given (1-based) training steps (counted by the
    training loss's calls, so that the passes of the memory probe before the first step do not count)."""
    import attnlab.train as train_module

    build, loss, calls = train_module.Decoder, train_module._loss, []

    def counted_loss(*args):
        calls.append(1)
        return loss(*args)

    def build_poisoned(cfg):
        model = build(cfg)
        dict(model.named_parameters())[name].register_hook(
            lambda grad: grad * float("nan") if len(calls) in steps else grad)
        return model

    monkeypatch.setattr(train_module, "_loss", counted_loss)
    monkeypatch.setattr(train_module, "Decoder", build_poisoned)


def test_a_non_finite_gradient_stops_the_run_naming_step_and_tensor(text_file, tmp_path, monkeypatch):
    poison_gradient_at(monkeypatch, "blocks.1.mlp.up.weight", steps={8})
    cfg = tiny_config(text_file, tmp_path, steps=12, ckpt_every=6)
    message = r"diverged at step 8: the gradient of blocks\.1\.mlp\.up\.weight is not finite"
    with pytest.raises(UserError, match=message):
        train(cfg, progress=False, log=lambda *_: None)
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path / "runs" / "run")] == [6]  # the last good one


def test_a_run_that_diverges_before_its_first_checkpoint_says_none_exists(text_file, tmp_path, monkeypatch):
    poison_gradient_at(monkeypatch, "blocks.1.mlp.up.weight", steps={3})
    with pytest.raises(UserError) as err:
        train(tiny_config(text_file, tmp_path, steps=12, ckpt_every=6), progress=False, log=lambda *_: None)
    assert str(err.value) == ("training diverged at step 3: the gradient of blocks.1.mlp.up.weight is not finite "
                              "(nan or inf); no checkpoint exists yet (the first was due at step 6). Lower train.lr "
                              "(now 0.002), check the data, or let train.skip_non_finite=N skip up to N such steps")
    assert checkpoint.list_checkpoints(tmp_path / "runs" / "run") == []


def test_a_corpus_of_one_repeated_character_is_refused_before_training(tmp_path, capsys, monkeypatch):
    from attnlab.cli import main

    monkeypatch.chdir(tmp_path)
    same = tmp_path / "same.txt"
    same.write_text("a" * 5000)
    for tokenizer in ("char", "byte"):  # a vocabulary of one symbol, or one id of many used alone
        overrides = [*tiny_overrides(same, tmp_path), f"data.tokenizer={tokenizer}"]
        assert main(["train", "demo", *overrides, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err == ("error: the training split is one token repeated ('a', 4,500 times): there is nothing to "
                       "predict; use text with more than one distinct symbol (data.path, data.max_chars)\n")
        assert not (tmp_path / "runs").exists()
    same.write_text("a" * 4000 + "b" + "a" * 999)  # one other symbol at the end of the training split is enough
    assert main(["train", "demo", *tiny_overrides(same, tmp_path), "train.steps=1", "--quiet"]) == 0


def test_non_finite_steps_can_be_skipped_up_to_a_limit(text_file, tmp_path, monkeypatch):
    poison_gradient_at(monkeypatch, "blocks.0.mlp.up.weight", steps={3, 5})
    lines = []
    summary = train(tiny_config(text_file, tmp_path, skip_non_finite=2), progress=False, log=lines.append)
    assert summary["skipped_steps"] == 2 and math.isfinite(summary["val_loss"])
    assert sum("step skipped" in line for line in lines) == 2


def scripted_validation(monkeypatch, values):
    """Make the training loop's evaluations return `values` in turn (the loss it would stop on)."""
    losses = iter(values)
    monkeypatch.setattr("attnlab.train.split_loss", lambda *args, **kwargs: next(losses))


def crashed_and_resumed(monkeypatch, cfg, script: dict, crash_at: int) -> dict:
    """Train cfg under the scripted validation losses (step -> loss), crash after the checkpoint of crash_at, and
    resume it: the resumed run's summary."""
    scripted_validation(monkeypatch, script.values())
    recover = crash_after_checkpoint(monkeypatch, crash_at)
    with pytest.raises(Crash):
        train(cfg, progress=False, log=lambda *_: None)
    recover()
    scripted_validation(monkeypatch, [loss for step, loss in script.items() if step > crash_at])
    return train(cfg, resume="auto", progress=False, log=lambda *_: None)


def test_early_stopping_stops_after_patience_evaluations_and_keeps_the_best(text_file, tmp_path, monkeypatch):
    from attnlab.inference import load_run

    scripted_validation(monkeypatch, [3.0, 2.0, 2.5, 2.1, 9.0, 9.0])
    cfg = tiny_config(text_file, tmp_path, steps=100, eval_every=2, ckpt_every=50, keep_last=1, patience=2)
    summary = train(cfg, progress=False, log=lambda *_: None)
    run_dir = tmp_path / "runs" / "run"
    # evaluations at steps 2, 4, 6, 8: the best is step 4, and steps 6 and 8 bring nothing lower
    assert summary["steps"] == 8 and summary["best_step"] == 4 and summary["val_loss"] == 2.0
    assert json.loads((run_dir / "best.json").read_text()) == {"step": 4, "val_loss": 2.0}
    assert [p.name for _, p in checkpoint.list_checkpoints(run_dir)] == ["step-00000004", "step-00000008"]
    assert load_run(run_dir).folder.name == "step-00000004"
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1]) == {
        "step": 8, "stopped": "patience", "best_step": 4}
    again = train(cfg, resume="auto", progress=False, log=lambda *_: None)  # a stopped run stays stopped
    assert again["steps"] == 8 and again["best_step"] == 4


def test_early_stopping_resumes_with_its_count_of_evaluations(text_file, tmp_path, monkeypatch):
    scripted_validation(monkeypatch, [3.0, 2.0, 2.5])
    cfg = tiny_config(text_file, tmp_path, steps=6, eval_every=2, ckpt_every=2, patience=2)
    train(cfg, progress=False, log=lambda *_: None)  # the cap ends it one evaluation short of stopping
    scripted_validation(monkeypatch, [2.4, 1.0])
    cfg.train.steps = 100
    summary = train(cfg, resume="auto", progress=False, log=lambda *_: None)
    assert summary["steps"] == 8 and summary["best_step"] == 4  # 2.4 at step 8 is the second without gain


@pytest.mark.parametrize("crash_at", [4, 8])
def test_early_stopping_with_min_delta_resumes_to_the_step_an_uninterrupted_run_stops_at(text_file, tmp_path,
                                                                                        monkeypatch, crash_at):
    # evaluations every 2 steps; a gain counts only below the last significant low by more than 0.5. After step 4
    # that low (3.0) is above the best loss (2.8), so it must come back from the checkpoint as it was; after step 8
    # one evaluation without gain is counted, and must come back too
    script = {2: 3.0, 4: 2.8, 6: 2.45, 8: 2.4, 10: 2.35, 12: 2.3, 14: 2.25}
    straight = tiny_config(text_file, tmp_path, "straight", steps=100, eval_every=2, ckpt_every=2, patience=2,
                           min_delta=0.5)
    scripted_validation(monkeypatch, script.values())
    expected = train(straight, progress=False, log=lambda *_: None)
    assert expected["steps"] == 10 and expected["best_step"] == 10  # 2.45 at step 6 resets the count; 8, 10 gain

    stopped = tiny_config(text_file, tmp_path, "stopped", steps=100, eval_every=2, ckpt_every=2, patience=2,
                          min_delta=0.5)
    resumed = crashed_and_resumed(monkeypatch, stopped, script, crash_at)
    assert (resumed["steps"], resumed["best_step"], resumed["val_loss"]) == (10, 10, 2.35)
    straight_records = [r for r in losses(tmp_path / "runs" / "straight") if r[2] is not None]
    assert [r for r in losses(tmp_path / "runs" / "stopped") if r[2] is not None] == straight_records


def test_without_patience_every_step_trains(text_file, tmp_path, monkeypatch):
    scripted_validation(monkeypatch, [1.0] + [5.0] * 10)
    summary = train(tiny_config(text_file, tmp_path, eval_every=2), progress=False, log=lambda *_: None)
    assert summary["steps"] == 12 and "best_step" not in summary
    assert not (tmp_path / "runs" / "run" / "best.json").exists()


def test_early_stopping_counts_only_gains_above_min_delta(text_file, tmp_path, monkeypatch):
    scripted_validation(monkeypatch, [3.0, 2.95, 2.9, 2.5, 2.45, 2.44, 2.43])
    cfg = tiny_config(text_file, tmp_path, steps=100, eval_every=2, patience=3, min_delta=0.1)
    summary = train(cfg, progress=False, log=lambda *_: None)
    # 2.5 at step 8 gains 0.4 and resets the count; the three lows after it gain less than 0.1 each, so training
    # stops at step 14, and the lowest of them is the best checkpoint
    assert summary["steps"] == 14 and summary["best_step"] == 14 and summary["val_loss"] == 2.43


def test_a_run_resumed_without_early_stopping_is_measured_at_its_newest_checkpoint(text_file, tmp_path, monkeypatch):
    from attnlab.inference import load_run

    scripted_validation(monkeypatch, [3.0, 2.0, 2.5])
    cfg = tiny_config(text_file, tmp_path, steps=6, eval_every=2, ckpt_every=2, patience=5)
    train(cfg, progress=False, log=lambda *_: None)
    run_dir = tmp_path / "runs" / "run"
    assert load_run(run_dir).folder.name == "step-00000004"
    assert resume_point(run_dir, str(run_dir), print).name == "step-00000006"  # training goes on from the newest
    scripted_validation(monkeypatch, [2.6, 2.7])
    cfg.train.steps, cfg.train.patience = 10, 0
    train(cfg, resume="auto", progress=False, log=lambda *_: None)
    assert not (run_dir / "best.json").exists() and load_run(run_dir).folder.name == "step-00000010"


# validation losses by step: steps 6 and 8 bring nothing below step 4's, so a patience of 2 runs out at step 8; the
# decay of 5 steps ends at step 13, which the run evaluates although it is not a multiple of eval_every
WSD_SCRIPT = {2: 3.0, 4: 2.0, 6: 2.5, 8: 2.1, 10: 1.9, 12: 1.8, 13: 1.7}


def wsd_config(text_file, tmp_path, name="run", **train):
    settings = dict(steps=100, eval_every=2, ckpt_every=2, patience=2, schedule="wsd", decay_steps=5) | train
    return tiny_config(text_file, tmp_path, name, **settings)


def test_with_wsd_patience_starts_the_decay_and_the_run_stops_when_it_ends(text_file, tmp_path, monkeypatch):
    from attnlab.inference import load_run

    scripted_validation(monkeypatch, WSD_SCRIPT.values())
    cfg, lines = wsd_config(text_file, tmp_path), []
    summary = train(cfg, progress=False, log=lines.append)
    run_dir, t = tmp_path / "runs" / "run", cfg.train
    # the decay takes the 5 steps after step 8, the last at min_lr, and the run stops after them, at step 13
    assert summary["steps"] == 13 and summary["best_step"] == 13 and summary["val_loss"] == 1.7
    decayed = [t.lr - (t.lr - t.min_lr) * k / 5 for k in range(1, 6)]
    assert logged(run_dir, "lr") == pytest.approx([t.lr / 2] + [t.lr] * 7 + decayed, rel=1e-12)
    assert [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "best_step" in r] \
        == [{"step": 8, "decay": "patience", "best_step": 4}, {"step": 13, "stopped": "patience", "best_step": 13}]
    assert "step 8: no significant gain in validation loss in 2 evaluations; decaying the learning rate to " \
           "train.min_lr over 5 steps, then stopping at step 13" in lines
    assert load_run(run_dir).folder.name == "step-00000013"  # the best checkpoint, as with the cosine schedule
    again = train(cfg, resume="auto", progress=False, log=lambda *_: None)  # a stopped run stays stopped
    assert again["steps"] == 13 and again["best_step"] == 13


def test_with_wsd_patience_running_out_during_the_schedule_s_own_decay_changes_nothing(text_file, tmp_path,
                                                                                     monkeypatch):
    # the decay takes steps 16 to 20; patience runs out at step 18, and the run ends at its cap
    scripted_validation(monkeypatch, [3.0, 2.0, 1.9, 1.8, 1.7, 1.6, 1.5, 1.6, 1.6, 1.4])
    summary = train(wsd_config(text_file, tmp_path, steps=20), progress=False, log=lambda *_: None)
    assert summary["steps"] == 20 and summary["best_step"] == 20
    assert logged(tmp_path / "runs" / "run", "best_step") == []  # neither a decay nor a stop of patience's


@pytest.mark.parametrize("crash_at", [6, 10])
def test_a_wsd_run_resumed_around_the_decay_patience_started_is_bitwise_the_uninterrupted_run(text_file, tmp_path,
                                                                                            monkeypatch, crash_at):
    # resumed from step 6, patience runs out again at step 8; from step 10, where a new low has reset patience's
    # count, only the checkpoint can say that the decay began at step 8
    scripted_validation(monkeypatch, WSD_SCRIPT.values())
    train(wsd_config(text_file, tmp_path, "straight"), progress=False, log=lambda *_: None)
    crashed_and_resumed(monkeypatch, wsd_config(text_file, tmp_path, "stopped"), WSD_SCRIPT, crash_at)

    def records(name):  # all but the throughput, which is measured
        lines = (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"} for line in lines]

    assert records("stopped") == records("straight") and records("straight")[-1]["step"] == 13
    a, b = final_weights(tmp_path / "runs" / "straight", 13), final_weights(tmp_path / "runs" / "stopped", 13)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def interrupt_during_step(monkeypatch, step):
    """Send this process SIGINT in the middle of training step `step` (1-based), as Ctrl-C would."""
    import os
    import signal

    import attnlab.train as train_module

    loss, calls = train_module._loss, []

    def loss_then_signal(*args):
        calls.append(1)
        if len(calls) == step:
            os.kill(os.getpid(), signal.SIGINT)
        return loss(*args)

    monkeypatch.setattr(train_module, "_loss", loss_then_signal)


def test_resume_with_dropout_restores_the_random_stream(text_file, tmp_path, monkeypatch):
    # dropout draws its masks from torch's global generator: only its restored state continues them
    dropout = ["model.dropout=0.1"]
    train(tiny_config(text_file, tmp_path, "straight", dropout), progress=False, log=lambda *_: None)
    stopped = tiny_config(text_file, tmp_path, "stopped", dropout)
    interrupt_during_step(monkeypatch, 4)  # once: the resumed run's steps come later in the count
    with pytest.raises(KeyboardInterrupt):
        train(stopped, progress=False, log=lambda *_: None)
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path / "runs" / "stopped")] == [4]
    train(stopped, resume="auto", progress=False, log=lambda *_: None)
    a, b = final_weights(tmp_path / "runs" / "straight", 12), final_weights(tmp_path / "runs" / "stopped", 12)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("split, fraction", [("val", 0.001), ("train", 0.999)])
def test_a_split_too_short_for_one_window_fails_before_the_first_step(text_file, tmp_path, monkeypatch, split,
                                                                      fraction):
    monkeypatch.setattr("attnlab.train._loss", lambda *args: pytest.fail("a training step ran"))
    cfg = tiny_config(text_file, tmp_path, extra=[f"data.val_fraction={fraction}"])
    with pytest.raises(ConfigError, match=rf"^the {split} split has \d+ tokens, too few for one window of "
                                          r"train.seq_len=32 \(33 tokens\); lower train.seq_len, "):
        train(cfg, progress=False, log=lambda *_: None)
    assert not (tmp_path / "runs" / "run").exists()


def test_a_batch_that_accumulation_does_not_split_evenly_fails_before_training(text_file, tmp_path):
    with pytest.raises(ConfigError, match="train.batch_size=4 is not divisible by train.grad_accum=3"):
        tiny_config(text_file, tmp_path, grad_accum=3)


# the parameters weight decay pulls on, for every registered mixer: weight matrices only (J has its own group)
DECAYED = {
    "boltzmann": {"out_proj.weight", "qkv.weight"},
    "ccq-gdn": {"beta_proj.weight", "conv.conv.weight", "decay_proj.weight", "gate_proj.weight", "k_proj.weight",
                "lambda_weight", "out_proj.weight", "q_proj.weight", "v_proj.weight"},
    "ccq-gla": {"forget_gate.0.weight", "forget_gate.1.weight", "gate_proj.weight", "k_proj.weight", "lambda_weight",
                "out_proj.weight", "q_proj.weight", "v_proj.weight"},
    "coupled-differential": {"coupling.w_in", "coupling.w_out", "out_proj.weight", "qkv.weight"},  # not dt_raw
    "coupled-qk": {"coupling.w_in", "coupling.w_out", "out_proj.weight", "qkv.weight"},
    "differential": {"out_proj.weight", "qkv.weight"},
    "gdn": {"beta_proj.weight", "conv.conv.weight", "decay_proj.weight", "gate_proj.weight", "k_proj.weight",
            "out_proj.weight", "q_proj.weight", "v_proj.weight"},
    "gla": {"forget_gate.0.weight", "forget_gate.1.weight", "gate_proj.weight", "k_proj.weight", "out_proj.weight",
            "q_proj.weight", "v_proj.weight"},
    "interdomain": {"conv.conv.weight", "k_proj.weight", "out_proj.weight", "q_proj.weight", "v_proj.weight"},
    "linear": {"gate_proj.weight", "k_proj.weight", "out_proj.weight", "q_proj.weight", "v_proj.weight"},
    "s4d": {"contraction", "conv.conv.weight", "k_proj.weight", "out_proj.weight", "v_proj.weight"},  # not the norms
    "sigmoid": {"out_proj.weight", "qkv.weight"},
    "softmax": {"out_proj.weight", "qkv.weight"},
    "uncoupled-qk": {"coupling.w_in", "coupling.w_out", "out_proj.weight", "qkv.weight"},
}


@pytest.mark.parametrize("name", sorted(DECAYED))
def test_weight_decay_pulls_on_weight_matrices_only_never_on_scalars_or_time_constants(name):
    assert name in list_mixers()
    mixer = build_mixer(name, d_model=64, n_heads=4)
    groups = param_groups(mixer, TrainConfig(weight_decay=0.1))
    decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    decayed = {n for n, p in mixer.named_parameters() if decay[id(p)] == 0.1}
    assert decayed == DECAYED[name]


# ---------------------------------------------------------------------------------------------------
# resume takes the checkpoint's config; fine-tuning starts a new run from a checkpoint's weights


def tiny_overrides(text_file, tmp_path, name="run", **train):
    settings = dict(steps=4, batch_size=4, seq_len=32, warmup_steps=2, eval_every=4, eval_batches=2, log_every=1,
                    ckpt_every=4, keep_last=0) | train
    return [f"name={name}", f"out_dir={tmp_path / 'runs'}", "data.source=text", f"data.path={text_file}",
            f"data.cache_dir={tmp_path / 'cache'}", "model.d_model=32", "model.n_layers=2", "model.n_heads=4",
            *(f"train.{k}={v}" for k, v in settings.items())]


def test_resume_auto_continues_with_the_checkpoint_s_config_and_the_overrides_it_may_change(text_file, tmp_path,
                                                                                           capsys):
    from attnlab.cli import main

    assert main(["train", "demo", *tiny_overrides(text_file, tmp_path), "model.mixer=sigmoid", "--quiet"]) == 0
    run_dir = tmp_path / "runs" / "run"
    where = ["name=run", f"out_dir={tmp_path / 'runs'}"]  # the preset's model, data and schedule differ
    assert main(["train", "demo", *where, "train.steps=6", "--resume", "auto", "--quiet"]) == 0
    resumed = checkpoint.load_config(run_dir / checkpoint.step_dir_name(6))
    assert resumed["model"]["mixer"] == "sigmoid" and resumed["model"]["d_model"] == 32
    assert resumed["data"]["path"] == str(text_file) and resumed["train"]["steps"] == 6
    assert resumed["train"]["lr"] == load_config("demo").train.lr and resumed["train"]["batch_size"] == 4
    capsys.readouterr()

    assert main(["train", "demo", *where, "model.d_model=64", "train.lr=0.01", "--resume", "auto"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot resume from {run_dir / checkpoint.step_dir_name(6)}: model.d_model=64, "
                          "train.lr=0.01 differ from the checkpoint's model.d_model=32, train.lr=0.002; repeat the "
                          "checkpoint's values or leave them out (a resumed run may change only train.steps, ")
    assert err.count("\n") == 1


def checkpoint_weights(folder):
    return load_file(folder / "model.safetensors")


def test_init_from_starts_a_new_run_from_the_checkpoint_s_weights_and_model(text_file, tmp_path, monkeypatch):
    import attnlab.train as train_module

    train(tiny_config(text_file, tmp_path, "source", steps=4, ckpt_every=4), progress=False, log=lambda *_: None)
    source = tmp_path / "runs" / "source"
    other = tmp_path / "other.txt"  # new data with the same characters: the checkpoint's tokenizer reads it alike
    other.write_text("".join(reversed(text_file.read_text().splitlines(keepends=True))))
    at_start, step = [], train_module._train_step

    def record_the_first_step(run, *args):
        if not at_start:
            at_start.append({k: v.detach().clone() for k, v in run.model.state_dict().items()})
        return step(run, *args)

    monkeypatch.setattr(train_module, "_train_step", record_the_first_step)
    # the model is the checkpoint's, not the preset's (d_model 128): no model override is given
    overrides = ["name=tuned", f"out_dir={tmp_path / 'runs'}", "data.source=text", f"data.path={other}",
                 f"data.cache_dir={tmp_path / 'cache'}", "train.steps=3", "train.batch_size=4", "train.seq_len=32",
                 "train.eval_every=3", "train.eval_batches=2", f"train.init_from={source}"]
    lines = []
    summary = train(load_config("demo", overrides), progress=False, log=lines.append, overrides=overrides)

    weights = checkpoint_weights(source / checkpoint.step_dir_name(4))
    assert weights.keys() <= at_start[0].keys() and all(torch.equal(at_start[0][k], weights[k]) for k in weights)
    tuned = tmp_path / "runs" / "tuned" / checkpoint.step_dir_name(3)
    assert summary["steps"] == 3 and not any(torch.equal(checkpoint_weights(tuned)[k], weights[k]) for k in weights)
    config = checkpoint.load_config(tuned)
    assert config["model"] == checkpoint.load_config(source / checkpoint.step_dir_name(4))["model"]
    assert config["data"]["path"] == str(other)
    assert {s["step"].item() for s in checkpoint.load_state(tuned / "optimizer.pt")["state"].values()} == {3}
    assert f"starting from the weights of {source / checkpoint.step_dir_name(4)} (train.init_from), with a fresh " \
           "optimizer" in lines


def test_init_from_refuses_another_model_another_tokenizer_and_a_missing_checkpoint(text_file, tmp_path):
    train(tiny_config(text_file, tmp_path, "source", steps=2, ckpt_every=2), progress=False, log=lambda *_: None)
    source = tmp_path / "runs" / "source"

    def start(*extra):
        overrides = [*tiny_overrides(text_file, tmp_path, "tuned"), f"train.init_from={source}", *extra]
        train(load_config("demo", overrides), progress=False, log=lambda *_: None, overrides=overrides)

    with pytest.raises(UserError) as err:
        start("model.n_layers=3")
    assert str(err.value) == (f"train.init_from={source}: model.n_layers=3 differs from the checkpoint's "
                              "model.n_layers=2; a fine-tuned model is the checkpoint's: repeat its values or leave "
                              "them out (only model.dropout may change)")
    unknown = tmp_path / "unknown.txt"
    unknown.write_text("ZYXW VUTS " * 500)  # characters the checkpoint's vocabulary lacks
    with pytest.raises(UserError) as err:
        start(f"data.path={unknown}")
    assert str(err.value) == (f"train.init_from={source}: the new text has characters ['S', 'T', 'U', 'V', 'W', "
                              "'X', 'Y', 'Z'] that the checkpoint's vocabulary of 42 lacks; fine-tuning reads it "
                              "with the checkpoint's tokenizer: remove them from the text, or train both runs with "
                              "data.tokenizer=byte")
    with pytest.raises(UserError) as err:
        start("data.tokenizer=byte")
    assert str(err.value) == (f"train.init_from={source}: data.tokenizer=byte, but the checkpoint's tokenizer is "
                              "char, vocabulary of 42; fine-tuning reads the new text with the checkpoint's tokenizer: "
                              "set data.tokenizer=char")
    with pytest.raises(UserError, match=rf"^train.init_from={tmp_path / 'nowhere'}: .*nowhere is neither a run "
                                        "folder nor a checkpoint folder"):
        start(f"train.init_from={tmp_path / 'nowhere'}")
    assert not (tmp_path / "runs" / "tuned").exists()  # each was refused before anything was written
    start("model.dropout=0.1")  # what fine-tuning may change
    assert checkpoint.load_config(tmp_path / "runs" / "tuned" / "step-00000004")["model"]["dropout"] == 0.1


def test_init_from_reads_text_of_fewer_characters_with_the_checkpoint_s_vocabulary(text_file, tmp_path):
    train(tiny_config(text_file, tmp_path, "source", steps=2, ckpt_every=2), progress=False, log=lambda *_: None)
    source = tmp_path / "runs" / "source"
    fewer = tmp_path / "fewer.txt"  # a vocabulary fitted to it would be smaller, with other ids
    fewer.write_text("the quick brown fox jumps over the lazy dog. " * 300)
    overrides = [*tiny_overrides(text_file, tmp_path, "tuned"), f"data.path={fewer}", f"train.init_from={source}"]
    summary = train(load_config("demo", overrides), progress=False, log=lambda *_: None, overrides=overrides)
    tuned = tmp_path / "runs" / "tuned" / checkpoint.step_dir_name(4)
    assert checkpoint.load_tokenizer_dict(tuned) == checkpoint.load_tokenizer_dict(source / "step-00000002")
    assert summary["model"].embed.num_embeddings == 42
    # resumed, it reads the text with the same tokenizer (its checkpoint's), not one fitted to the text anew
    more = [*overrides, "train.steps=6"]
    resumed = train(load_config("demo", more), resume="auto", progress=False, log=lambda *_: None, overrides=more)
    assert resumed["steps"] == 6
    assert checkpoint.load_tokenizer_dict(tuned.parent / "step-00000006") == checkpoint.load_tokenizer_dict(tuned)


def test_init_from_a_bpe_run_reuses_its_tokenizer_on_other_text(text_file, tmp_path, capsys):
    pytest.importorskip("tokenizers")
    from attnlab.cli import main

    bpe = ["data.tokenizer=bpe", "data.bpe_vocab=300"]
    assert main(["train", "demo", *tiny_overrides(text_file, tmp_path, "source", steps=2, ckpt_every=2), *bpe,
                 "--quiet"]) == 0
    source = tmp_path / "runs" / "source"
    other = tmp_path / "other.txt"  # other words: a BPE trained on it would merge other pairs
    other.write_text("".join(f"Verse {i}: sing, muse, of the wrath of Achilles, {i % 5} times.\n" for i in range(400)))
    tune = [*tiny_overrides(text_file, tmp_path, "tuned"), f"data.path={other}", f"train.init_from={source}"]
    assert main(["train", "demo", *tune, *bpe, "--quiet"]) == 0
    tuned = tmp_path / "runs" / "tuned" / checkpoint.step_dir_name(4)
    assert checkpoint.load_tokenizer_dict(tuned) == checkpoint.load_tokenizer_dict(source / "step-00000002")
    capsys.readouterr()
    # what cannot be reused is refused in one line saying what differs, and writes nothing
    assert main(["train", "demo", *tune, "name=char", "--quiet"]) == 2
    assert (f"error: train.init_from={source}: data.tokenizer=char, but the checkpoint's tokenizer is bpe, "
            "vocabulary of ") in capsys.readouterr().err
    assert main(["train", "demo", *tune, "name=wider", *bpe, "data.bpe_vocab=400", "--quiet"]) == 2
    assert (f"error: train.init_from={source}: data.bpe_vocab=400, but fine-tuning reads the new text with the "
            "checkpoint's BPE (bpe, vocabulary of ") in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["source", "tuned"]


def test_tokenizer_differences_say_what_differs():
    pytest.importorskip("tokenizers")
    from attnlab.data.tokenizer import BPETokenizer, CharTokenizer, difference

    # two BPEs of one size trained on other words: what differs is their merges, not their sizes
    a = BPETokenizer.train([" ".join(f"word{i}" for i in range(3000))], 270).to_dict()
    b = BPETokenizer.train([" ".join(f"term{i}" for i in range(3000))], 270).to_dict()
    assert difference(a, a) is None
    assert difference(a, b) == ("the data's BPE (bpe, vocabulary of 270) and the checkpoint's (bpe, vocabulary of "
                                "270) give 8 tokens other ids or none (e.g. 'er'): they were trained on other text")
    assert difference(CharTokenizer("abc").to_dict(), CharTokenizer("abd").to_dict()) == (
        "the data has characters ['c'] that the checkpoint's vocabulary lacks and the checkpoint's vocabulary has "
        "characters ['d'] that the data lacks")
    assert difference(CharTokenizer("ab").to_dict(), a) == ("the data's tokenizer (char, vocabulary of 2) is not the "
                                                            "checkpoint's (bpe, vocabulary of 270)")


@pytest.mark.parametrize("override, message", [
    ("train.beta1=1.5", "train.beta1=1.5 must be in [0, 1), e.g. 0.9 for beta1 and 0.99 for beta2"),
    ("train.beta2=1", "train.beta2=1.0 must be in [0, 1), e.g. 0.9 for beta1 and 0.99 for beta2"),
    ("train.beta1=-0.1", "train.beta1=-0.1 must be in [0, 1), e.g. 0.9 for beta1 and 0.99 for beta2")])
def test_adam_betas_outside_0_to_1_are_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        load_config("demo", [override])
    assert str(err.value) == message


# ---------------------------------------------------------------------------------------------------
# the numbers training records and prints are the values it computes


def record_optimizer_steps(monkeypatch):
    """The norm of the gradients each optimizer step receives (after clipping), in a list."""
    import attnlab.train as train_module

    norms, adamw = [], train_module._adamw

    def recording_adamw(*args):
        optimizer = adamw(*args)
        step = optimizer.step

        def recorded_step():
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            norms.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item())
            return step()

        optimizer.step = recorded_step
        return optimizer

    monkeypatch.setattr(train_module, "_adamw", recording_adamw)
    return norms


def logged(run_dir, key):
    return [r[key] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if key in r]


@pytest.mark.parametrize("clip", [0.0, 0.05])
def test_gradients_are_clipped_to_train_grad_clip_and_the_log_has_their_norm_before(text_file, tmp_path,
                                                                                   monkeypatch, clip):
    applied = record_optimizer_steps(monkeypatch)
    train(tiny_config(text_file, tmp_path, steps=4, grad_clip=clip), progress=False, log=lambda *_: None)
    before = logged(tmp_path / "runs" / "run", "grad_norm")
    assert len(before) == 4 and min(before) > 0.05  # every step's gradient is larger than the clip
    assert applied == pytest.approx([clip] * 4 if clip else before, rel=1e-5)


def test_the_logged_loss_lr_throughput_and_validation_are_the_values_of_training(text_file, tmp_path, monkeypatch):
    import types

    import attnlab.train as train_module
    from attnlab.evaluate import split_loss
    from attnlab.inference import load_run

    now, micro_losses, loss = [0.0], [], train_module._loss

    def timed_loss(*args):  # the clock advances only with the micro-batches: the n-th takes n seconds
        now[0] += len(micro_losses) + 1
        value = loss(*args)
        micro_losses.append(value.item())
        return value

    monkeypatch.setattr(train_module, "_loss", timed_loss)
    monkeypatch.setattr(train_module, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    cfg = tiny_config(text_file, tmp_path, steps=6, grad_accum=2, log_every=2, eval_every=6, ckpt_every=6)
    lines = []
    summary = train(cfg, progress=False, log=lines.append)
    run_dir = tmp_path / "runs" / "run"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]

    assert [r["step"] for r in steps] == [2, 4, 6]
    for r in steps:  # a step's loss is the mean over its two micro-batches' targets: 4 rows of 32
        assert r["loss"] == pytest.approx(sum(micro_losses[2 * r["step"] - 2 : 2 * r["step"]]) / (4 * 32), rel=1e-6)
        assert r["lr"] == pytest.approx(cfg.train.lr * lr_multiplier(r["step"] - 1, cfg.train), rel=1e-12)
        # since the last line: 2 steps of 4 x 32 tokens, in micro-batches 2 * step - 3 to 2 * step
        assert r["tokens_per_s"] == 2 * 4 * 32 / sum(range(2 * r["step"] - 3, 2 * r["step"] + 1))
        assert f"step {r['step']}: loss {r['loss']:.3f}, {r['tokens_per_s']:,.0f} tokens/s" in lines
    [val] = [r for r in records if "val_loss" in r]
    run = load_run(run_dir)  # the checkpoint of step 6, measured again: the same windows give the same loss
    again = split_loss(run.model, run.corpus(), "val", cfg.train.eval_batches, 4, 32, None, chunk=2)
    assert val["step"] == 6 and val["val_loss"] == pytest.approx(again, rel=1e-6)
    assert val["val_ppl"] == pytest.approx(math.exp(val["val_loss"]), rel=1e-12)
    assert f"step 6: val loss {val['val_loss']:.4f} (perplexity {val['val_ppl']:.2f})" in lines
    assert summary["val_loss"] == val["val_loss"] and summary["val_ppl"] == val["val_ppl"]
    assert summary["train_loss"] == steps[-1]["loss"] and summary["tokens_per_s"] == steps[-1]["tokens_per_s"]
    assert summary["steps"] == 6 and summary["train_seconds"] == sum(range(1, 13)) and summary["skipped_steps"] == 0
    assert summary["params"] == run.model.num_params()
    assert checkpoint.load_state(run_dir / "step-00000006" / "train_state.pt")["train_seconds"] == sum(range(1, 13))


def test_the_device_is_picked_without_training():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="train.device=cuda:1 but no CUDA device is available; use train"):
            pick_device("cuda:1")
