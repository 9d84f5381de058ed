"""A paper kept outside attnlab, as a user would write one: a mixer, a metric, a task, a bench case and a suite
with a claim, each registered by this file alone (`attnlab --import tests/experiments/toy_paper.py reproduce toy`,
`... bench --toy`)."""

from functools import partial

import torch

from attnlab.bench.registry import BenchCase
from attnlab.data import Task, register_task
from attnlab.data.examples import FixedExamples
from attnlab.data.tokenizer import IdTokenizer
from attnlab.inference import load_run
from attnlab.lab.claims import Claim
from attnlab.lab.metrics import Metric
from attnlab.lab.spec import Arm, Changes, Experiment, Suite
from attnlab.mixers import register_mixer
from attnlab.mixers.softmax import SoftmaxAttention
from attnlab.papers import Paper, register_paper

NAME = "toy"
TIERS = ("default",)
PROVENANCE = {"toy attention": "softmax attention under another name ([I]: a test of the registries)"}
TINY = (Changes.train(steps=4, batch_size=2, eval_batches=1, eval_every=2, ckpt_every=4)
        | Changes.model(d_model=16, n_layers=1) | Changes.data(max_chars=20000))


@register_mixer("toy-attention")
class ToyAttention(SoftmaxAttention):
    """Softmax attention under another name: the toy paper's mechanism."""


def heads_per_layer(experiment, run_dir) -> dict:
    """The trained model's attention heads, at each of the experiment's lengths (a toy curve)."""
    heads = load_run(run_dir).config.model.n_heads
    return {f"heads@{n}": float(heads * n) for n in experiment.lengths}


HEADS = Metric("toy_heads", heads_per_layer)


class CopyData(FixedExamples):
    """The toy task: random tokens, then the same tokens again; only the copy is scored."""

    vocab_size = 16

    def __init__(self, seq_len: int):
        self.seq_len, self.tokenizer = seq_len, IdTokenizer(self.vocab_size)
        self.train, self.val, self.test = (self._examples(64, seed) for seed in (0, 1, 2))

    def _examples(self, n: int, seed: int):
        half = torch.randint(self.vocab_size, (n, self.seq_len // 2 + 1), generator=torch.Generator().manual_seed(seed))
        tokens = torch.cat([half, half], dim=1)[:, : self.seq_len + 1]
        targets = tokens[:, 1:].clone()
        targets[:, : self.seq_len // 2] = -100  # the first half is unpredictable
        return tokens[:, :-1], targets

    def describe(self) -> str:
        return f"toy copying: 64 sequences of {self.seq_len} tokens"


register_task(Task("toy-copy", lambda data_config, seq_len: CopyData(seq_len), vocab_size=lambda data_config: 16))


def bench_toy(length: int = 32, log=print) -> dict:
    """The toy mechanism's forward time against softmax's (the toy paper's bench case)."""
    from attnlab.mixers import build_mixer
    from attnlab.timing import round_robin

    x = torch.randn(1, length, 16)
    tasks = {name: partial(build_mixer(name, d_model=16, n_heads=2), x) for name in ("toy-attention", "softmax")}
    seconds = round_robin(tasks, 1)
    log(f"toy-attention / softmax at T={length}: {seconds['toy-attention'] / seconds['softmax']:.2f}x")
    return {"x_softmax": seconds["toy-attention"] / seconds["softmax"]}


BENCH = BenchCase("toy", "only the toy mechanism against softmax", bench_toy, settings={"quick": {"length": 16}},
                  goals=lambda results: [("toy / softmax forward (x)", results["x_softmax"], "<=", 100.0)])


def suite(tier: str = "default") -> Suite:
    arms = [Arm("softmax", "demo", TINY | Changes.mixer("softmax")),
            Arm("toy", "demo", TINY | Changes.mixer("toy-attention"))]
    copy = [Arm(arm.label, "demo", arm.changes | Changes.data(source="toy-copy", max_chars=None)) for arm in arms]
    experiments = [Experiment("lm", "The toy LM", "val_ppl", arms, "softmax", {"toy": "5.0"}),
                   Experiment("heads", "Heads", "toy_heads", arms, "softmax", lengths=[1, 2]),
                   Experiment("copy", "Copying", "accuracy", copy, "softmax")]
    claim = Claim("toy attention is as good as softmax", "lm", "val_ppl", "toy", "softmax", "lower", -0.01,
                  relative=True, headline=True)
    return Suite(NAME, "A toy paper", experiments, seeds=1, claims=[claim])


register_paper(Paper(NAME, TIERS, suite, PROVENANCE, metrics=(HEADS,), bench_cases=(BENCH,)))
