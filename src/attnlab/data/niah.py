"""Single-needle retrieval (S-NIAH, after RULER): a value hidden in a haystack, which the model generates after a
question. The value is a "special magic" value for a key, hidden at a chosen depth.

Kinds, as RULER names them: passkey (S-NIAH-1: a 7-digit number in a repeated noise sentence), number (S-NIAH-2: a
7-digit number in prose), uuid (S-NIAH-3: a uuid in prose) and multikey (MK-NIAH-1: several needles of 7-digit
numbers under different keys in prose, one of them asked for; the others sit at random sentence boundaries). Prose
is Shakespeare's plays or Python's documentation, which every machine has.
Samples are assembled in token space, so their length is exact for any tokenizer; the needle goes to
the sentence boundary nearest to the requested depth. Accuracy is the exact match of the greedy answer.

A test "at L tokens" is a sequence of L tokens, as a training sequence is: the prompt and the answer but its
last token (which is generated, never read). So at the training length the model reads no position it was not
trained on; with the prompt alone at L, the answer would run len(answer) - 1 positions past it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np
import torch

from ..errors import ConfigError, UserError
from ..typed import check_choices
from .examples import TEST_SEED_OFFSET, VAL_SEED_OFFSET, FixedExamples, check_counts
from .tasks import Floor, Task, register_task, trained_on_text
from .texts import python_docs_text, source_text
from .tokenizer import CharTokenizer

Kind = Literal["passkey", "number", "uuid", "multikey"]
KINDS = get_args(Kind)
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
ADJECTIVES = ["quiet", "bright", "hollow", "amber", "gentle", "wild", "silver", "crooked", "ancient", "swift"]
NOUNS = ["river", "lantern", "meadow", "falcon", "harbor", "orchard", "thistle", "compass", "ember", "willow"]
VALUE_SHAPES = {"passkey": "0123456", "number": "0123456", "multikey": "0123456",
                "uuid": "01234567-89ab-cdef-0123-456789abcdef"}  # lengths


@dataclass
class NIAHConfig:
    kind: Kind = "passkey"
    prose: Literal["plays", "docs"] = "plays"  # haystack for number, uuid and multikey
    keys: int = 4  # multikey: needles in the haystack, each under its own key, one of them asked for
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    train_examples: int = 5_000  # when training on the task (data.source=niah)
    test_per_depth: int = 20
    seed: int = 0

    def validate(self) -> None:
        check_choices(self, "data.task_options.niah")
        check_counts("niah", self, "train_examples", "test_per_depth")
        check_keys(self.keys, "data.task_options.niah.keys")
        if not self.depths or any(not 0.0 <= d <= 1.0 for d in self.depths):
            raise ConfigError(f"data.task_options.niah.depths={self.depths} must be fractions between 0 and 1")


@dataclass
class NIAHEval:
    """The settings of `attnlab eval --task niah`, from its flags of the same names."""

    kind: Kind | None = None  # the needle; None: the run's own where it trained on niah, else passkey
    keys: int | None = None  # multikey: needles in the haystack; None: the run's own where it trained on niah, else 4
    samples: int = 10  # prompts per depth
    lengths: list[int] | None = None  # context lengths in tokens; None: the training length and twice it


@dataclass
class Sample:
    prompt: list[int]  # with the answer but its last token, exactly the requested length
    answer: list[int]
    needle_at: int  # token index where the needle starts
    depth: float


MAX_KEYS = len(ADJECTIVES) * len(NOUNS)  # distinct keys there are


def check_keys(keys: int, field: str) -> None:
    if not 1 <= keys <= MAX_KEYS:
        raise ConfigError(f"{field}={keys} must be between 1 and {MAX_KEYS} (the distinct keys there are)")


def _needle(kind: str, key: str, value: str, encode) -> list[int]:
    noun = "uuid" if kind == "uuid" else "number"
    return list(encode(f" The special magic {noun} for {key} is: {value}. "))


def _question(kind: str, key: str, encode) -> list[int]:
    noun = "uuid" if kind == "uuid" else "number"
    return list(encode(f"\nWhat is the special magic {noun} for {key}? Answer: "))


def shortest_length(kind: str, encode, keys: int = 1) -> int:
    """Tokens of the longest needles and question of this kind and of its answer but the last: a sample needs
    at least as many. Exact for character and byte tokenizers; with BPE a value may take a token more or fewer
    than the one encoded here (make_sample states each sample's own need). Encoding them, every digit a value
    may hold and the passkey's noise also checks that the vocabulary has their characters."""
    key = f"{max(ADJECTIVES, key=len)}-{max(NOUNS, key=len)}"
    encode("0123456789" + (NOISE if kind == "passkey" else ""))  # the uuid's shape has the other hex digits
    needles = _needle(kind, key, VALUE_SHAPES[kind], encode) * _needles(kind, keys)
    return _fixed_tokens(needles, _question(kind, key, encode), encode(VALUE_SHAPES[kind]))


def _needles(kind: str, keys: int) -> int:
    return keys if kind == "multikey" else 1


def _fixed_tokens(needles, question, answer) -> int:
    """The tokens of a sample besides its haystack: needles, question and the answer but its last token."""
    return len(needles) + len(question) + len(answer) - 1


def default_lengths(seq_len: int, shortest: int) -> list[int]:
    """The training length and twice it; when that cannot hold a sample (shortest tokens: needle, question and
    answer), the shortest length rounded up to a multiple of 32 and twice that."""
    first = seq_len if seq_len >= shortest else -(-shortest // 32) * 32
    return [first, 2 * first]


def make_sample(kind: str, length: int, depth: float, rng: np.random.Generator, haystack: str, encode,
                keys: int = 1) -> Sample:
    """One sample of exactly `length` tokens (its prompt and its answer but the last token) with the needle asked
    for nearest to `depth` of the haystack (multikey: and keys - 1 more, under other keys, at random depths)."""
    key = f"{ADJECTIVES[rng.integers(len(ADJECTIVES))]}-{NOUNS[rng.integers(len(NOUNS))]}"
    value = _value(kind, rng)
    needle, question = _needle(kind, key, value, encode), _question(kind, key, encode)
    answer = [int(t) for t in encode(value)]
    others = []  # (depth, needle) of the keys not asked for
    if kind == "multikey":
        for other in rng.choice([k for k in range(MAX_KEYS) if k != _key_index(key)], keys - 1, replace=False):
            name = f"{ADJECTIVES[other // len(NOUNS)]}-{NOUNS[other % len(NOUNS)]}"
            others.append((float(rng.random()), _needle(kind, name, _value(kind, rng), encode)))
    least = _fixed_tokens(needle + [t for _, n in others for t in n], question, answer)
    if length < least:
        raise ConfigError(f"a needle-in-a-haystack sample needs at least {least} tokens; length {length} is too short")
    room = length - least
    text = NOISE * (room // len(NOISE) + 2) if kind == "passkey" else haystack
    start = int(rng.integers(0, max(1, len(text) - 4 * room)))  # enough characters for any tokenizer
    hay = list(encode(text[start : start + 4 * room + 64]))[:room]
    if len(hay) < room:
        raise ConfigError(f"the haystack text is too short for a {length}-token sample")
    at = _sentence_boundary(hay, round(depth * room), encode)
    placed = sorted([(at, 0, needle)] + [(_sentence_boundary(hay, round(d * room), encode), 1, n) for d, n in others],
                    key=lambda p: (p[0], p[1]))  # the needle asked for first where two share a boundary
    prompt, cut, needle_at = [], 0, 0
    for position, asked, tokens in placed:
        prompt += hay[cut:position]
        needle_at = len(prompt) if asked == 0 else needle_at
        prompt += tokens
        cut = position
    prompt += hay[cut:] + question
    return Sample([int(t) for t in prompt], answer, needle_at, depth)


def _value(kind: str, rng: np.random.Generator) -> str:
    if kind == "uuid":
        digits = "".join(f"{x:x}" for x in rng.integers(16, size=32))
        return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"
    return str(rng.integers(1_000_000, 10_000_000))


def _key_index(key: str) -> int:
    adjective, noun = key.split("-")
    return ADJECTIVES.index(adjective) * len(NOUNS) + NOUNS.index(noun)


def _sentence_boundary(tokens: list[int], position: int, encode, reach: int = 64) -> int:
    """The start of the haystack, its end, or the position just after a sentence end (". "), whichever
    is nearest to `position` within `reach` tokens; `position` itself if there is none."""
    period, space = encode(".")[0], encode(" ")[0]

    def is_boundary(i):
        return i in (0, len(tokens)) or (1 < i < len(tokens) and tokens[i - 2] == period and tokens[i - 1] == space)

    for offset in range(reach + 1):
        for candidate in (position - offset, position + offset):
            if 0 <= candidate <= len(tokens) and is_boundary(candidate):
                return candidate
    return position


class NIAHData(FixedExamples):
    """Training sequences (prompt + answer, loss on the answer only) and a test grid over depths."""

    kind = "niah"

    def __init__(self, cfg: NIAHConfig, seq_len: int, haystacks: dict[str, str], tokenizer):
        cfg.validate()
        need = shortest_length(cfg.kind, tokenizer.encode, cfg.keys)
        if seq_len < need:
            raise ConfigError(f"train.seq_len={seq_len} is too short for data.task_options.niah.kind={cfg.kind}: its "
                              f"sequences need at least {need} tokens; raise train.seq_len")
        self.cfg, self.seq_len, self.tokenizer = cfg, seq_len, tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.haystacks = haystacks  # {"train": text, "val": text}
        self.train = self._sequences(cfg.train_examples, seq_len, "train", cfg.seed, None)
        held_out = cfg.test_per_depth * len(cfg.depths)  # both from the validation text
        self.val = self._sequences(held_out, seq_len, "val", VAL_SEED_OFFSET + cfg.seed, cfg.depths)
        self.test = self._sequences(held_out, seq_len, "val",
                                    TEST_SEED_OFFSET + cfg.seed, cfg.depths)

    def samples(self, n: int, length: int, split: str, seed: int, depths=None) -> list[Sample]:
        rng = np.random.default_rng(seed)
        grid = depths or [None]
        return [make_sample(self.cfg.kind, length, grid[i % len(grid)] if depths else float(rng.random()), rng,
                            self.haystacks[split], self.tokenizer.encode, self.cfg.keys) for i in range(n)]

    def _sequences(self, n, seq_len, split, seed, depths):
        """Sequences of seq_len tokens ending with the answer; targets are the answer tokens only."""
        inputs, targets = [], []
        for s in self.samples(n, seq_len, split, seed, depths):
            tokens = s.prompt + s.answer
            labels = [-100] * (len(s.prompt) - 1) + s.answer + [-100]
            inputs.append(tokens[:-1])
            targets.append(labels[: len(tokens) - 1])
        return torch.tensor(inputs), torch.tensor(targets)

    def describe(self) -> str:
        return f"S-NIAH {self.cfg.kind}: {len(self.train[0]):,} training sequences of {self.seq_len} tokens"


@torch.no_grad()
def niah_accuracy(model, samples: list[Sample], device=None) -> dict[float, float]:
    """Exact-match accuracy of the greedy answer, by depth."""
    hits: dict[float, list[bool]] = {}
    model.eval()
    for s in samples:
        prompt = torch.tensor([s.prompt], device=device)
        out = model.generate(prompt, len(s.answer), temperature=0)[0, len(s.prompt) :].tolist()
        hits.setdefault(s.depth, []).append(out == s.answer)
    return {depth: sum(v) / len(v) for depth, v in sorted(hits.items())}


def accuracy_by_length(model, encode, haystack: str, kind: str, lengths, per_depth: int, depths,
                       device=None, keys: int = 1) -> dict[int, dict[float, float]]:
    """{length: {depth: accuracy}} on fresh samples of each length (the same test seed for every model): RULER's
    grid."""
    result = {}
    for length in lengths:
        rng = np.random.default_rng(TEST_SEED_OFFSET)
        samples = [make_sample(kind, length, depth, rng, haystack, encode, keys)
                   for depth in depths for _ in range(per_depth)]
        result[length] = niah_accuracy(model, samples, device)
    return result


def haystacks(prose: str):
    """Train/validation haystack text (first 90% / last 10%) and a character tokenizer covering it and
    every needle and question."""
    text = source_text("plays", 10**9) if prose == "plays" else python_docs_text()
    cut = int(len(text) * 0.9)
    extra = NOISE + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-:?.\n "
    return {"train": text[:cut], "val": text[cut:]}, CharTokenizer(text + extra)


def load(cfg: NIAHConfig, seq_len: int) -> NIAHData:
    texts, tokenizer = haystacks(cfg.prose)
    return NIAHData(cfg, seq_len, texts, tokenizer)


def evaluate_run(run, options: NIAHEval) -> None:
    """`attnlab eval --task niah`: accuracy by depth at each length (by default the training length and twice
    it), in held-out text (the run's validation split) or the task's own validation haystack. A run trained on
    niah is measured on its own needles (kind and keys) unless the flags ask for others."""
    own = run.config.data.task_config("niah") if run.config.data.source == "niah" else NIAHConfig()
    kind, keys, seq_len = options.kind or own.kind, options.keys or own.keys, run.config.train.seq_len
    check_keys(keys, "--keys")
    try:  # encoding the needle and question also checks that the vocabulary has their characters
        shortest = shortest_length(kind, run.tokenizer.encode, keys)
    except UserError as err:
        raise UserError(f"--task niah --kind {kind}: {err}; its prompts need a run trained on text that has them "
                        "(e.g. data.source=shakespeare) or on data.source=niah") from None
    lengths = options.lengths or default_lengths(seq_len, shortest)
    if options.lengths is None and lengths[0] != seq_len:
        print(f"note: a {kind} sample needs at least {shortest} tokens, more than train.seq_len={seq_len}; "
              f"measuring at {lengths[0]} and {lengths[1]} tokens")
    for length in lengths:
        if length < shortest:
            raise UserError(f"--lengths {length}: a {kind} sample needs at least {shortest} tokens for its needle, "
                            "question and answer; give longer --lengths")
    corpus = run.corpus()
    haystack = corpus.haystacks["val"] if run.config.data.source == "niah" else corpus.tokenizer.decode(
        corpus.split("val"))
    results = accuracy_by_length(run.model, run.tokenizer.encode, haystack, kind, lengths, options.samples,
                                 NIAHConfig().depths, run.device, keys)
    needles = f"{kind}, {keys} keys" if kind == "multikey" else kind
    for length, by_depth in results.items():
        cells = "  ".join(f"{d:.2f}: {100 * a:5.1f}%" for d, a in by_depth.items())
        print(f"S-NIAH {needles} at {length} tokens, accuracy by depth  {cells}")


def floor(cfg: NIAHConfig, key: str) -> Floor | None:
    """Multikey: answering with one of the haystack's needles at random is right 1 time in `keys`; the other kinds
    ask for the one needle there is, so that guessing its digits is the floor (10^-7 and less): none above 0."""
    return Floor(1 / cfg.keys, f"answering one of the {cfg.keys} needles") if cfg.kind == "multikey" else None


register_task(Task("niah", load, NIAHConfig, evaluate=evaluate_run, eval_options=NIAHEval,
                   fits=lambda run: trained_on_text(run) or run.config.data.source == "niah",
                   needs="a run trained on text or on data.source=niah", floor=floor))
