"""Op forms against their loop references and flash-linear-attention's pure-PyTorch references, and the
softmax mixer against bare causal SDPA."""

from __future__ import annotations

import warnings
from functools import partial

import torch

from ..mixers import build_mixer
from ..timing import round_robin


def _fla_references() -> dict:
    """flash-linear-attention's pure-PyTorch references, when the package imports ([B, T, H, D] layout)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule
            from fla.ops.gla.naive import naive_recurrent_gla
    except ImportError:
        return {}
    return {"gla": naive_recurrent_gla, "gdn": naive_chunk_gated_delta_rule}


def bench_ops(seq_len: int = 4096, batch: int = 2, heads: int = 4, head_dim: int = 64, d_model: int = 256,
              repeats: int = 3, log=print) -> dict:
    """Forward+backward seconds of each op form against its loop reference and flash-linear-attention's
    references, and of the softmax mixer against bare causal SDPA."""
    B, H, T, D = batch, heads, seq_len, head_dim
    tasks, fla = _op_tasks(B, H, T, D)
    x = torch.randn(B, T, d_model, requires_grad=True)
    tasks["softmax mixer"] = backward_of(partial(build_mixer("softmax", d_model=d_model, n_heads=heads), x))
    seconds = round_robin(tasks, repeats)

    log(f"forward+backward, B={B} H={H} T={T} head dim {D} (the mixer: d_model {d_model}, with its projections), "
        f"{torch.get_num_threads()} threads, median of {repeats}, round-robin")
    for name, sec in seconds.items():
        log(f"  {name:<26} {1e3 * sec:>10.1f} ms")
    ratios = {
        "gla reference / chunk": seconds["gla reference"] / seconds["gla chunk"],
        "gdn reference / chunk": seconds["gdn reference"] / seconds["gdn chunk"],
        "softmax mixer / bare sdpa": seconds["softmax mixer"] / seconds["sdpa (causal)"],
    }
    if fla:
        ratios["fla naive_recurrent_gla / our gla chunk"] = seconds["gla fla naive_recurrent"] / seconds["gla chunk"]
        ratios["fla naive_chunk_gated_delta_rule / our gdn chunk"] = (seconds["gdn fla naive_chunk"]
                                                                      / seconds["gdn chunk"])
    else:
        log("  (flash-linear-attention is not installed: its references are not measured)")
    for name, ratio in ratios.items():
        log(f"  {name:<50} {ratio:>6.2f}x")
    return {"seconds": seconds, "ratios": ratios}


def backward_of(fn):
    return lambda: fn()[0].sum().backward()


def _op_tasks(B: int, H: int, T: int, D: int) -> tuple[dict, dict]:
    """Forward+backward of the chunk forms, their loop references, fla's references (when installed) and bare
    causal SDPA on random inputs of one shape; and fla's references found."""
    from ..ops.delta_rule import delta_rule_chunk, delta_rule_reference
    from ..ops.gla import gla_chunk, gla_reference

    gen = torch.Generator().manual_seed(0)

    def leaf(*shape, fn=lambda t: t):
        return fn(torch.randn(*shape, generator=gen)).requires_grad_()

    q, v = leaf(B, H, T, D), leaf(B, H, T, D)
    k = leaf(B, H, T, D, fn=lambda t: torch.nn.functional.normalize(t, dim=-1))
    g_gla = leaf(B, H, T, D, fn=lambda t: torch.nn.functional.logsigmoid(t) / 16)
    g_gdn = leaf(B, H, T, fn=lambda t: torch.nn.functional.logsigmoid(t + 3))
    beta = leaf(B, H, T, fn=torch.sigmoid)

    def fla_layout(*xs):
        return [x.transpose(1, 2) for x in xs]

    tasks = {
        "gla chunk": backward_of(lambda: gla_chunk(q, k, v, g_gla)),
        "gla reference": backward_of(lambda: gla_reference(q, k, v, g_gla)),
        "gdn chunk": backward_of(lambda: delta_rule_chunk(q, k, v, g_gdn, beta)),
        "gdn reference": backward_of(lambda: delta_rule_reference(q, k, v, g_gdn, beta)),
    }
    fla = _fla_references()
    if fla:
        tasks["gla fla naive_recurrent"] = backward_of(lambda: fla["gla"](*fla_layout(q, k, v, g_gla)))
        tasks["gdn fla naive_chunk"] = backward_of(lambda: fla["gdn"](*fla_layout(q, k, v), g=g_gdn.transpose(1, 2),
                                                                         beta=beta.transpose(1, 2)))
    tasks["sdpa (causal)"] = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True
                                                                                       ).sum().backward()
    return tasks, fla
