"""Multi-query associative recall (MQAR), with the semantics of zoology's generator (Arora et al. 2023).

A sequence of T tokens starts with P key-value pairs k1 v1 k2 v2 ... (keys drawn without replacement
from [1, V/2), values from [V/2, V)); each key appears once more later, at a gap drawn with probability
proportional to power_a * i^(power_a - 1) over the even slots of the remaining space, and the model
must emit its value as the next token. Only those positions are scored (targets elsewhere are -100).
Other positions hold 0, or random tokens with random_non_queries. Train, validation and test examples come
from the seeds seed, 2^30 + seed and 2^31 + seed (+ i for the i-th test pair count), so the splits never
share a generator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import ConfigError
from .examples import TEST_SEED_OFFSET, VAL_SEED_OFFSET, FixedExamples, check_counts
from .tasks import Floor, Task, register_task
from .tokenizer import IdTokenizer


@dataclass
class MQARConfig:
    vocab_size: int = 256  # zoology's figure 2 uses 8192
    pairs: int = 4  # key-value pairs per training sequence
    test_pairs: list[int] = field(default_factory=list)  # pair counts of the test set (default: pairs)
    power_a: float = 0.01
    random_non_queries: bool = True
    train_examples: int = 20_000
    test_examples: int = 1_000  # per pair count
    seed: int = 0

    def validate(self) -> None:
        check_counts("mqar", self, "train_examples", "test_examples")

    def check_length(self, seq_len: int) -> None:
        """The sequences of seq_len tokens hold every pair count and the vocabulary every key and value."""
        if seq_len % 2:
            raise ConfigError(f"MQAR needs an even train.seq_len, got {seq_len}")
        if self.vocab_size <= seq_len:
            raise ConfigError(f"data.task_options.mqar.vocab_size={self.vocab_size} must exceed "
                              f"train.seq_len={seq_len}")
        for pairs in [self.pairs, *self.test_pairs]:
            if pairs < 1 or 4 * pairs > seq_len:
                raise ConfigError(f"MQAR with {pairs} pairs needs 4 * pairs <= train.seq_len={seq_len}: "
                                  f"lower the pairs or raise seq_len to {4 * max(pairs, 1)}")
            if pairs >= self.vocab_size // 2:
                raise ConfigError(f"{pairs} distinct keys do not fit in "
                                  f"data.task_options.mqar.vocab_size={self.vocab_size}")


def generate(n: int, seq_len: int, pairs: int, vocab_size: int, power_a: float, random_non_queries: bool,
             seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n examples: inputs [n, seq_len] and targets [n, seq_len] (value ids at query positions, else -100)."""
    rng = np.random.default_rng(seed)
    half = vocab_size // 2
    keys = np.stack([rng.choice(np.arange(1, half), size=pairs, replace=False) for _ in range(n)])
    values = np.stack([rng.choice(np.arange(half, vocab_size), size=pairs, replace=False) for _ in range(n)])
    context = 2 * pairs
    space = (seq_len - context) // 2
    weights = power_a * np.arange(1, space + 1) ** (power_a - 1)
    gaps = np.stack([rng.choice(space, size=pairs, replace=False, p=weights / weights.sum()) for _ in range(n)])

    sequence = np.zeros((n, seq_len + 1), dtype=np.int64)
    sequence[:, 0:context:2], sequence[:, 1:context:2] = keys, values
    query_at = context + 2 * gaps  # the key reappears here; its value is the next token
    np.put_along_axis(sequence, query_at, keys, axis=1)
    labels = np.full((n, seq_len + 1), -100, dtype=np.int64)
    np.put_along_axis(labels, query_at + 1, values, axis=1)
    inputs, targets = torch.from_numpy(sequence[:, :-1].copy()), torch.from_numpy(labels[:, 1:].copy())
    if random_non_queries:
        noise = torch.from_numpy(rng.integers(0, vocab_size, size=inputs.shape))
        inputs = torch.where(inputs == 0, noise, inputs)
    return inputs, targets


class MQARData(FixedExamples):
    """Fixed train and test sets; batches are sampled from them. ``slices`` gives the test examples per
    pair count, so accuracy can be reported as a function of the number of pairs."""

    kind = "mqar"
    slice_label = "pairs={}"

    def __init__(self, cfg: MQARConfig, seq_len: int):
        cfg.validate()
        cfg.check_length(seq_len)
        self.cfg, self.seq_len = cfg, seq_len
        self.vocab_size = cfg.vocab_size
        self.train = generate(cfg.train_examples, seq_len, cfg.pairs, cfg.vocab_size, cfg.power_a,
                              cfg.random_non_queries, cfg.seed)
        self.val = generate(cfg.test_examples, seq_len, cfg.pairs, cfg.vocab_size, cfg.power_a,
                            cfg.random_non_queries, VAL_SEED_OFFSET + cfg.seed)
        self.slices = {}
        for i, pairs in enumerate(cfg.test_pairs or [cfg.pairs]):
            self.slices[pairs] = generate(cfg.test_examples, seq_len, pairs, cfg.vocab_size, cfg.power_a,
                                          cfg.random_non_queries, TEST_SEED_OFFSET + cfg.seed + i)
        self.test = tuple(torch.cat(parts) for parts in zip(*self.slices.values(), strict=True))

    def describe(self) -> str:
        return (f"MQAR: {len(self.train[0]):,} training sequences of {self.seq_len} tokens with {self.cfg.pairs} "
                f"pairs, vocabulary {self.vocab_size}")


def load(cfg: MQARConfig, seq_len: int) -> MQARData:
    data = MQARData(cfg, seq_len)
    data.tokenizer = IdTokenizer(data.vocab_size)
    return data


def floor(cfg: MQARConfig, key: str) -> Floor | None:
    """Copying a value of the context at random answers a query of P pairs right 1 time in P; the pooled accuracy
    weighs each test slice by its queries (P per example, as many examples each): sum_P P * (1/P) / sum_P P."""
    pairs = cfg.test_pairs or [cfg.pairs]
    if key == "accuracy":
        return Floor(len(pairs) / sum(pairs), "copying a value from the context")
    if key.startswith("pairs=") and int(key.removeprefix("pairs=")) in pairs:
        return Floor(1 / int(key.removeprefix("pairs=")), "copying a value from the context")
    return None


def tests(cfg: MQARConfig, seq_len: int) -> list[tuple[int, int]]:
    """(examples, length) of the test set (every slice's examples together), then of each pair count's slice."""
    slices = [(cfg.test_examples, seq_len) for _ in cfg.test_pairs or [cfg.pairs]]
    return [(cfg.test_examples * len(slices), seq_len), *slices]


register_task(Task("mqar", load, MQARConfig, vocab_size=lambda cfg: cfg.vocab_size,
                   needs="a run trained on data.source=mqar (e.g. attnlab train mqar)", floor=floor, tests=tests))
