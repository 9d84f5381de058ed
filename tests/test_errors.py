"""Bad input from a person gets one line naming the field and the fix, without a traceback (which
--debug adds). Each row: what was typed, and a piece of the message it must get."""

import pytest

from attnlab.cli import main

BAD_INPUT = [
    (["train", "demo", "model.mixr=softmax"], "unknown field 'model.mixr'; did you mean 'model.mixer'?"),
    (["train", "demo", "model.mixer=sofmax"], "unknown mixer 'sofmax'; did you mean 'softmax'?"),
    (["train", "nosuchpreset"], "unknown config preset or file 'nosuchpreset'"),
    (["train", "demo", "model.n_heads=3"], "model.n_heads=3 does not divide model.d_model=128"),
    (["train", "demo", "train.lr=-1"], "need 0 <= train.min_lr <= train.lr and lr > 0"),
    (["train", "demo", "train.precision=fp16"], "unknown train.precision 'fp16'; did you mean 'bf16'?"),
    (["train", "demo", "train.batch_size=5", "train.grad_accum=2"], "train.batch_size=5 is not divisible"),
    (["train", "demo", "data.source=text", "data.path=/no/such/texts"], "data.path=/no/such/texts does not exist"),
    (["train", "demo", "data.source=niah", "data.niah.kind=passwd"], "data.niah.kind='passwd' must be one of"),
    (["train", "mqar", "data.mqar.pairs=40"], "MQAR with 40 pairs needs 4 * pairs <= train.seq_len=64"),
    (["train", "demo", "data.source=mixed", "data.max_chars=9000000"], "or lower data.mix.docs"),
    (["train", "boltzmann-char", "model.mixer_options.boltzmann.window=40", "train.seq_len=40", "model.positions=40",
      "--quiet"], "enumerates 2^40 configurations per query"),
    (["train", "boltzmann-char", "train.seq_len=40"],
     "model.positions=12 learned positions cannot cover train.seq_len=40"),
    (["train", "demo", "model.mixer=boltzmann", "model.mixer_options.boltzmann.inference=dqa"],
     "dqa simulates 2^window amplitudes per query; window=16 is above 12"),
    (["eval", "/no/such/run"], "is neither a run folder nor a checkpoint folder"),
    (["reproduce", "ccq", "--seeds", "0"], "need at least one seed"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_INPUT, ids=[" ".join(a[:3]) for a, _ in BAD_INPUT])
def test_bad_input_gets_one_clear_line(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written, but if it were, not into the checkout
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(("positions", "message"), [
    (12, "positions 12..12 are beyond the model's 12 learned position embeddings (model.positions)"),
    (0, "window=12 sees at most 12 positions, but this call reaches 13"),
])
def test_decoding_past_a_window_is_refused_in_one_line(positions, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    run = ["name=b", f"out_dir={tmp_path}", "train.steps=1", "train.batch_size=2", "train.eval_batches=1",
           "data.max_chars=20000", f"model.positions={positions}"]
    assert main(["train", "boltzmann-char", *run, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "b"), "--tokens", "30", "--context", "0"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_debug_adds_the_traceback(capsys):
    assert main(["--debug", "train", "demo", "model.mixer=sofmax"]) == 2
    assert "Traceback" in capsys.readouterr().err
