"""Contract tests every registered mixer must pass, and reference checks of the attention maps."""

import dataclasses
import math

import pytest
import torch

from attnlab.errors import ConfigError, UserError
from attnlab.mixers import KVCache, build_mixer, list_mixers
from attnlab.mixers.differential import lambda_init
from helpers import CASE_IDS, CASES

D_MODEL, N_HEADS = 32, 4


contract = pytest.mark.parametrize("name, options", CASES, ids=CASE_IDS)


def make(name, **options):
    torch.manual_seed(0)
    return build_mixer(name, d_model=D_MODEL, n_heads=N_HEADS, **options).double()


@contract
def test_causal(name, options):
    mixer = make(name, **options)
    x = torch.randn(2, 12, D_MODEL, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 7:] = torch.randn(2, 5, D_MODEL, dtype=torch.float64)
    y, _ = mixer(x)
    y2, _ = mixer(x2)
    torch.testing.assert_close(y[:, :7], y2[:, :7], rtol=0, atol=1e-12)
    assert not torch.allclose(y[:, 7:], y2[:, 7:])  # the future did reach the later outputs


@contract
@pytest.mark.parametrize("split", [1, 5, 11])
def test_prefill_then_decode_equals_full_forward(name, options, split):
    torch.manual_seed(0)
    mixer = build_mixer(name, d_model=D_MODEL, n_heads=N_HEADS, layer_idx=2, **options)  # fp32
    x = torch.randn(2, 12, D_MODEL)
    full, _ = mixer(x)
    with torch.no_grad():  # as generation runs (KV caches then grow in place)
        y, state = mixer(x[:, :split])
        outputs = [y]
        for t in range(split, x.shape[1]):
            y, state = mixer(x[:, t : t + 1], state)
            outputs.append(y)
    torch.testing.assert_close(torch.cat(outputs, dim=1), full, rtol=0, atol=1e-5)


@contract
def test_chunked_prefill_and_initial_state(name, options):
    """A prefill in uneven pieces from an explicit init_state equals the single forward."""
    mixer = make(name, **options)
    x = torch.randn(3, 10, D_MODEL, dtype=torch.float64)
    full, _ = mixer(x)
    state = mixer.init_state(3, dtype=torch.float64)
    pieces = []
    for lo, hi in [(0, 4), (4, 5), (5, 10)]:
        y, state = mixer(x[:, lo:hi], state)
        pieces.append(y)
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=0, atol=1e-10)


@contract
def test_gradients_finite_and_reach_every_parameter(name, options):
    """At initialisation; a parameter behind a zero-initialised output layer (an identity at the start, as the
    affine coupling is) gets none there, and must get one once the parameters have moved."""
    mixer = make(name, **options)
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64, requires_grad=True)
    y, _ = mixer(x)
    y.square().sum().backward()
    assert torch.isfinite(x.grad).all()
    blocked = set()
    for pname, p in mixer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        if p.grad.abs().sum() == 0:
            blocked.add(pname)
    if blocked:
        with torch.no_grad():
            for p in mixer.parameters():
                p.add_(0.1 * torch.randn_like(p))
                p.grad = None
        mixer(x)[0].square().sum().backward()
        for pname, p in mixer.named_parameters():
            assert p.grad is not None and (pname not in blocked or p.grad.abs().sum() > 0), \
                f"{pname} gets no gradient"


@pytest.mark.parametrize("name", list_mixers())
def test_state_size_counts_the_state(name):
    mixer = make(name)
    _, state = mixer(torch.randn(1, 6, D_MODEL, dtype=torch.float64))
    assert mixer.state_size(6) == sum(t.numel() * (2 if t.is_complex() else 1) for t in tensors_in(state))


@pytest.mark.parametrize("name", list_mixers())
@pytest.mark.parametrize("shape", [(5, D_MODEL), (2, 5, D_MODEL + 1), (2, 0, D_MODEL), (0, 5, D_MODEL)],
                         ids=["2-D", "width", "no-tokens", "no-sequences"])
def test_a_misshapen_input_fails_in_one_line_that_names_the_shape(name, shape):
    with pytest.raises(UserError) as failure:
        make(name)(torch.randn(*shape, dtype=torch.float64))
    assert str(failure.value) == (f"mixer input must be [batch, time, d_model={D_MODEL}] with batch and time >= 1; "
                                  f"got {list(shape)}")


@contract
def test_a_state_of_another_batch_or_another_mixer_fails_in_one_line_naming_both(name, options):
    mixer = make(name, **options)
    _, state = mixer(torch.randn(3, 4, D_MODEL, dtype=torch.float64))
    with pytest.raises(UserError) as failure:
        mixer(torch.randn(2, 1, D_MODEL, dtype=torch.float64), state)
    assert str(failure.value) == (f"the state given to {name} holds 3 sequences, the input 2; give it the state of "
                                  "these rows, or init_state(2) to start afresh")
    with pytest.raises(UserError, match=f"the state given to {name} holds 3 sequences, the input 1"):
        mixer(torch.randn(1, 1, D_MODEL, dtype=torch.float64), mixer.init_state(3, dtype=torch.float64))

    # a KV cache of another attention mixer has the very shapes of this one's: only its maker tells them apart
    other = "sigmoid" if name == "softmax" else "softmax"
    _, foreign = make(other)(torch.randn(2, 4, D_MODEL, dtype=torch.float64))
    for given in (foreign, make(other).init_state(2, dtype=torch.float64)):
        with pytest.raises(UserError) as failure:
            mixer(torch.randn(2, 1, D_MODEL, dtype=torch.float64), given)
        assert str(failure.value) == (f"the state given to {name} is a KVCache from {other}, another mixer; give it "
                                      f"what {name}'s init_state or its own previous call returned, or None to start "
                                      "afresh")
    with pytest.raises(UserError, match=f"the state given to {name} is a (KVCache|Tensor), not the "):
        mixer(torch.randn(2, 1, D_MODEL, dtype=torch.float64),
              torch.zeros(2, 1) if isinstance(state, KVCache) else KVCache.holding(*[torch.zeros(2, 4, 1, 8)] * 2))
    # one state per row (a packed call's) is checked row by row
    _, rows = mixer(torch.randn(1, 5, D_MODEL, dtype=torch.float64), cu_seqlens=torch.tensor([0, 2, 5]))
    with pytest.raises(UserError, match=f"the state given to {name} is a KVCache from {other}"):
        mixer(torch.randn(2, 1, D_MODEL, dtype=torch.float64), [rows[0], foreign])


def tensors_in(state):
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, KVCache):  # what it holds, not the room its buffers have beyond it
        return [state.k, state.v]
    if dataclasses.is_dataclass(state):
        state = [getattr(state, f.name) for f in dataclasses.fields(state)]
    elif isinstance(state, dict):
        state = list(state.values())
    return [t for item in state for t in tensors_in(item)] if isinstance(state, (list, tuple)) else []


def _heads(mixer, x):
    """q, k (after RoPE) and v as the mixers see them: [B, H, T, D]."""
    B, T, _ = x.shape
    q, k, v = mixer.qkv(x).view(B, T, 3, N_HEADS, D_MODEL // N_HEADS).permute(2, 0, 3, 1, 4)
    return mixer.rotary(q), mixer.rotary(k), v


def _merge(mixer, y):
    return mixer.out_proj(y.transpose(1, 2).flatten(2))


def test_softmax_matches_explicit_attention():
    mixer = make("softmax")
    x = torch.randn(2, 7, D_MODEL, dtype=torch.float64)
    q, k, v = _heads(mixer, x)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    expected = _merge(mixer, scores.softmax(-1) @ v)
    torch.testing.assert_close(mixer(x)[0], expected)


def test_sigmoid_matches_loop_over_positions():
    mixer = make("sigmoid", bias=-1.5)
    x = torch.randn(1, 6, D_MODEL, dtype=torch.float64)
    q, k, v = _heads(mixer, x)
    out = torch.zeros_like(v)
    for i in range(6):
        for j in range(i + 1):
            w = torch.sigmoid((q[:, :, i] * k[:, :, j]).sum(-1) / math.sqrt(q.shape[-1]) - 1.5)
            out[:, :, i] += w[..., None] * v[:, :, j]
    torch.testing.assert_close(mixer(x)[0], _merge(mixer, out))


def test_differential_matches_difference_of_two_softmax_maps():
    mixer = make("differential", layer_idx=3)
    x = torch.randn(2, 8, D_MODEL, dtype=torch.float64)
    q, k, v = _heads(mixer, x)
    d = q.shape[-1]
    future = torch.ones(8, 8, dtype=torch.bool).triu(1)

    def attn_map(qh, kh):
        return (qh @ kh.transpose(-1, -2) / math.sqrt(d)).masked_fill(future, float("-inf")).softmax(-1)

    lam = mixer.lambda_full()
    heads = []
    for i in range(N_HEADS // 2):
        a = attn_map(q[:, 2 * i], k[:, 2 * i]) - lam * attn_map(q[:, 2 * i + 1], k[:, 2 * i + 1])
        vh = torch.cat((v[:, 2 * i], v[:, 2 * i + 1]), dim=-1)  # value head of width 2d
        o = a @ vh
        o = o / torch.sqrt(o.square().mean(-1, keepdim=True) + mixer.cfg.norm_eps) * mixer.head_norm.weight
        heads.append(o * (1 - lambda_init(3)))
    expected = mixer.out_proj(torch.cat(heads, dim=-1))
    torch.testing.assert_close(mixer(x)[0], expected)


def test_lambda_init_schedule():
    # 0.8 - 0.6 exp(-0.3 (l - 1)) for l = 1, 2, ...: 0.2 at the first layer, rising towards 0.8
    assert lambda_init(0) == pytest.approx(0.2)
    assert lambda_init(1) == pytest.approx(0.8 - 0.6 * math.exp(-0.3))
    assert lambda_init(40) == pytest.approx(0.8, abs=1e-5)


def test_differential_needs_even_heads():
    with pytest.raises(ValueError, match="n_heads=3 must be even"):
        build_mixer("differential", d_model=24, n_heads=3)


def test_rope_option_changes_outputs():
    x = torch.randn(1, 5, D_MODEL, dtype=torch.float64)
    with_rope, _ = make("softmax")(x)
    without, _ = make("softmax", rope=False)(x)
    assert not torch.allclose(with_rope, without)


def test_a_choice_of_a_config_built_in_python_is_refused_as_from_a_file():
    """Literal-typed options are checked by validate() too, not only when read from a file or the command line."""
    from attnlab.mixers.boltzmann import BoltzmannConfig

    with pytest.raises(ConfigError, match=r"unknown inference 'bnd'; did you mean 'banded'\?"):
        BoltzmannConfig(inference="bnd").validate()
