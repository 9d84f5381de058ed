"""The Interdomain Attention paper's presets: its four shapes with its recipe, and the demo's CPU shape on
characters. Each imports the config when called (see attnlab.presets)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...config import RunConfig


def interdomain_char() -> RunConfig:
    """Interdomain attention on a 2-core CPU: the demo's model shape with M = 32 modes per head on
    character-level Shakespeare. Compare with model.mixer=softmax | s4d, and the ablation cube through
    model.mixer_options.interdomain.{input, query, rope}."""
    from ...config import DataConfig, ModelConfig, RunConfig, TrainConfig

    return RunConfig(
        name="interdomain-char",
        model=ModelConfig(mixer="interdomain", d_model=128, n_layers=4, n_heads=4,
                          mixer_options={"interdomain": {"modes": 32}, "s4d": {"modes": 32}}),
        data=DataConfig(source="shakespeare"),
        train=TrainConfig(steps=1200, batch_size=16, seq_len=128, lr=2.0e-3, min_lr=2.0e-4, warmup_steps=100,
                          eval_every=300, ckpt_every=600),
    )


def paper_shape(size: str, d_model: int, n_layers: int, n_heads: int, ffn_hidden: int, lr: float) -> RunConfig:
    """One of the paper's shapes (M = 64 modes, SwiGLU, Llama-2 vocabulary, untied embeddings) and its recipe
    (AdamW at this peak lr, the S4D group capped at 1e-3, context 4096). Sized for GPUs; swap model.mixer for
    softmax or s4d to get the paper's baselines."""
    from ...config import ModelConfig, RunConfig, TrainConfig

    return RunConfig(
        name=f"interdomain-{size}",
        model=ModelConfig(mixer="interdomain", vocab_size=32000, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                          ffn_hidden=ffn_hidden, tie_embeddings=False,
                          mixer_options={"interdomain": {"modes": 64}, "s4d": {"modes": 64}}),
        train=TrainConfig(batch_size=128, seq_len=4096, lr=lr, min_lr=1.0e-5, warmup_steps=715, beta2=0.95,
                          weight_decay=0.1, steps=20000),
    )


PRESETS = {
    "interdomain-char": interdomain_char,
    "interdomain-125m": lambda: paper_shape("125m", 768, 12, 12, 2048, lr=3.0e-3),
    "interdomain-350m": lambda: paper_shape("350m", 1024, 24, 16, 2816, lr=1.5e-3),
    "interdomain-760m": lambda: paper_shape("760m", 1536, 24, 16, 4096, lr=1.0e-3),
    "interdomain-1.3b": lambda: paper_shape("1.3b", 2048, 24, 32, 5504, lr=1.0e-3),
}
