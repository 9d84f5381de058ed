"""The linear-attention mixers: CCQ's reduction to its backbone, initialisation, and constant state."""

import math

import pytest
import torch

from attnlab.config import ModelConfig, TrainConfig
from attnlab.errors import ConfigError
from attnlab.mixers import build_mixer
from attnlab.model import Decoder
from attnlab.train import param_groups

D_MODEL, N_HEADS = 32, 4


def same_weights(backbone: str, variant: str, **options):
    torch.manual_seed(0)
    plain = build_mixer(backbone, d_model=D_MODEL, n_heads=N_HEADS, **options).double()
    ccq = build_mixer(variant, d_model=D_MODEL, n_heads=N_HEADS, **options).double()
    missing = ccq.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["lambda_bias", "lambda_weight"]
    return plain, ccq


@pytest.mark.parametrize("backbone", ["gla", "gdn"])
def test_lambda_zero_reproduces_the_backbone(backbone):
    plain, ccq = same_weights(backbone, f"ccq-{backbone}")
    x = torch.randn(2, 70, D_MODEL, dtype=torch.float64)
    y_plain, y_ccq = plain(x)[0], ccq(x)[0]
    assert not torch.allclose(y_plain, y_ccq)
    with torch.no_grad():
        ccq.lambda_bias.fill_(-float("inf"))  # lambda = sigmoid(-inf) = 0
    y_zero, state = ccq(x)
    torch.testing.assert_close(y_zero, y_plain, rtol=0, atol=1e-13)
    torch.testing.assert_close(state.memory, plain(x)[1].memory, rtol=0, atol=1e-13)


@pytest.mark.parametrize("mixer", ["ccq-gla", "ccq-gdn"])
def test_lambda_starts_at_its_init_inside_a_decoder(mixer):
    model = Decoder(ModelConfig(vocab_size=20, d_model=D_MODEL, n_layers=2, n_heads=N_HEADS, mixer=mixer))
    for block in model.blocks:
        q_bar = torch.nn.functional.normalize(torch.randn(5, N_HEADS, block.mixer.head_k), dim=-1)
        lam = torch.sigmoid((q_bar * block.mixer.lambda_weight).sum(-1) + block.mixer.lambda_bias)
        torch.testing.assert_close(lam, torch.full_like(lam, 0.1), rtol=0, atol=1e-6)


def test_gdn_time_constants_keep_their_init_and_get_no_weight_decay():
    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=20, d_model=D_MODEL, n_layers=1, n_heads=N_HEADS, mixer="gdn"))
    mixer = model.blocks[0].mixer
    A = mixer.A_log.exp()
    dt = torch.nn.functional.softplus(mixer.dt_bias)
    assert ((A > 0) & (A <= 16)).all() and ((dt >= 1e-4 - 1e-9) & (dt <= 0.1 + 1e-6)).all()
    decay_of = {id(p): g["weight_decay"] for g in param_groups(model, TrainConfig()) for p in g["params"]}
    assert decay_of[id(mixer.A_log)] == decay_of[id(mixer.dt_bias)] == 0.0
    assert decay_of[id(mixer.q_proj.weight)] > 0


@pytest.mark.parametrize("mixer", ["gdn", "ccq-gdn"])
def test_negative_eigenvalues_write_with_beta_in_zero_to_two(mixer):
    """beta = 2 sigmoid(W_b x) in (0, 2): the transition's eigenvalue 1 - beta along k reaches below 0 (a sign flip)
    and stays above -1; without the option beta = sigmoid(W_b x) in (0, 1)."""
    torch.manual_seed(0)
    plain = build_mixer(mixer, d_model=D_MODEL, n_heads=N_HEADS)
    doubled = build_mixer(mixer, d_model=D_MODEL, n_heads=N_HEADS, negative_eigenvalues=True)
    doubled.load_state_dict(plain.state_dict())
    with torch.no_grad():  # large write logits: beta near both ends of its range
        plain.beta_proj.weight.mul_(20)
        doubled.beta_proj.weight.mul_(20)
    x = torch.randn(2, 64, D_MODEL)
    beta, beta_doubled = plain.gates(x)["beta"], doubled.gates(x)["beta"]
    torch.testing.assert_close(beta, torch.sigmoid(plain.beta_proj(x)).transpose(1, 2))
    torch.testing.assert_close(beta_doubled, 2 * beta)
    assert 0 < beta_doubled.min() < 0.1 and 1.9 < beta_doubled.max() < 2


@pytest.mark.parametrize("mixer", ["linear", "gla", "gdn", "ccq-gla", "ccq-gdn"])
def test_decoding_state_does_not_grow(mixer):
    m = build_mixer(mixer, d_model=D_MODEL, n_heads=N_HEADS)
    assert m.state_size(10) == m.state_size(10_000)
    x = torch.randn(1, 40, D_MODEL)
    _, short = m(x[:, :5])
    _, long = m(x)
    shapes = lambda s: [t.shape for t in (s.memory, s.conv) if t is not None]  # noqa: E731
    assert shapes(short) == shapes(long)


def test_query_scale_does_not_change_the_gla_layer_output():
    """The per-head RMSNorm after the read removes any positive per-token scale of the query (up to its
    eps), so reading with q - lambda Sigma q instead of the paper's q_bar - lambda Sigma q_bar is the same layer."""
    torch.manual_seed(0)
    mixer = build_mixer("ccq-gla", d_model=D_MODEL, n_heads=N_HEADS, norm_eps=1e-30).double()
    x = torch.randn(2, 30, D_MODEL, dtype=torch.float64)
    y, _ = mixer(x)
    original = mixer.read_query

    def scaled(q, k, gates, state, **packing):
        q, k, state = original(q, k, gates, state, **packing)
        return q * (0.5 + torch.rand(q.shape[:-1], dtype=q.dtype)[..., None]), k, state

    mixer.read_query = scaled
    torch.testing.assert_close(mixer(x)[0], y, rtol=0, atol=1e-12)


def test_decayed_statistics_option_changes_the_read():
    torch.manual_seed(0)
    a = build_mixer("ccq-gdn", d_model=D_MODEL, n_heads=N_HEADS).double()
    b = build_mixer("ccq-gdn", d_model=D_MODEL, n_heads=N_HEADS, ccq_decay=True).double()
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 50, D_MODEL, dtype=torch.float64)
    assert not torch.allclose(a(x)[0], b(x)[0])


@pytest.mark.parametrize(
    "mixer, options, message",
    [("gla", {"expand_k": 0.3}, "expand_k=0.3 gives a width of 9.6"),
     ("gdn", {"d_model": 40, "n_heads": 8}, "expand_k=0.75 gives a width of 30 .* divisible by n_heads=8"),
     ("ccq-gla", {"ccq_lambda_init": 1.0}, "ccq_lambda_init=1.0 must be in"),
     ("gdn", {"conv_size": 1}, "conv_size=1 must be at least 2")],
)
def test_bad_options(mixer, options, message):
    options = {"d_model": D_MODEL, "n_heads": N_HEADS} | options
    with pytest.raises(ConfigError, match=message):
        build_mixer(mixer, **options)


def test_gla_gate_is_low_rank_and_slow():
    m = build_mixer("gla", d_model=D_MODEL, n_heads=N_HEADS)
    assert m.forget_gate[0].weight.shape == (16, D_MODEL)
    log_decay = m.gates(torch.randn(1, 5, D_MODEL))["log_decay"]
    assert log_decay.shape == (1, N_HEADS, 5, m.head_k)
    assert (log_decay <= 0).all() and (log_decay >= -math.log(2) / 16 - 1).all()
