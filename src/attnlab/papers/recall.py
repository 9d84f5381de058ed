"""Associative recall after zoology's protocol at a CPU's scale, for the suites whose papers claim something about
recall. MQAR is trained with early stopping (at most 8,000 steps), each model at the best of a learning-rate sweep
chosen on validation, at two (length, pairs) settings. Softmax attention is in every experiment: where it does not
reach ~100%, the task is not yet learned and says nothing about the others.

Where it differs from zoology's figure 2 (Arora et al. 2023): a vocabulary of 256, not 8,192; noise tokens between
the queries (random_non_queries, which the figure's configs turn off); one width (d_model 64, where zoology sweeps 64
to 512) and batches of 64, not 512; three learning rates (1e-3, 3e-3, 1e-2) where zoology sweeps four (1e-4 to 1e-2);
64 tokens with 4 and 16 pairs, where the figure trains 64, 128 and 256 tokens with 4, 8 and 16.

The suites share these models: one that a suite beside it trained with the same config is measured again,
not trained again."""

from __future__ import annotations

from ..lab.claims import Claim
from ..lab.spec import Arm, Changes, Experiment

SETTINGS = [(64, 4), (64, 16)]  # (tokens, key-value pairs): the small setting and one with 4x the pairs
LRS = [1e-3, 3e-3, 1e-2]  # zoology sweeps four rates over 1e-4..1e-2; three over its upper part, to fit a CPU
# Blocks without the feed-forward part: recall is the mixers' work, and it halves the cost of a step.
# Compiled blocks: measured on one CPU thread, a step of most of these models is 1.3-1.95x faster (some break
# even; mixers with a compile_exclusion stay eager), for about a minute of compilation per run.
CONVERGE = Changes.model(ffn=False) | Changes.train(compile=True, steps=8000, eval_every=250, patience=8,
                                                   min_delta=0.001, ckpt_every=8000)


# softmax attention must learn the task (zoology's reaches ~100%) before the other arms' scores mean anything
LEARNED = ("softmax", "accuracy", 0.99)


def learned(experiment: str) -> Claim:
    """The precondition as a claim of its own: softmax attention reaches 99% on this setting."""
    return Claim(f"softmax attention learns MQAR ({experiment}: 99% or more, as zoology's does)", experiment,
                 "accuracy", "softmax", None, "higher", scale=100, reference=99)


def mqar(mixers: list[str], settings=SETTINGS) -> list[Experiment]:
    """One experiment per setting, an arm per mixer; the first mixer is the baseline."""
    return [
        Experiment(
            f"mqar-T{T}-kv{pairs}",
            f"MQAR, {T} tokens, {pairs} key-value pairs: test accuracy (converged, the best of {len(LRS)} "
            "learning rates on validation)",
            "accuracy",
            [Arm(m, "mqar", Changes.mixer(m) | Changes.train(seq_len=T)
                 | Changes.task("mqar", pairs=pairs, test_pairs=[pairs]) | CONVERGE) for m in mixers],
            mixers[0],
            lrs=LRS,
        )
        for T, pairs in settings
    ]
