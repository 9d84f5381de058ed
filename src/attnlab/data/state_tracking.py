"""State tracking: word problems of a finite group, the field's test of what a recurrent state can hold.

A sequence is T elements g_1 .. g_T of a group, drawn uniformly; the target at every position t is the prefix
product s_t = g_1 g_2 ... g_t (an element too, so inputs and targets share one vocabulary of |G| ids). Every
position is scored: the accuracy is per token. Four groups are registered as tasks:

- `parity`: Z_2, the prefix sum mod 2 of bits;
- `modular`: Z_m, the prefix sum mod m (`modulus`, default 5);
- `s5`: the 120 permutations of 5 items, composed (not solvable: no fixed-depth circuit of the TC0 kind is known
  to track it, Merrill et al. 2024);
- `a5`: its 60 even permutations (the smallest non-solvable group).

A model trains at one length (train.seq_len) and is tested there and at `test_lengths` times it: a mechanism
whose state truly tracks the group holds its accuracy at every length (Grazzi et al. 2025: DeltaNet with negative
eigenvalues on parity), one that learned a length-bound shortcut falls towards chance (1/|G|). The validation set
(early stopping, learning-rate choice) and the test sets are drawn with seeds of their own.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from ..errors import ConfigError
from .examples import TEST_SEED_OFFSET, VAL_SEED_OFFSET, FixedExamples, check_counts
from .tasks import Floor, Task, register_task
from .tokenizer import IdTokenizer


@dataclass
class WordProblemConfig:
    """The settings every word problem shares; a subclass per group names its task and builds its table."""

    task: ClassVar[str] = ""
    train_examples: int = 20_000
    test_examples: int = 500  # per test length, and in the validation set
    test_lengths: list[int] = field(default_factory=lambda: [2, 4, 8])  # multiples of train.seq_len tested beside it
    seed: int = 0

    def validate(self) -> None:
        check_counts(self.task, self, "train_examples", "test_examples")
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.test_lengths):
            raise ConfigError(f"data.task_options.{self.task}.test_lengths={self.test_lengths} must be whole "
                              "multiples of the training length, each at least 1, e.g. [2, 4, 8]")

    def table(self) -> np.ndarray:
        """The group's multiplication table [|G|, |G|] of element ids."""
        raise NotImplementedError

    def order(self) -> int:
        """|G|: the vocabulary of inputs and targets alike."""
        return len(self.table())


@dataclass
class ParityConfig(WordProblemConfig):
    task: ClassVar[str] = "parity"

    def table(self) -> np.ndarray:
        return cyclic(2)


@dataclass
class ModularConfig(WordProblemConfig):
    task: ClassVar[str] = "modular"
    modulus: int = 5

    def validate(self) -> None:
        super().validate()
        if self.modulus < 2:
            raise ConfigError(f"data.task_options.modular.modulus={self.modulus} must be at least 2: addition mod "
                              f"{self.modulus} has one state and nothing to track")

    def table(self) -> np.ndarray:
        return cyclic(self.modulus)


@dataclass
class S5Config(WordProblemConfig):
    task: ClassVar[str] = "s5"

    def table(self) -> np.ndarray:
        return permutations(5)

    def order(self) -> int:
        return 120


@dataclass
class A5Config(WordProblemConfig):
    task: ClassVar[str] = "a5"

    def table(self) -> np.ndarray:
        return permutations(5, even_only=True)

    def order(self) -> int:
        return 60


def cyclic(m: int) -> np.ndarray:
    """The multiplication table of Z_m: table[a, b] = (a + b) mod m."""
    return (np.arange(m)[:, None] + np.arange(m)[None, :]) % m


def permutations(n: int, even_only: bool = False) -> np.ndarray:
    """The multiplication table of S_n (or A_n): element ids index the permutations of range(n) in lexicographic
    order (of A_n, its even ones), and table[a, b] is a then b: (a b)(i) = b(a(i))."""
    perms = [p for p in itertools.permutations(range(n)) if not even_only or _is_even(p)]
    index = {p: i for i, p in enumerate(perms)}
    return np.array([[index[tuple(b[a[i]] for i in range(n))] for b in perms] for a in perms])


def _is_even(p: tuple[int, ...]) -> bool:
    inversions = sum(p[i] > p[j] for i in range(len(p)) for j in range(i + 1, len(p)))
    return inversions % 2 == 0


def generate(table: np.ndarray, n: int, seq_len: int, seed: int, apart_from: set[bytes] = frozenset()
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """n words of seq_len uniform elements, none of them in apart_from (words as bytes of int64), and their
    prefix products: (inputs, targets), each [n, seq_len]; fewer words where DRAWS rounds of n find no more."""
    rng = np.random.default_rng(seed)
    words = np.empty((0, seq_len), dtype=np.int64)
    for _ in range(DRAWS):
        drawn = rng.integers(len(table), size=(n, seq_len))
        words = np.concatenate([words, drawn[[w.tobytes() not in apart_from for w in drawn]]])[:n]
        if len(words) == n:
            break
    return torch.from_numpy(words), torch.from_numpy(prefix_products(table, words))


DRAWS = 20  # rounds of n words a held-out set draws at most while words apart from the training words are rare


def prefix_products(table: np.ndarray, words: np.ndarray) -> np.ndarray:
    """s_t = g_1 ... g_t for every position of each word [n, T], through the multiplication table."""
    states = np.empty_like(words)
    states[:, 0] = words[:, 0]
    for t in range(1, words.shape[1]):
        states[:, t] = table[states[:, t - 1], words[:, t]]
    return states


class WordProblem(FixedExamples):
    """Fixed training, validation and test sets at the training length, and a test set at each of the longer
    lengths (`slices`, reported beside the accuracy at the training length)."""

    slice_label = "length={}x"

    def __init__(self, cfg: WordProblemConfig, seq_len: int):
        cfg.validate()
        table = cfg.table()
        self.cfg, self.seq_len, self.vocab_size = cfg, seq_len, len(table)
        self.train = generate(table, cfg.train_examples, seq_len, cfg.seed)
        # held out at the training length: no validation or test word is a training word, nor a test word a
        # validation one (short words of a small group would otherwise recur and score memory, not tracking)
        seen = {w.numpy().tobytes() for w in self.train[0]}
        self.val = generate(table, cfg.test_examples, seq_len, VAL_SEED_OFFSET + cfg.seed, seen)
        seen |= {w.numpy().tobytes() for w in self.val[0]}
        self.test = generate(table, cfg.test_examples, seq_len, TEST_SEED_OFFSET + cfg.seed, seen)
        if min(len(self.val[0]), len(self.test[0])) < cfg.test_examples:
            raise ConfigError(f"{cfg.task} has too few distinct words of {seq_len} elements to hold out "
                              f"{cfg.test_examples} apart from the {cfg.train_examples:,} training words; raise "
                              f"train.seq_len or lower data.task_options.{cfg.task}.train_examples or test_examples")
        self.slices = {k: generate(table, cfg.test_examples, k * seq_len, TEST_SEED_OFFSET + cfg.seed + k)
                       for k in cfg.test_lengths if k != 1}
        self.tokenizer = IdTokenizer(self.vocab_size)

    def describe(self) -> str:
        longer = ", ".join(f"{k}x" for k in self.slices)
        return (f"{self.cfg.task}: {len(self.train[0]):,} training words of {self.seq_len} elements of a group of "
                f"{self.vocab_size}" + (f", tested also at {longer} the length" if longer else ""))


def floor(cfg, key: str) -> Floor:
    """Guessing an element of the group at every position: right 1 time in |G| (parity: 1 in 2), at any length."""
    return Floor(1 / cfg.order(), f"guessing one of the group's {cfg.order()} elements")


def tests(cfg: WordProblemConfig, seq_len: int) -> list[tuple[int, int]]:
    """(examples, length) of the test set at the training length, then of each longer one."""
    return [(cfg.test_examples, seq_len), *((cfg.test_examples, k * seq_len) for k in cfg.test_lengths if k != 1)]


for _options in (ParityConfig, ModularConfig, S5Config, A5Config):
    register_task(Task(_options.task, WordProblem, _options, vocab_size=lambda cfg: cfg.order(),
                       needs=f"a run trained on data.source={_options.task}", floor=floor, tests=tests))
