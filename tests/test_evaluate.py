import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab.config import ModelConfig
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
