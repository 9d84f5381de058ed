"""The yardsticks' presets: a word problem and S-NIAH at zoology's small shape, and MQAR at one state budget. The
shape is the one zoology's recall studies use (2 layers, d_model 64); the budget is the same for every mixer
(`matched-<mixer>`). Each imports the config when called (see attnlab.presets)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...config import ModelConfig, RunConfig

# The matched family's budget: the bytes of state a sequence holds at the training length in the mqar preset's
# softmax attention (keys and values of 64 tokens, width 64, 2 layers, fp32). Every mixer gets the widest model
# whose state fits it, as zoology and Based compare recall at equal state, not at equal width.
STATE_BUDGET = 64 * 2**10
WIDTHS = tuple(range(16, 257, 8))  # the d_model a matched preset may take
# Boltzmann attention in its sliding form (couplings by distance, banded inference), which reads any length where
# the paper's window of 16 positions stops: the yardsticks' tasks are longer
SLIDING = {"boltzmann": {"couplings": "distance", "inference": "banded", "band": 2}}


def state_tracking() -> RunConfig:
    """Parity on a 2-core CPU: words of 16 bits, the running parity at every position as the target, tested at 2x,
    4x and 8x the length. data.source=s5 | a5 | modular runs the other word problems on the same model."""
    from ...config import DataConfig, ModelConfig, RunConfig, TrainConfig

    return RunConfig(
        name="state-tracking",
        model=ModelConfig(mixer="softmax", d_model=64, n_layers=2, n_heads=2),
        data=DataConfig(source="parity"),
        train=TrainConfig(steps=1500, batch_size=64, seq_len=16, lr=3.0e-3, min_lr=1.0e-4, warmup_steps=200,
                          weight_decay=0.1, eval_every=500, eval_batches=8, ckpt_every=1500),
    )


def retrieval() -> RunConfig:
    """S-NIAH on a 2-core CPU at RULER's shortest scale: 512 characters, the needle at five depths, tested at 1x,
    2x and 4x the length. data.task_options.niah.kind=number | uuid | multikey gives RULER's other variants."""
    from ...config import DataConfig, ModelConfig, RunConfig, TrainConfig

    return RunConfig(
        name="retrieval",
        model=ModelConfig(mixer="softmax", d_model=64, n_layers=2, n_heads=2),
        data=DataConfig(source="niah", task_options={"niah": {"train_examples": 20000, "test_per_depth": 10}}),
        train=TrainConfig(steps=1500, batch_size=32, seq_len=512, lr=3.0e-3, min_lr=1.0e-4, warmup_steps=200,
                          eval_every=500, eval_batches=8, ckpt_every=1500),
    )


def state_bytes(model: ModelConfig, seq_len: int) -> int:
    """The bytes of state a sequence holds after seq_len tokens in a model of this config, fp32 (Mixer.state_size
    of every layer's mixer, built alone)."""
    from ...mixers import mixer_class

    return 4 * sum(mixer_class(model.mixer)(model.mixer_config(model.mixer, layer)).state_size(seq_len)
                   for layer in range(model.n_layers))


def matched(mixer: str) -> Callable[[], RunConfig]:
    """The preset `matched-<mixer>`: the mqar preset with this mixer (Boltzmann attention sliding) at the widest
    d_model of WIDTHS (16 to 256 in steps of 8) whose state at the training length fits STATE_BUDGET."""

    def build() -> RunConfig:
        from dataclasses import replace

        from ...errors import ConfigError
        from ..presets import mqar

        base = mqar()
        model = replace(base.model, mixer=mixer, mixer_options={mixer: dict(SLIDING.get(mixer, {}))})
        widths = [w for w in WIDTHS if state_bytes(replace(model, d_model=w), base.train.seq_len) <= STATE_BUDGET]
        if not widths:
            raise ConfigError(f"no d_model from {WIDTHS[0]} to {WIDTHS[-1]} gives {mixer} a state of at most "
                              f"{STATE_BUDGET:,} bytes at {base.train.seq_len} tokens")
        return replace(base, name=f"matched-{mixer}", model=replace(model, d_model=widths[-1]))

    return build


PRESETS = {"state-tracking": state_tracking, "retrieval": retrieval}
