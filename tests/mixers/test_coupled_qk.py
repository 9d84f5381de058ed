"""The coupled-qk mixers: reduction to their base attention, parameter accounting, configuration."""

import pytest
import torch

from attnlab.config import load_config
from attnlab.errors import ConfigError
from attnlab.mixers import build_mixer
from attnlab.model import Decoder

D_MODEL, N_HEADS = 32, 4


def pair(base, coupled, **options):
    """A base attention mixer and a coupled one holding the same projection weights."""
    torch.manual_seed(0)
    plain = build_mixer(base, d_model=D_MODEL, n_heads=N_HEADS, layer_idx=1).double()
    wrapped = build_mixer(coupled, d_model=D_MODEL, n_heads=N_HEADS, layer_idx=1, **options).double()
    missing = wrapped.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert all(key.startswith("coupling.") for key in missing)
    return plain, wrapped


@pytest.mark.parametrize(
    "base, coupled, options",
    [("softmax", "coupled-qk", {"integrator": "euler"}), ("softmax", "coupled-qk", {"integrator": "leapfrog"}),
     ("softmax", "uncoupled-qk", {}), ("differential", "coupled-differential", {"steps": 3})],
)
def test_zero_step_size_is_the_base_attention(base, coupled, options):
    plain, wrapped = pair(base, coupled, **options)
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    assert not torch.allclose(wrapped(x)[0], plain(x)[0])
    with torch.no_grad():
        wrapped.coupling.dt_raw.fill_(-float("inf"))  # dt = softplus(-inf) = 0
    assert torch.equal(wrapped(x)[0], plain(x)[0])


def test_step_size_starts_at_dt_init_per_head():
    mixer = build_mixer("coupled-qk", d_model=D_MODEL, n_heads=N_HEADS, dt_init=0.25)
    torch.testing.assert_close(mixer.coupling.dt, torch.full((N_HEADS, 1, 1), 0.25))


def test_cache_holds_the_evolved_keys():
    mixer = build_mixer("coupled-qk", d_model=D_MODEL, n_heads=N_HEADS, rope=False).double()
    x = torch.randn(1, 5, D_MODEL, dtype=torch.float64)
    _, cache = mixer(x)
    q, k, _ = mixer.qkv(x).view(1, 5, 3, N_HEADS, -1).permute(2, 0, 3, 1, 4)
    torch.testing.assert_close(cache.k, mixer.coupling(q, k)[1])


def count(name, **options):
    return sum(p.numel() for p in build_mixer(name, d_model=64, n_heads=4, **options).parameters())


def test_parameter_counts_match_across_integrators_and_the_ablation():
    euler, leapfrog, uncoupled = count("coupled-qk"), count("coupled-qk", integrator="leapfrog"), count("uncoupled-qk")
    assert euler == leapfrog == uncoupled == count("softmax") + 2 * 16 * 16 + 4
    assert count("coupled-qk", per_head_mlp=True) == count("softmax") + 4 * 2 * 16 * 16 + 4
    assert count("coupled-differential") == count("differential") + 2 * 16 * 16 + 4


def test_the_affine_coupling_costs_six_head_dims_squared_a_step_and_starts_as_the_identity():
    assert count("coupled-qk", integrator="affine", steps=2) == count("softmax") + 2 * 6 * 16 * 16
    assert count("coupled-qk", integrator="affine", per_head_mlp=True) == count("softmax") + 4 * 6 * 16 * 16
    torch.manual_seed(0)
    coupled = build_mixer("coupled-qk", d_model=64, n_heads=4, integrator="affine", steps=3)
    softmax = build_mixer("softmax", d_model=64, n_heads=4)
    softmax.load_state_dict(coupled.state_dict(), strict=False)
    x = torch.randn(2, 6, 64)
    torch.testing.assert_close(coupled(x)[0], softmax(x)[0], rtol=0, atol=0)


def test_the_affine_coupling_adds_about_0_3_percent_to_the_sixty_million_preset():
    """The follow-up's "about 0.3% extra parameters"."""
    model = load_config("coupled-qk-60m", ["model.mixer_options.coupled-qk.integrator=affine"]).sized_model()
    with torch.device("meta"):
        coupled = Decoder(model).num_params()
        model.mixer = "softmax"
        softmax = Decoder(model).num_params()
    assert 100 * (coupled / softmax - 1) == pytest.approx(0.3, abs=0.05)


def test_sixty_million_preset_overhead_is_about_0_11_percent():
    model = load_config("coupled-qk-60m").sized_model()  # its vocabulary: the preset's BPE of GPT-2's size
    with torch.device("meta"):
        coupled = Decoder(model).num_params()
        model.mixer = "softmax"
        softmax = Decoder(model).num_params()
    assert 55e6 < softmax < 65e6
    assert coupled - softmax == 8 * (2 * 64 * 64 + 8)
    assert 100 * (coupled / softmax - 1) == pytest.approx(0.11, abs=0.005)


@pytest.mark.parametrize(
    "options, message",
    [({"steps": 0}, "steps=0 must be between 1 and 7"), ({"steps": 8}, "steps=8 must be between 1 and 7"),
     ({"dt_init": 0.0}, "dt_init=0.0 must be positive"),
     ({"integrator": "rk4"}, "unknown coupled-qk.integrator 'rk4'. Known: affine, euler, leapfrog")],
)
def test_bad_coupling_options(options, message):
    with pytest.raises(ConfigError, match=message):
        build_mixer("coupled-qk", d_model=D_MODEL, n_heads=N_HEADS, **options)


def test_the_ablation_has_no_integrator_choice():
    with pytest.raises(ConfigError, match="unknown field 'uncoupled-qk.integrator'"):
        build_mixer("uncoupled-qk", integrator="leapfrog")
