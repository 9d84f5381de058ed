"""A paper kept outside attnlab, as a user would write one: a mixer, a metric and a suite with a claim, each
registered by this file alone (`attnlab --import tests/experiments/toy_paper.py reproduce toy`)."""

import sys

from attnlab.experiments import register_suite
from attnlab.experiments.claims import Claim
from attnlab.experiments.metrics import Metric, register_metric
from attnlab.experiments.spec import Arm, Experiment, Suite
from attnlab.inference import load_run
from attnlab.mixers import register_mixer
from attnlab.mixers.softmax import SoftmaxAttention

NAME = "toy"
TIERS = ("default",)
PROVENANCE = {"toy attention": "softmax attention under another name ([I]: a test of the registries)"}
TINY = ["train.steps=4", "train.batch_size=2", "train.eval_batches=1", "train.eval_every=2", "train.ckpt_every=4",
        "model.d_model=16", "model.n_layers=1", "data.max_chars=20000"]


@register_mixer("toy-attention")
class ToyAttention(SoftmaxAttention):
    """Softmax attention under another name: the toy paper's mechanism."""


def heads_per_layer(experiment, run_dir) -> dict:
    """The trained model's attention heads, at each of the experiment's lengths (a toy curve)."""
    heads = load_run(run_dir).config.model.n_heads
    return {f"heads@{n}": float(heads * n) for n in experiment.lengths}


register_metric(Metric("toy_heads", heads_per_layer))


def suite(tier: str = "default") -> Suite:
    arms = [Arm("softmax", "demo", [*TINY, "model.mixer=softmax"]),
            Arm("toy", "demo", [*TINY, "model.mixer=toy-attention"])]
    experiments = [Experiment("lm", "The toy LM", "val_ppl", arms, "softmax", {"toy": "5.0"}),
                   Experiment("heads", "Heads", "toy_heads", arms, "softmax", lengths=[1, 2])]
    claim = Claim("toy attention is as good as softmax", "lm", "val_ppl", "toy", "softmax", "lower", -0.01,
                  relative=True, headline=True)
    return Suite(NAME, "A toy paper", experiments, seeds=1, claims=[claim])


register_suite(sys.modules[__name__])
