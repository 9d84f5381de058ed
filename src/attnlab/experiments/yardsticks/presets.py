"""The yardsticks' presets: the small shape that zoology's recall studies use (2 layers, d_model 64) on a word
problem and on S-NIAH. Each imports the config when called (see attnlab.presets)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...config import RunConfig


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


PRESETS = {"state-tracking": state_tracking, "retrieval": retrieval}
