"""State tracking: the groups are groups, every target is the prefix product of its word, the held-out words are
apart from the training words, and impossible settings are one line."""

import itertools

import numpy as np
import pytest
import torch

from attnlab.data import state_tracking as st
from attnlab.errors import ConfigError

CONFIGS = {"parity": st.ParityConfig(), "modular": st.ModularConfig(modulus=7), "s5": st.S5Config(),
           "a5": st.A5Config()}


@pytest.mark.parametrize("task", CONFIGS)
def test_each_table_is_a_group_of_its_order(task):
    table = CONFIGS[task].table()
    n = {"parity": 2, "modular": 7, "s5": 120, "a5": 60}[task]
    assert table.shape == (n, n) and CONFIGS[task].order() == n
    assert all(sorted(row) == list(range(n)) for row in table)  # a Latin square: every product has an inverse
    a, b, c = np.random.default_rng(0).integers(n, size=(3, 500))
    assert (table[table[a, b], c] == table[a, table[b, c]]).all()  # associative
    identity = [e for e in range(n) if (table[e] == np.arange(n)).all()]
    assert len(identity) == 1 and (table[:, identity[0]] == np.arange(n)).all()


def compose(p, q):
    """p then q, on the permutations themselves (no table): (p q)(i) = q(p(i))."""
    return tuple(q[p[i]] for i in range(len(p)))


@pytest.mark.parametrize("task", CONFIGS)
def test_every_target_is_the_prefix_product_of_its_word(task):
    cfg = CONFIGS[task]
    words, states = st.generate(cfg.table(), 20, 12, seed=1)
    if task in ("s5", "a5"):  # recomputed from the permutations, not from the table
        perms = [p for p in itertools.permutations(range(5)) if task == "s5" or st._is_even(p)]
        for word, state in zip(words.tolist(), states.tolist(), strict=True):
            product = perms[word[0]]
            for g, s in zip(word[1:], state[1:], strict=True):
                product = compose(product, perms[g])
                assert perms[s] == product
    else:
        assert torch.equal(states, words.cumsum(1) % cfg.order())


def test_the_splits_are_apart_and_the_longer_tests_are_longer():
    data = st.WordProblem(st.ParityConfig(train_examples=3000, test_examples=200, test_lengths=[1, 2, 8]), 12)
    train, val, test = ({tuple(w) for w in split[0].tolist()} for split in (data.train, data.val, data.test))
    assert not train & val and not train & test and not val & test  # 4,096 words: most would recur by chance
    assert {k: x.shape for k, (x, _) in data.slices.items()} == {2: (200, 24), 8: (200, 96)}
    assert data.vocab_size == 2 and data.batch("val", 4, 12, torch.Generator().manual_seed(0))[0].shape == (4, 12)


@pytest.mark.parametrize("cfg, problem", [
    (st.ModularConfig(modulus=1), "data.task_options.modular.modulus=1 must be at least 2"),
    (st.ParityConfig(test_lengths=[0, 2]), "data.task_options.parity.test_lengths=[0, 2] must be whole multiples"),
    (st.S5Config(train_examples=0), "data.task_options.s5.train_examples=0 must be at least 1"),
])
def test_an_impossible_setting_is_one_line(cfg, problem):
    with pytest.raises(ConfigError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        cfg.validate()


def test_too_few_distinct_words_to_hold_out_is_one_line():
    with pytest.raises(ConfigError, match="parity has too few distinct words of 4 elements to hold out 500"):
        st.WordProblem(st.ParityConfig(train_examples=10), 4)


def test_a_run_trains_on_parity_and_reports_each_length(tmp_path, capsys):
    from attnlab.cli import main

    run = ["train", "demo", "--quiet", f"out_dir={tmp_path}", "name=p", "data.source=parity", "train.seq_len=8",
           "train.steps=4", "train.eval_every=4", "train.batch_size=8", "train.eval_batches=1", "model.d_model=16",
           "model.n_layers=1", "model.n_heads=2", "model.positions=16", "data.task_options.parity.train_examples=100",
           "data.task_options.parity.test_examples=20"]
    assert main(run) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "p"), "--task", "parity"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines[-4:]] == [
        "parity test accuracy", "parity test length=2x", "parity test length=4x", "parity test length=8x"]
    assert lines[-2].endswith("not measured, the model reads at most 16 tokens (model.positions=16)")
