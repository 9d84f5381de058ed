import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab.config import ModelConfig
from attnlab.data.examples import FixedExamples
from attnlab.evaluate import scored_positions, split_loss, whole_split_loss
from attnlab.model import Decoder


class Corpus:
    """The two methods of a TokenCorpus that evaluation reads."""

    def __init__(self, tokens: np.ndarray, n_train: int):
        self.tokens, self.n_train = tokens, n_train

    def split(self, name):
        return self.tokens[: self.n_train] if name == "train" else self.tokens[self.n_train :]

    def batch(self, split, batch_size, seq_len, generator):
        data = torch.from_numpy(self.split(split).astype("int64"))
        starts = torch.randint(len(data) - seq_len, (batch_size,), generator=generator)
        windows = torch.stack([data[s : s + seq_len + 1] for s in starts.tolist()])
        return windows[:, :-1], windows[:, 1:]


@pytest.fixture
def model_and_corpus():
    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2)).double()
    return model, Corpus(np.random.default_rng(0).integers(0, 11, 200), n_train=150)


def test_the_whole_split_scores_every_position_once_in_windows_from_a_fresh_state(model_and_corpus):
    model, corpus = model_and_corpus
    val = torch.from_numpy(corpus.split("val").astype("int64"))  # 50 tokens: windows of 8, 8, ..., then 1
    total, count = 0.0, 0
    for start in range(0, len(val) - 1, 8):
        window = val[start : min(start + 9, len(val))][None]
        logits, _ = model(window[:, :-1])
        total += F.cross_entropy(logits[0], window[0, 1:], reduction="sum").item()
        count += window.shape[1] - 1
    assert count == scored_positions(corpus) == 49
    assert whole_split_loss(model, corpus, "val", 8, None) == pytest.approx(total / count, rel=1e-12)
    assert split_loss(model, corpus, "val", 0, 4, 8, None, chunk=2) == pytest.approx(total / count, rel=1e-12)


def test_a_sample_of_windows_does_not_depend_on_how_it_is_chunked(model_and_corpus):
    model, corpus = model_and_corpus
    losses = [split_loss(model, corpus, "val", 3, 4, 8, None, chunk=chunk) for chunk in (1, 4, 12)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-12) and losses[1] == pytest.approx(losses[2], rel=1e-12)
    assert split_loss(model, corpus, "val", 3, 4, 8, None) != split_loss(model, corpus, "val", 2, 4, 8, None)


def test_perplexity_by_length_is_exp_of_the_mean_window_loss(model_and_corpus):
    from attnlab.evaluate import perplexity_by_length

    model, corpus = model_and_corpus
    val = torch.from_numpy(corpus.split("val").astype("int64"))  # 50 tokens
    expected = {}
    for length, windows in ((8, 3), (16, 1)):  # at most 24 tokens per length: 3 windows of 8, 1 of 16
        window_losses = [F.cross_entropy(model(val[None, w * length : (w + 1) * length])[0][0],
                                         val[w * length + 1 : (w + 1) * length + 1]).item() for w in range(windows)]
        expected[length] = math.exp(sum(window_losses) / windows)
    assert perplexity_by_length(model, corpus, [8, 16], max_tokens=24) == pytest.approx(expected, rel=1e-6)


def test_a_task_of_fixed_examples_is_validated_on_every_example_once(model_and_corpus):
    model, _ = model_and_corpus
    inputs = torch.randint(0, 11, (7, 5), generator=torch.Generator().manual_seed(1))
    targets = torch.where(torch.rand(7, 5, generator=torch.Generator().manual_seed(2)) < 0.5, inputs, -100)

    class Task(FixedExamples):
        val = (inputs, targets)

    logits, _ = model(inputs)
    every = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100).item()
    for chunk in (1, 3, 7):  # not by row: by scored target, however the rows are chunked
        assert split_loss(model, Task(), "val", 0, 4, 5, None, chunk=chunk) == pytest.approx(every, rel=1e-12)
    assert split_loss(model, Task(), "val", 1, 4, 5, None) != pytest.approx(every, rel=1e-6)  # a sample of rows


class Echo(torch.nn.Module):
    """Predicts each position's own input token: logits one-hot on it."""

    def forward(self, x):
        return F.one_hot(x, 5).double(), None

    def read_limit(self):
        return None


def test_accuracy_counts_only_the_scored_positions():
    from attnlab.evaluate import accuracy, task_accuracy

    inputs = torch.tensor([[1, 2, 3], [4, 0, 1], [2, 2, 2]])
    targets = torch.tensor([[1, -100, 0], [-100, -100, 1], [2, 3, -100]])  # 5 scored, 3 of them right
    assert accuracy(Echo(), inputs, targets) == 3 / 5
    assert accuracy(Echo(), inputs, targets, batch_size=2) == 3 / 5  # summed over batches, not averaged

    class Task:
        test = (inputs, targets)
        slices = {2: (inputs[:1], targets[:1]), 4: (inputs[2:], targets[2:])}
        slice_label = "pairs={}"

    assert task_accuracy(Echo(), Task()) == {"accuracy": 3 / 5, "pairs=2": 1 / 2, "pairs=4": 1 / 2}


def test_block_losses_are_the_mean_window_loss_of_consecutive_runs_of_full_windows(model_and_corpus):
    from attnlab.evaluate import block_losses

    model, corpus = model_and_corpus
    val = torch.from_numpy(corpus.split("val").astype("int64"))  # 50 tokens: 6 full windows of 8 and a tail
    windows = [F.cross_entropy(model(val[None, w * 8 : (w + 1) * 8])[0][0], val[w * 8 + 1 : (w + 1) * 8 + 1]).item()
               for w in range(6)]
    blocks = block_losses(model, corpus, "val", 8, None, blocks=4, chunk=4)  # windows 2, 2, 1, 1 (tensor_split)
    expected = [sum(windows[0:2]) / 2, sum(windows[2:4]) / 2, windows[4], windows[5]]
    assert blocks == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError, match="6 windows of 8, fewer than 7 blocks"):
        block_losses(model, corpus, "val", 8, None, blocks=7)
