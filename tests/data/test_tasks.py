"""Synthetic tasks: MQAR, bracket matching and needle-in-a-haystack prompts."""

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from attnlab import checkpoint
from attnlab.data import brackets, mqar, niah
from attnlab.data.tokenizer import CharTokenizer
from attnlab.errors import ConfigError, UserError


def mqar_data(**options):
    cfg = mqar.MQARConfig(**({"train_examples": 300, "test_examples": 200} | options))
    return mqar.MQARData(cfg, seq_len=64)


def test_mqar_is_deterministic_and_splits_never_share_a_sequence():
    a, b = mqar_data(), mqar_data()
    assert torch.equal(a.train[0], b.train[0]) and torch.equal(a.test[1], b.test[1])
    assert not torch.equal(mqar_data(seed=1).train[0], a.train[0])
    train, val, test = ({tuple(row) for row in x[0].tolist()} for x in (a.train, a.val, a.test))
    assert not train & test and not train & val and not val & test
    assert a.batch("val", 4, 64, torch.Generator().manual_seed(0))[0].tolist()[0] in [list(r) for r in val]


def test_mqar_layout_keys_values_and_queries():
    cfg = mqar.MQARConfig(random_non_queries=False)
    inputs, targets = mqar.generate(50, 64, 4, 256, cfg.power_a, False, seed=3)
    for x, y in zip(inputs.tolist(), targets.tolist(), strict=True):
        keys, values = x[0:8:2], x[1:8:2]
        assert all(1 <= k < 128 for k in keys) and all(128 <= v < 256 for v in values)
        assert len(set(keys)) == 4
        scored = [i for i, t in enumerate(y) if t != -100]
        assert len(scored) == 4  # one query per pair, each after its key reappears
        for i in scored:
            assert x[i] in keys and y[i] == values[keys.index(x[i])]


def oracle_predictions(inputs):
    """A perfect lookup: remember each key's value from the context, answer it at the key's repeat."""
    predictions = torch.zeros_like(inputs)
    for row, x in enumerate(inputs.tolist()):
        memory = {}
        for i in range(0, len(x) - 1):
            if i < 16 and i % 2 == 0:
                memory.setdefault(x[i], x[i + 1])
            predictions[row, i] = memory.get(x[i], 0) if i >= 8 else 0
    return predictions


def test_mqar_answers_are_recoverable_by_lookup_and_not_by_guessing():
    data = mqar_data(pairs=4)
    inputs, targets = data.test
    scored = targets != -100
    oracle = oracle_predictions(inputs)
    assert (oracle[scored] == targets[scored]).float().mean() == 1.0
    guesses = torch.randint(128, 256, targets.shape, generator=torch.Generator().manual_seed(0))
    assert abs((guesses[scored] == targets[scored]).float().mean().item() - 1 / 128) < 0.01


def test_mqar_slices_by_number_of_pairs():
    data = mqar_data(test_pairs=[1, 2, 8])
    assert sorted(data.slices) == [1, 2, 8]
    for pairs, (_, y) in data.slices.items():
        assert ((y != -100).sum(1) == pairs).all()


@pytest.mark.parametrize("options, message", [({"pairs": 20}, "4 \\* pairs <= train.seq_len=64"),
                                              ({"vocab_size": 60}, "must exceed train.seq_len=64")])
def test_mqar_refuses_what_does_not_fit(options, message):
    with pytest.raises(ConfigError, match=message):
        mqar_data(**options)


def verify_brackets(tokens, targets):
    """An independent check: every closer's target is its opener, found by scanning the nesting depth."""
    for i, (token, target) in enumerate(zip(tokens, targets, strict=True)):
        if token != brackets.CLOSE:
            assert target == -100
            continue
        depth = 0
        for j in range(i, -1, -1):
            depth += {brackets.CLOSE: 1, brackets.OPEN: -1}.get(tokens[j], 0)
            if depth == 0:
                assert target == j and tokens[j] == brackets.OPEN
                break
        else:
            raise AssertionError("unmatched closing bracket")


def test_bracket_targets_point_at_the_matching_opener():
    data = brackets.BracketData(brackets.BracketsConfig(train_examples=200, test_examples=50), seq_len=16)
    for x, y in zip(data.train[0].tolist(), data.train[1].tolist(), strict=True):
        verify_brackets(x, y)
        assert x.count(brackets.OPEN) == x.count(brackets.CLOSE) >= 1
        assert all(0 <= t < brackets.VOCAB_SIZE for t in x)
    assert data.output_size == 16


def test_brackets_are_deterministic_and_splits_differ():
    cfg = brackets.BracketsConfig(train_examples=100, test_examples=100)
    a, b = brackets.BracketData(cfg, 12), brackets.BracketData(cfg, 12)
    assert torch.equal(a.train[0], b.train[0]) and not torch.equal(a.train[0], a.test[0])
    assert torch.equal(a.val[0], b.val[0]) and not torch.equal(a.val[0], a.test[0])
    balanced = brackets.BracketData(brackets.BracketsConfig(train_examples=20, test_examples=5, balanced=True), 12)
    assert ((balanced.train[0] == brackets.OPEN).sum(1) == 6).all()


HAYSTACK = "It is a truth universally acknowledged. " * 400
ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-:?.\n "
TOKENIZER = CharTokenizer(HAYSTACK + niah.NOISE + ALPHABET)


@pytest.mark.parametrize("kind", [kind for kind in niah.KINDS if kind != "multikey"])
@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_niah_prompt_has_one_needle_at_the_depth_and_the_exact_length(kind, depth):
    rng = np.random.default_rng(0)
    sample = niah.make_sample(kind, 600, depth, rng, HAYSTACK, TOKENIZER.encode)
    text = TOKENIZER.decode(sample.prompt)
    value = TOKENIZER.decode(sample.answer)
    assert len(sample.prompt) + len(sample.answer) - 1 == 600  # what a model reads while it answers
    assert text.count("The special magic") == 1 and text.count(value) == 1
    assert text.index("The special magic") == sample.needle_at + 1
    needle = text[sample.needle_at : text.index(value) + len(value) + 2]
    haystack_len = len(sample.prompt) - len(TOKENIZER.encode(needle))
    haystack_len -= len(TOKENIZER.encode(text[text.index("\nWhat") :]))
    assert abs(sample.needle_at - depth * haystack_len) <= 64  # moved at most to a nearby sentence end
    assert (len(value) == 7 and value.isdigit()) if kind != "uuid" else len(value) == 36


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_multikey_hides_needles_under_distinct_keys_and_asks_for_the_one_at_the_depth(depth):
    for seed in range(5):
        sample = niah.make_sample("multikey", 700, depth, np.random.default_rng(seed), HAYSTACK, TOKENIZER.encode,
                                  keys=4)
        text = TOKENIZER.decode(sample.prompt)
        assert len(sample.prompt) + len(sample.answer) - 1 == 700
        needles = re.findall(r"The special magic number for (\w+-\w+) is: (\d{7})\.", text)
        asked = re.search(r"What is the special magic number for (\w+-\w+)\?", text)[1]
        assert len(needles) == 4 and len({key for key, _ in needles}) == 4  # distinct keys
        assert dict(needles)[asked] == TOKENIZER.decode(sample.answer)  # the answer follows from the prompt
        assert text.index(f"for {asked} is:") == sample.needle_at + len(" The special magic number ")
        assert abs(sample.needle_at / len(sample.prompt) - depth) < 0.35  # placed by depth among the distractors
    one = niah.make_sample("multikey", 300, 0.5, np.random.default_rng(0), HAYSTACK, TOKENIZER.encode, keys=1)
    number = niah.make_sample("number", 300, 0.5, np.random.default_rng(0), HAYSTACK, TOKENIZER.encode)
    assert one == number  # one key: S-NIAH-2
    with pytest.raises(ConfigError, match="data.task_options.niah.keys=101 must be between 1 and 100"):
        niah.NIAHConfig(kind="multikey", keys=101).validate()


def test_niah_is_deterministic_and_too_short_prompts_are_refused():
    a = niah.make_sample("uuid", 300, 0.5, np.random.default_rng(4), HAYSTACK, TOKENIZER.encode)
    b = niah.make_sample("uuid", 300, 0.5, np.random.default_rng(4), HAYSTACK, TOKENIZER.encode)
    assert a == b
    with pytest.raises(ConfigError, match="needs at least"):
        niah.make_sample("passkey", 20, 0.5, np.random.default_rng(0), HAYSTACK, TOKENIZER.encode)


def test_niah_shortest_length_sets_the_default_lengths_and_checks_the_vocabulary():
    shortest = {kind: niah.shortest_length(kind, TOKENIZER.encode) for kind in niah.KINDS}
    # needle and question, and the answer but one
    assert shortest == {"passkey": 128, "number": 128, "uuid": 182, "multikey": 128}
    needle = len(" The special magic number for crooked-orchard is: 0123456. ")
    assert niah.shortest_length("multikey", TOKENIZER.encode, keys=4) == 128 + 3 * needle
    for kind in niah.KINDS:  # a sample of the shortest length can be made
        niah.make_sample(kind, shortest[kind], 0.5, np.random.default_rng(0), HAYSTACK, TOKENIZER.encode)
    assert niah.default_lengths(128, 128) == [128, 256] and niah.default_lengths(128, 182) == [192, 384]
    needle_only = CharTokenizer(HAYSTACK + "0123456789-:Tbfmp\nA")  # the needle's characters, not the question's
    with pytest.raises(UserError, match=r"characters \['\?', 'W'\] are not in"):
        niah.shortest_length("number", needle_only.encode)


def test_niah_training_length_must_hold_a_prompt_and_its_answer():
    cfg = niah.NIAHConfig(kind="uuid", train_examples=2, test_per_depth=1)
    with pytest.raises(ConfigError, match="train.seq_len=128 is too short for data.task_options.niah.kind=uuid: its "
                                          "sequences need at least 182 tokens"):
        niah.NIAHData(cfg, 128, {"train": HAYSTACK, "val": HAYSTACK}, TOKENIZER)
    assert niah.NIAHData(cfg, 182, {"train": HAYSTACK, "val": HAYSTACK}, TOKENIZER).train[0].shape == (2, 182)


def test_multikey_training_validation_and_test_sequences_hold_the_configured_needles():
    cfg = niah.NIAHConfig(kind="multikey", keys=3, train_examples=4, test_per_depth=1)
    data = niah.NIAHData(cfg, 400, {"train": HAYSTACK, "val": HAYSTACK}, TOKENIZER)
    for split in (data.train, data.val, data.test):
        for row in split[0].tolist():
            needles = re.findall(r"The special magic number for (\w+-\w+) is: \d{7}\.", TOKENIZER.decode(row))
            assert len(set(needles)) == 3, needles  # under distinct keys, one of them asked for


def test_niah_training_data_scores_only_the_answer():
    cfg = niah.NIAHConfig(kind="number", train_examples=20, test_per_depth=2)
    data = niah.NIAHData(cfg, 300, {"train": HAYSTACK, "val": HAYSTACK}, TOKENIZER)
    x, y = data.train
    assert x.shape == y.shape == (20, 300) and data.val[0].shape == data.test[0].shape == (2 * len(cfg.depths), 300)
    assert not torch.equal(data.val[0], data.test[0])
    assert ((y != -100).sum(1) == 7).all()
    for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
        answer = [t for t in row_y if t != -100]
        assert TOKENIZER.decode(answer).isdigit() and row_y[-1] == answer[-1]
        assert row_x[-6:] == answer[:-1]  # teacher forcing: the answer so far is the input


def test_niah_accuracy_is_exact_match_by_depth():
    rng = np.random.default_rng(1)
    samples = [niah.make_sample("number", 300, depth, rng, HAYSTACK, TOKENIZER.encode)
               for depth in (0.0, 1.0) for _ in range(3)]
    answers = {tuple(s.prompt): s.answer for s in samples}

    class Oracle:  # answers every prompt correctly except those whose needle sits at depth 1
        def eval(self):
            return self

        def generate(self, prompt, n, temperature):
            answer = answers[tuple(prompt[0].tolist())]
            at_end = [s for s in samples if s.prompt == prompt[0].tolist()][0].depth == 1.0
            return torch.tensor([prompt[0].tolist() + ([0] * n if at_end else answer)])

    assert niah.niah_accuracy(Oracle(), samples) == {0.0: 1.0, 1.0: 0.0}


@pytest.mark.parametrize("count", ["mqar.train_examples", "mqar.test_examples", "brackets.train_examples",
                                   "brackets.test_examples", "niah.train_examples", "niah.test_per_depth"])
def test_an_empty_task_split_is_refused_before_training(count, tmp_path, capsys):
    from attnlab.cli import main

    source = count.split(".")[0]
    assert main(["train", "demo", f"data.source={source}", f"data.task_options.{count}=0", "train.steps=1",
                 f"out_dir={tmp_path}"]) == 2
    assert f"data.task_options.{count}=0 must be at least 1" in capsys.readouterr().err
    assert not any(tmp_path.rglob("step-*"))


def as_saved_before_task_options(step: Path) -> None:
    """Rewrite a checkpoint's config.yaml as runs saved it before data.task_options: every built-in task's
    settings a section of data (data.mqar: {...}), the manifest's digest made to match."""
    path = step / "config.yaml"
    values = yaml.safe_load(path.read_text())
    values["data"] |= values["data"].pop("task_options")
    values["data"] |= {"brackets": dataclasses.asdict(brackets.BracketsConfig()),
                       "niah": dataclasses.asdict(niah.NIAHConfig())}
    path.write_text(yaml.safe_dump(values))
    manifest = json.loads((step / checkpoint.MANIFEST).read_text())
    manifest["files"]["config.yaml"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (step / checkpoint.MANIFEST).write_text(json.dumps(manifest))


def test_a_run_saved_with_task_sections_evaluates_and_resumes(tmp_path, capsys):
    from attnlab.cli import main

    run = ["--quiet", "name=mq", f"out_dir={tmp_path}", "model.d_model=16", "model.n_layers=1",
           "data.mqar.train_examples=64", "data.mqar.test_examples=32", "train.batch_size=8", "train.eval_batches=1",
           "train.ckpt_every=2"]  # the keys of before, as suites and scripts still give them
    assert main(["train", "mqar", *run, "train.steps=2"]) == 0
    (step,) = (tmp_path / "mq").glob("step-*")
    as_saved_before_task_options(step)
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "mq"), "--task", "mqar"]) == 0
    assert capsys.readouterr().out.startswith("mqar test accuracy: ")
    assert main(["train", "mqar", *run, "train.steps=4", "--resume", "auto"]) == 0
    assert "data.mqar.pairs" not in capsys.readouterr().err
    assert main(["train", "mqar", *run, "train.steps=6", "--resume", "auto", "data.task_options.mqar.pairs=2"]) == 2
    assert "differs from the checkpoint's" in capsys.readouterr().err
