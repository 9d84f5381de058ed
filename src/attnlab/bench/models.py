"""Whole models: a preset's training steps with its mixer swapped, and our softmax decoder against x-transformers'.
The x-transformers decoder has the same shape."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from functools import partial

import torch

from ..config import load_config
from ..mixers import list_mixers
from ..model import Decoder
from ..timing import round_robin


def random_batch(vocab_size: int, t) -> torch.Tensor:
    """Fixed random tokens [batch_size, seq_len + 1] for timing training steps: inputs and shifted targets."""
    return torch.randint(vocab_size, (t.batch_size, t.seq_len + 1), generator=torch.Generator().manual_seed(0))


def adamw_step(model: torch.nn.Module, loss, autocast=nullcontext):
    """One AdamW training step of the model on loss() (a zero-argument callable), as a callable to time."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        with autocast():
            value = loss()
        value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def bench_training_step(preset: str, mixers=None, repeats: int = 10, overrides=(), log=print) -> dict:
    """Milliseconds per AdamW training step of the preset's model with each mixer, and the ratio to softmax."""
    cfg = load_config(preset, list(overrides))
    model_cfg, t = cfg.sized_model(), cfg.train
    names = list_mixers() if mixers == ["all"] else (mixers or [cfg.model.mixer])
    names = sorted(set(names) | {"softmax"}, key=lambda n: (n != "softmax", n))
    tokens = random_batch(model_cfg.vocab_size, t)
    tasks = {}
    for name in names:
        torch.manual_seed(0)
        model = Decoder(dataclasses.replace(model_cfg, mixer=name, layers=None))
        tasks[name] = adamw_step(model, partial(model.loss, tokens[:, :-1], tokens[:, 1:]))
    seconds = round_robin(tasks, repeats)
    log(f"training step of the {preset} model (batch {t.batch_size} x {t.seq_len} tokens, "
          f"{torch.get_num_threads()} threads, median of {repeats}, round-robin)")
    log(f"{'mixer':<22} {'ms/step':>9} {'tokens/s':>10} {'x softmax':>10}")
    for name in names:
        log(f"{name:<22} {1e3 * seconds[name]:>9.1f} {t.batch_size * t.seq_len / seconds[name]:>10,.0f} "
              f"{seconds[name] / seconds['softmax']:>10.2f}")
    return {name: {"ms": 1e3 * s, "x_softmax": s / seconds["softmax"]} for name, s in seconds.items()}


def x_transformers_decoder(cfg, vocab_size: int):
    """x-transformers' decoder with our decoder's shape: pre-RMSNorm blocks, rotary embeddings, SwiGLU of
    the same width, no biases, tied embeddings, PyTorch's fused attention."""
    from x_transformers import Decoder as XDecoder
    from x_transformers import TransformerWrapper

    from ..model import ffn_width

    layers = XDecoder(dim=cfg.d_model, depth=cfg.n_layers, heads=cfg.n_heads, attn_dim_head=cfg.d_model // cfg.n_heads,
                      rotary_pos_emb=True, use_rmsnorm=True, ff_glu=True, ff_swish=True, ff_no_bias=True,
                      ff_mult=ffn_width(cfg) / cfg.d_model, attn_flash=True)
    return TransformerWrapper(num_tokens=vocab_size, max_seq_len=0, attn_layers=layers, use_abs_pos_emb=False,
                              tie_embedding=True)


def bench_x_transformers(preset: str = "demo", repeats: int = 10, overrides=(), log=print) -> dict | None:
    """Training tokens/s of our softmax decoder and of x-transformers' at the preset's shape, in one run
    (None when x-transformers is not installed)."""
    try:
        import x_transformers  # noqa: F401
    except ImportError:
        log("x-transformers is not installed: `pip install x-transformers` to compare decoders")
        return None
    cfg = load_config(preset, ["model.mixer=softmax", *overrides])
    model_cfg, t = cfg.sized_model(), cfg.train
    tokens = random_batch(model_cfg.vocab_size, t)
    torch.manual_seed(0)
    ours, theirs = Decoder(model_cfg), x_transformers_decoder(model_cfg, model_cfg.vocab_size)

    def ours_loss():
        return ours.loss(tokens[:, :-1], tokens[:, 1:])

    def theirs_loss():
        logits = theirs(tokens[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())

    tasks = {"attnlab": adamw_step(ours, ours_loss), "x-transformers": adamw_step(theirs, theirs_loss)}
    seconds = round_robin(tasks, repeats)
    params = {"attnlab": sum(p.numel() for p in ours.parameters()),
              "x-transformers": sum(p.numel() for p in theirs.parameters())}
    tokens_per_step = t.batch_size * t.seq_len
    log(f"softmax decoder training step, {preset} shape (d {cfg.model.d_model}, {cfg.model.n_layers} layers, "
        f"batch {t.batch_size} x {t.seq_len}), median of {repeats}, round-robin")
    result = {}
    for name, sec in seconds.items():
        result[name] = {"ms": 1e3 * sec, "tokens_per_s": tokens_per_step / sec, "params": params[name]}
        log(f"  {name:<16} {1e3 * sec:>8.1f} ms/step {tokens_per_step / sec:>10,.0f} tokens/s "
            f"{params[name]:>10,} parameters")
    result["ratio"] = result["attnlab"]["tokens_per_s"] / result["x-transformers"]["tokens_per_s"]
    log(f"  ours / x-transformers tokens/s: {result['ratio']:.2f}x")
    return result
