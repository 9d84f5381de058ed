"""Bracket matching at the protocol of Kim & Park (2026, §3.3): Dyck-1 words interleaved with filler tokens.

Vocabulary of 12: 0 = "(", 1 = ")", 2..11 = fillers f0..f9. A sequence of T tokens holds p pairs
(p uniform in 1..T/2, or always T/2 when balanced) of a random well-nested bracket word, with T - 2p
fillers inserted at random places. At every closing bracket the target is the position (0..T-1) of its
matching opener, predicted by a pointer head over positions; other targets are -100.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .examples import TEST_SEED_OFFSET, VAL_SEED_OFFSET, FixedExamples, check_counts
from .tasks import Task, register_task
from .tokenizer import IdTokenizer

OPEN, CLOSE, FILLERS = 0, 1, 10
VOCAB_SIZE = 2 + FILLERS


@dataclass
class BracketsConfig:
    train_examples: int = 20_000
    test_examples: int = 2_000
    balanced: bool = False  # always T/2 pairs and no fillers
    seed: int = 0

    def validate(self) -> None:
        check_counts("brackets", self, "train_examples", "test_examples")


def dyck_word(pairs: int, rng: np.random.Generator) -> list[int]:
    """A random well-nested word of `pairs` opening and closing brackets."""
    word, depth, opens_left = [], 0, pairs
    while opens_left or depth:
        # open with probability proportional to the openers left, never close below depth 0
        if opens_left and (depth == 0 or rng.random() < opens_left / (opens_left + depth)):
            word.append(OPEN)
            opens_left, depth = opens_left - 1, depth + 1
        else:
            word.append(CLOSE)
            depth -= 1
    return word


def matching_targets(tokens: list[int]) -> list[int]:
    """For each closing bracket the position of its opener (a stack), -100 elsewhere."""
    stack, targets = [], []
    for i, token in enumerate(tokens):
        if token == OPEN:
            stack.append(i)
        targets.append(stack.pop() if token == CLOSE else -100)
    return targets


def generate(n: int, seq_len: int, balanced: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    inputs, targets = [], []
    for _ in range(n):
        pairs = seq_len // 2 if balanced else int(rng.integers(1, seq_len // 2 + 1))
        word = dyck_word(pairs, rng)
        filler_slots = set(rng.choice(seq_len, size=seq_len - 2 * pairs, replace=False).tolist())
        letters = iter(word)
        tokens = [int(2 + rng.integers(FILLERS)) if i in filler_slots else next(letters) for i in range(seq_len)]
        inputs.append(tokens)
        targets.append(matching_targets(tokens))
    return torch.tensor(inputs), torch.tensor(targets)


class BracketData(FixedExamples):
    kind = "brackets"
    vocab_size = VOCAB_SIZE

    def __init__(self, cfg: BracketsConfig, seq_len: int):
        self.cfg, self.seq_len = cfg, seq_len
        self.output_size = seq_len  # the pointer head scores every position
        self.train = generate(cfg.train_examples, seq_len, cfg.balanced, cfg.seed)
        self.val = generate(cfg.test_examples, seq_len, cfg.balanced, VAL_SEED_OFFSET + cfg.seed)
        self.test = generate(cfg.test_examples, seq_len, cfg.balanced, TEST_SEED_OFFSET + cfg.seed)

    def describe(self) -> str:
        return f"bracket matching: {len(self.train[0]):,} training sequences of {self.seq_len} tokens, vocabulary 12"


def load(cfg: BracketsConfig, seq_len: int) -> BracketData:
    data = BracketData(cfg, seq_len)
    data.tokenizer = IdTokenizer(data.vocab_size)
    return data


register_task(Task("brackets", load, BracketsConfig,
                   needs="a run trained on data.source=brackets (attnlab train brackets)",
                   tests=lambda cfg, seq_len: [(cfg.test_examples, seq_len)]))
