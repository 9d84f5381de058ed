"""Our GLA and gated-delta-rule ops against flash-linear-attention's own pure-PyTorch references.

flash-linear-attention (fla-core) imports on a CPU when triton is installed; `make test` installs both,
so this independent oracle runs in CI. Its references compute in fp32 and take [B, T, H, D] tensors.
"""

import warnings

import pytest
import torch

from helpers import random_linear_inputs

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "Triton is not supported on current platform, roll back to CPU"
    gla_naive = pytest.importorskip("fla.ops.gla.naive")
    gdn_naive = pytest.importorskip("fla.ops.gated_delta_rule.naive")

from attnlab.ops.delta_rule import delta_rule_chunk  # noqa: E402
from attnlab.ops.gla import gla_chunk  # noqa: E402


def fla_layout(*tensors):
    return [t.detach().float().transpose(1, 2).contiguous() for t in tensors]


def test_gla_chunk_matches_fla_naive_recurrent_gla():
    q, k, v, g, _, h0 = random_linear_inputs(T=45, K=16, V=8)
    o, h = gla_chunk(q.float(), k.float(), v.float(), g.float(), initial_state=h0.float(), chunk_size=16)
    o_fla, h_fla = gla_naive.naive_recurrent_gla(*fla_layout(q, k, v, g), initial_state=h0.detach().float(),
                                                 output_final_state=True)
    torch.testing.assert_close(o, o_fla.transpose(1, 2), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(h, h_fla, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fla_form", ["naive_recurrent_gated_delta_rule", "naive_chunk_gated_delta_rule"])
def test_delta_rule_chunk_matches_fla(fla_form):
    q, k, v, g, beta, h0 = random_linear_inputs(T=45, K=16, V=8, per_channel_decay=False)
    o, h = delta_rule_chunk(q.float(), k.float(), v.float(), g.float(), beta.float(), initial_state=h0.float(),
                            chunk_size=16)
    q_, k_, v_, g_, beta_ = fla_layout(q, k, v, g, beta)
    fla_fn = getattr(gdn_naive, fla_form)
    o_fla, h_fla = fla_fn(q_, k_, v_, g=g_, beta=beta_, initial_state=h0.detach().float(), output_final_state=True)
    torch.testing.assert_close(o, o_fla.transpose(1, 2), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(h, h_fla, rtol=1e-4, atol=1e-4)
