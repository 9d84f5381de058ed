"""The Boltzmann attention mixer: its modes, inference methods and couplings."""

import pytest
import torch

from attnlab.config import ModelConfig, TrainConfig
from attnlab.errors import ConfigError, UserError
from attnlab.mixers import build_mixer
from attnlab.model import Decoder
from attnlab.train import param_groups

D_MODEL, N_HEADS = 16, 2


def make(**options):
    torch.manual_seed(0)
    return build_mixer("boltzmann", d_model=D_MODEL, n_heads=N_HEADS, **options).double()


def heads(mixer, x):
    B, T, _ = x.shape
    q, k, _ = mixer.qkv(x).view(B, T, 3, N_HEADS, -1).permute(2, 0, 3, 1, 4)
    return mixer.rotary(q), mixer.rotary(k)


def attention_weights(mixer, x):
    """The normalised weights the mixer applies, recovered by feeding identity values."""
    q, k = heads(mixer, x)
    T = x.shape[1]
    eye = torch.eye(T, dtype=x.dtype).expand(x.shape[0], N_HEADS, T, T)
    return mixer.attend(q, k, eye)


def test_zero_couplings_give_normalised_sigmoid_of_twice_the_scores():
    mixer = make()  # J starts at zero
    x = torch.randn(2, 7, D_MODEL, dtype=torch.float64)
    q, k = heads(mixer, x)
    alpha = torch.sigmoid(2 * q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5)).tril()
    torch.testing.assert_close(attention_weights(mixer, x), alpha / alpha.sum(-1, keepdim=True), rtol=0, atol=1e-10)


def test_j_only_attends_uniformly():
    mixer = make(mode="j-only", j_init_std=1.0)
    w = attention_weights(mixer, torch.randn(1, 6, D_MODEL, dtype=torch.float64))
    uniform = torch.ones(6, 6, dtype=torch.float64).tril() / torch.arange(1, 7, dtype=torch.float64)[:, None]
    torch.testing.assert_close(w[0, 0], uniform, rtol=0, atol=1e-12)
    biased = make(mode="j-only", j_init_std=1.0, bias_field=True)
    with torch.no_grad():
        biased.bias.normal_()
    assert not torch.allclose(attention_weights(biased, torch.randn(1, 6, D_MODEL, dtype=torch.float64))[0, 0], uniform)


@pytest.mark.parametrize("inference", ["banded", "mean-field", "dqa"])
def test_inference_methods_agree_with_exact_where_they_should(inference):
    x = torch.randn(2, 6, D_MODEL, dtype=torch.float64)
    exact = make(couplings="distance", window=8, j_init_std=0.3 if inference != "mean-field" else 0.02)
    other = make(couplings="distance", window=8, inference=inference, band=7, dqa_shots=0, dqa_tau=0.05,
                 j_init_std=0.3 if inference != "mean-field" else 0.02)
    other.load_state_dict(exact.state_dict())
    w_exact, w_other = attention_weights(exact, x), attention_weights(other, x)
    if inference == "banded":  # band 7 covers every pair of 6 positions: the same model exactly
        torch.testing.assert_close(w_other, w_exact, rtol=0, atol=1e-12)
    elif inference == "mean-field":  # weak couplings: close
        assert (w_other - w_exact).abs().max() < 2e-3
    else:  # a very fast anneal samples nearly uniformly
        uniform = torch.ones(6, 6, dtype=torch.float64).tril() / torch.arange(1, 7, dtype=torch.float64)[:, None]
        assert (w_other[0, 0] - uniform).abs().max() < 1e-3


def test_banded_inference_runs_far_beyond_the_window_with_distance_couplings():
    mixer = make(couplings="distance", inference="banded", band=3, window=8, j_init_std=0.2)
    x = torch.randn(1, 200, D_MODEL, dtype=torch.float64, requires_grad=True)
    y, _ = mixer(x)
    y.sum().backward()
    assert torch.isfinite(y).all() and mixer.J.grad.abs().sum() > 0


@pytest.mark.parametrize("inference", ["banded", "mean-field"])
def test_past_the_window_distance_couplings_slide_it(inference):
    """Each query sees its last `window` keys, exactly as if the sequence began there (RoPE is relative)."""
    mixer = make(couplings="distance", inference=inference, band=3, window=5, j_init_std=0.3)
    x = torch.randn(2, 11, D_MODEL, dtype=torch.float64)
    w = attention_weights(mixer, x)
    assert (w[..., 6:, :2] == 0).all() and (w[..., 10, 6:] > 0).all()
    y, _ = mixer(x)
    for t in (4, 7, 10):
        alone, _ = mixer(x[:, t - 4 : t + 1])
        torch.testing.assert_close(y[:, t], alone[:, -1], rtol=0, atol=1e-10)


def test_banded_inference_is_linear_in_the_length(monkeypatch):
    """The work per query is one chain of `window` spins: a 4x longer input makes 4x the chains."""
    from attnlab.ops import ising

    chains, real = [], ising.banded_log_marginals
    monkeypatch.setattr(ising, "banded_log_marginals", lambda h, Jb: chains.append(tuple(h.shape)) or real(h, Jb))
    mixer = make(couplings="distance", inference="banded", band=2, window=4)
    for T in (16, 64):
        mixer(torch.randn(1, T, D_MODEL, dtype=torch.float64))
    assert chains == [(N_HEADS * 16, 4), (N_HEADS * 64, 4)]


def test_position_couplings_refuse_contexts_beyond_the_window():
    mixer = make(window=4)
    with pytest.raises(UserError, match="window=4 sees at most 4 positions, but this call reaches 6"):
        mixer(torch.randn(1, 6, D_MODEL, dtype=torch.float64))


def test_distance_couplings_are_toeplitz():
    mixer = make(couplings="distance", window=5, j_init_std=1.0)
    J = mixer.coupling_matrix(7)
    for d in range(1, 7):
        expected = mixer.J[:, d - 1] if d <= 4 else torch.zeros(N_HEADS, dtype=torch.float64)
        for j in range(7 - d):
            torch.testing.assert_close(J[:, j, j + d], expected)


def test_couplings_get_their_own_optimizer_group():
    model = Decoder(ModelConfig(vocab_size=12, d_model=D_MODEL, n_layers=1, n_heads=N_HEADS, mixer="boltzmann",
                                mixer_options={"boltzmann": {"j_lr": 1e-4, "j_weight_decay": 0.02}}))
    groups = {id(p): (g["peak_lr"], g["weight_decay"]) for g in param_groups(model, TrainConfig()) for p in g["params"]}
    assert groups[id(model.blocks[0].mixer.J)] == (1e-4, 0.02)


def test_three_body_and_bias_parameters():
    mixer = make(mode="h+J+K", window=6)
    assert mixer.K.shape == (N_HEADS, 6, 6, 6) and mixer.J.shape == (N_HEADS, 6, 6)
    assert make(mode="h-only").J is None


@pytest.mark.parametrize(
    "options, message",
    [({"mode": "hJ"}, r"unknown mode 'hJ'; did you mean 'h\+J'"),
     ({"inference": "sampling"}, "unknown inference 'sampling'"),
     ({"mode": "h+J+K", "inference": "banded"}, "banded inference handles pair couplings only"),
     ({"mode": "h+K", "couplings": "distance"}, "three-body couplings, which are indexed by position"),
     ({"inference": "banded", "band": 20}, "band=20 must be between 1 and window - 1 = 15"),
     ({"inference": "dqa", "window": 16}, "dqa simulates 2\\^window amplitudes per query; window=16")],
)
def test_bad_options(options, message):
    with pytest.raises(ConfigError, match=message):
        build_mixer("boltzmann", d_model=D_MODEL, n_heads=N_HEADS, **options)


def test_dqa_with_shots_is_reproducible_in_evaluation_and_trains_the_couplings():
    mixer = make(inference="dqa", window=6, dqa_shots=64, j_init_std=0.3)
    x = torch.randn(1, 5, D_MODEL, dtype=torch.float64, requires_grad=True)
    mixer.eval()
    torch.testing.assert_close(mixer(x)[0], mixer(x)[0], rtol=0, atol=0)
    mixer.train()
    for gradient in ("ste", "covariance"):
        mixer.cfg.dqa_gradient = gradient
        mixer.zero_grad()
        mixer(x)[0].square().sum().backward()
        assert torch.isfinite(mixer.J.grad).all() and mixer.J.grad.abs().sum() > 0, gradient
