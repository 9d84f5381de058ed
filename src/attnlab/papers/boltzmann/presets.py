"""The Boltzmann attention paper's presets: its language model and bracket matching, with the paper's block. The
block has learned absolute positions instead of RoPE, for softmax too. Each imports the config when called (see
attnlab.presets)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...config import RunConfig

WINDOW = 12  # T: train.seq_len and the mixer's window together


def boltzmann_char() -> RunConfig:
    """The paper's language model: the first 100K characters of Shakespeare (90/10), one layer, one head,
    d_model 64, feed-forward width 128, a window of T characters, AdamW with lr 1e-3 and a separate lr 3e-5 /
    weight decay 0.01 for J."""
    from ...config import DataConfig, ModelConfig, RunConfig, TrainConfig

    return RunConfig(
        name="boltzmann-char",
        model=ModelConfig(mixer="boltzmann", d_model=64, n_layers=1, n_heads=1, ffn_hidden=128, positions=WINDOW,
                          mixer_options={"boltzmann": {"window": WINDOW, "j_lr": 3.0e-5, "j_weight_decay": 0.01,
                                                       "rope": False},
                                         "softmax": {"rope": False}}),
        data=DataConfig(source="shakespeare", max_chars=100000),
        train=TrainConfig(steps=1500, batch_size=64, seq_len=WINDOW, lr=1.0e-3, min_lr=1.0e-3, warmup_steps=0,
                          weight_decay=0.01, eval_every=500, ckpt_every=1500),
    )


def brackets() -> RunConfig:
    """Bracket matching as in the paper: T = 12, vocabulary 12, one layer, one head, d_model 32, a pointer head
    over positions. Test accuracy: attnlab eval runs/brackets --task brackets"""
    from ...config import DataConfig, ModelConfig, RunConfig, TrainConfig

    return RunConfig(
        name="brackets",
        model=ModelConfig(mixer="boltzmann", d_model=32, n_layers=1, n_heads=1, positions=WINDOW,
                          mixer_options={"boltzmann": {"window": WINDOW, "j_lr": 1.0e-4, "j_weight_decay": 0.01,
                                                       "rope": False},
                                         "softmax": {"rope": False}}),
        data=DataConfig(source="brackets"),
        train=TrainConfig(steps=3000, batch_size=64, seq_len=WINDOW, lr=3.0e-4, min_lr=3.0e-4, warmup_steps=0,
                          weight_decay=0.01, eval_every=500, ckpt_every=1500),
    )


PRESETS = {"boltzmann-char": boltzmann_char, "brackets": brackets}
