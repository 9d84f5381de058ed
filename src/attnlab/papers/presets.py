"""The presets every suite's arms build on: the demo's model, MQAR on a CPU and zoology's figure 2.

A function each, registered by name in `attnlab.presets` when the papers load; each imports the config when
called, so that registering them imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..presets import register_preset

if TYPE_CHECKING:
    from ..config import RunConfig


@register_preset("demo")
def demo() -> RunConfig:
    """The demo: a small softmax Transformer on character-level Shakespeare, sized for a 2-core CPU."""
    from ..config import DataConfig, ModelConfig, RunConfig, TrainConfig

    return RunConfig(
        name="demo",
        model=ModelConfig(mixer="softmax", d_model=128, n_layers=4, n_heads=4),
        data=DataConfig(source="shakespeare", tokenizer="char"),
        train=TrainConfig(steps=1200, batch_size=16, seq_len=128, lr=2.0e-3, min_lr=2.0e-4, warmup_steps=100,
                          eval_every=300, eval_batches=20, ckpt_every=600),
    )


@register_preset("mqar")
def mqar() -> RunConfig:
    """Multi-query associative recall on a CPU: 64-token sequences with 4 key-value pairs, a 2-layer model.
    Test accuracy: attnlab eval runs/mqar --task mqar"""
    from ..config import DataConfig, ModelConfig, RunConfig, TrainConfig

    return RunConfig(
        name="mqar",
        model=ModelConfig(mixer="softmax", d_model=64, n_layers=2, n_heads=2),
        data=DataConfig(source="mqar", task_options={"mqar": {"vocab_size": 256, "pairs": 4, "test_pairs": [1, 2, 4],
                                                              "train_examples": 100000, "test_examples": 1000}}),
        train=TrainConfig(steps=6000, batch_size=64, seq_len=64, lr=3.0e-3, min_lr=1.0e-4, warmup_steps=200,
                          weight_decay=0.1, eval_every=1000, eval_batches=10, ckpt_every=2000),
    )


def zoology_figure2(seq_len: int, pairs: int, batch_size: int, steps: int) -> RunConfig:
    """Zoology's figure 2 (Arora et al. 2023) at one sequence length: vocabulary 8192, 100k training / 3k test
    sequences, 64 epochs. The paper sweeps model.d_model over 64, 128, 256, 512 and train.lr over
    logspace(-4, -2, 4); e.g. attnlab train mqar-fig2-64 model.d_model=128 train.lr=2.2e-3"""
    from ..config import DataConfig, ModelConfig, RunConfig, TrainConfig

    return RunConfig(
        name=f"mqar-fig2-{seq_len}",
        model=ModelConfig(mixer="softmax", d_model=128, n_layers=2, n_heads=1),
        data=DataConfig(source="mqar", task_options={"mqar": {
            "vocab_size": 8192, "pairs": pairs, "power_a": 0.01, "random_non_queries": False,
            "train_examples": 100000, "test_examples": 3000}}),
        train=TrainConfig(steps=steps, batch_size=batch_size, seq_len=seq_len, lr=1.0e-3, min_lr=0.0, warmup_steps=0,
                          weight_decay=0.1, eval_every=500, ckpt_every=2000),
    )


@register_preset("mqar-fig2-64")
def mqar_fig2_64() -> RunConfig:
    """Zoology's figure 2 at sequence length 64 with 4 key-value pairs, batch 512."""
    return zoology_figure2(64, pairs=4, batch_size=512, steps=12500)


@register_preset("mqar-fig2-128")
def mqar_fig2_128() -> RunConfig:
    """Zoology's figure 2 at sequence length 128 with 8 key-value pairs, batch 512."""
    return zoology_figure2(128, pairs=8, batch_size=512, steps=12500)


@register_preset("mqar-fig2-256")
def mqar_fig2_256() -> RunConfig:
    """Zoology's figure 2 at sequence length 256 with 16 key-value pairs, batch 256."""
    return zoology_figure2(256, pairs=16, batch_size=256, steps=25000)
