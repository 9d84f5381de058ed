"""attnlab demo, shrunk to tiny models: what it writes where."""

import dataclasses
import logging
from collections import Counter

from attnlab.commands import demo as demo_command
from attnlab.config import load_config
from attnlab.lab import demo
from attnlab.lab.spec import Changes


def test_the_demo_writes_no_bars_into_a_redirected_stderr_and_each_note_once(tmp_path, monkeypatch, capsys, caplog):
    text_file = tmp_path / "play.txt"  # holds the characters of the demo's prompt
    text_file.write_text("".join(f"ROMEO.\nLine {i}: the quick brown fox jumps over the lazy dog.\n"
                                 for i in range(300)))
    tiny = Changes.model(d_model=16, n_layers=1, n_heads=2) | Changes.train(batch_size=4)
    tiny_text = (tiny | Changes.data(source="text", path=str(text_file), cache_dir=str(tmp_path / "cache"))
                 | Changes.train(seq_len=16))
    tiny_task = tiny | Changes.task("mqar", train_examples=64, test_examples=32)

    def small_suite(tier="default"):
        """The demo's suite with two arms per experiment, on tiny models (the lm arms on a small text)."""
        suite = real_suite(tier)
        shrink = {"lm": tiny_text, "mqar": tiny_task}
        experiments = [dataclasses.replace(e, arms=[dataclasses.replace(a, changes=a.changes | shrink[e.name])
                                                    for a in e.arms[:2]]) for e in suite.experiments]
        return dataclasses.replace(suite, experiments=experiments)

    real_suite = demo.suite
    monkeypatch.setattr(demo, "suite", small_suite)
    monkeypatch.setattr(demo_command, "shakespeare_config", lambda out, steps: load_config("demo", [
        f"out_dir={out}", f"train.steps={steps}", f"train.eval_every={steps}", f"train.ckpt_every={steps}",
        *tiny_text]))
    caplog.set_level(logging.INFO)
    result = demo_command.run_demo(str(tmp_path / "demo"), quick=True)

    assert len(result["comparison"]) == 4
    err = capsys.readouterr().err  # pytest's capture is no terminal
    assert "%|" not in err and "it/s" not in err
    notes = Counter(r.getMessage() for r in caplog.records if r.getMessage().startswith("note:"))
    # the Shakespeare model's warmup of 100, the lm arms' 30 and the MQAR arms' 200 are each cut to 10 steps
    assert sorted(notes) == [f"note: train.warmup_steps={w} is more than half of train.steps=20; warming up for "
                             "10 steps (set train.warmup_steps=10 or less to choose)" for w in (100, 200, 30)]
    assert set(notes.values()) == {1}
