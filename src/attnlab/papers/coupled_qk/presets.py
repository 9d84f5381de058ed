"""The Coupled Query-Key Dynamics paper's presets: its 60M shape, and the demo's shape on characters for a CPU.
Each imports the config when called (see attnlab.presets)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...config import RunConfig

COUPLING = {"integrator": "euler", "steps": 1, "dt_init": 0.1}  # the spec's defaults: one Euler step of 0.1


def coupled_qk_char() -> RunConfig:
    """Coupled QK on a 2-core CPU: the demo's model shape (d_model 128, 4 layers, d_h 32) on character-level
    Shakespeare. Compare with model.mixer=softmax | uncoupled-qk | differential."""
    from ...config import DataConfig, ModelConfig, RunConfig, TrainConfig

    return RunConfig(
        name="coupled-qk-char",
        model=ModelConfig(mixer="coupled-qk", d_model=128, n_layers=4, n_heads=4,
                          mixer_options={"coupled-qk": dict(COUPLING), "coupled-differential": dict(COUPLING),
                                         "uncoupled-qk": {"steps": 1, "dt_init": 0.1}}),
        data=DataConfig(source="shakespeare"),
        train=TrainConfig(steps=1200, batch_size=16, seq_len=128, lr=2.0e-3, min_lr=2.0e-4, warmup_steps=100,
                          eval_every=300, ckpt_every=600),
    )


def coupled_qk_60m() -> RunConfig:
    """The paper's 60M-class shape (d_h = 64, 8 heads, 8 layers) on a locally trained BPE of GPT-2's size,
    50,257 tokens (the paper does not name its tokenizer; GPT-2's is the likely reading of its 60M): 59M
    parameters, 26M of them the tied embedding; the shared-head coupling MLP adds 0.11%. The vocabulary follows
    the tokenizer (vocab_size 0): data.bpe_vocab=4096 gives the same shape with 36M parameters, and a BPE trained
    on a small corpus stops below 50,257 (Shakespeare's at 46,767). Sized for a GPU; `attnlab list --params
    coupled-qk-60m` prints the overhead of every mixer."""
    from ...config import DataConfig, ModelConfig, RunConfig, TrainConfig

    return RunConfig(
        name="coupled-qk-60m",
        model=ModelConfig(mixer="coupled-qk", d_model=512, n_layers=8, n_heads=8, ffn_hidden=2048,
                          mixer_options={"coupled-qk": dict(COUPLING)}),
        data=DataConfig(tokenizer="bpe", bpe_vocab=50257),
        train=TrainConfig(steps=20000, batch_size=64, seq_len=512, lr=6.0e-4, min_lr=6.0e-5, warmup_steps=1000,
                          beta2=0.95, eval_every=1000, ckpt_every=2000),
    )


PRESETS = {"coupled-qk-char": coupled_qk_char, "coupled-qk-60m": coupled_qk_60m}
