"""The interdomain and s4d mixers: parameter counts of the paper's presets, the feature map, the
ablation cube, the normalised variant and the constant decoding state."""

import pytest
import torch

from attnlab.config import TrainConfig, load_config
from attnlab.errors import ConfigError
from attnlab.mixers import build_mixer
from attnlab.model import Decoder
from attnlab.train import param_groups

# the paper's Table 3: (softmax, interdomain, s4d-only) parameters at each scale
PAPER_COUNTS = {
    "125m": (134_105_856, 135_416_208, 135_425_424),
    "350m": (373_867_520, 377_360_768, 377_385_344),
    "760m": (777_856_512, 781_498_752, 781_523_328),
    "1.3b": (1_345_423_360, 1_352_406_784, 1_352_455_936),
}


@pytest.mark.parametrize("scale", PAPER_COUNTS)
def test_paper_presets_have_the_papers_parameter_counts(scale):
    cfg = load_config(f"interdomain-{scale}")
    counts = {}
    with torch.device("meta"):
        for mixer in ("softmax", "interdomain", "s4d"):
            cfg.model.mixer = mixer
            counts[mixer] = Decoder(cfg.model).num_params()
    softmax, interdomain, s4d_only = PAPER_COUNTS[scale]
    unplaced = cfg.model.n_layers * 2 * (cfg.model.d_model // cfg.model.n_heads)  # 2 d_h per layer, see README
    assert counts["softmax"] == softmax
    assert counts["interdomain"] == interdomain - unplaced
    assert counts["s4d"] == s4d_only - unplaced


def test_state_is_the_papers_size_and_does_not_grow():
    mixer = build_mixer("interdomain", d_model=2048, n_heads=32, modes=64)
    conv = 3 * 2 * 2048  # three past q and k vectors
    assert mixer.state_size(16) == mixer.state_size(4096) == 524_288 + conv  # the paper's Table 5 plus conv
    small = build_mixer("interdomain", d_model=32, n_heads=4, modes=8)
    x = torch.randn(1, 64, 32)
    assert small(x[:, :16])[1].memory.shape == small(x)[1].memory.shape == (1, 4, 8, 16)


def test_s4d_only_has_the_same_state_shape():
    ia = build_mixer("interdomain", d_model=32, n_heads=4, modes=8)
    s4d = build_mixer("s4d", d_model=32, n_heads=4, modes=8)
    x = torch.randn(2, 10, 32)
    assert ia(x)[1].memory.shape == s4d(x)[1].memory.shape and ia.state_size(10) == s4d.state_size(10)


@pytest.mark.parametrize("rope", [False, True])
def test_s4d_is_the_cube_corner_of_generic_inputs_and_a_contraction(rope):
    """The s4d mixer is interdomain with input=single and query=linear: the same parameters from the same seed,
    and the same outputs, states and gradients."""
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    mixers = []
    for name, options in [("s4d", {}), ("interdomain", {"input": "single", "query": "linear"})]:
        torch.manual_seed(0)
        mixers.append(build_mixer(name, d_model=32, n_heads=4, modes=8, rope=rope, **options).double())
    s4d, corner = mixers
    assert dict(s4d.named_parameters()).keys() == dict(corner.named_parameters()).keys()
    (y, state), (y_corner, state_corner) = s4d(x), corner(x)
    torch.testing.assert_close(y, y_corner)
    torch.testing.assert_close(state.memory, state_corner.memory)
    y.square().sum().backward()
    y_corner.square().sum().backward()
    for (name, p), q in zip(s4d.named_parameters(), corner.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_feature_map_and_input_norm():
    torch.manual_seed(0)
    mixer = build_mixer("interdomain", d_model=32, n_heads=4, modes=8, rope=False).double()
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    k = mixer.conv(torch.cat((mixer.q_proj(x), mixer.k_proj(x)), -1))[0][..., 32:]
    xi_k = torch.nn.functional.normalize(mixer.heads(k), dim=-1)
    torch.testing.assert_close(xi_k.norm(dim=-1), torch.ones(1, 4, 6, dtype=torch.float64))
    # unit-norm rows: RMSNorm(xi) = sqrt(R) g * xi
    torch.testing.assert_close(mixer.key_norm(xi_k), 8**0.5 * mixer.key_norm.weight * xi_k, rtol=1e-5, atol=0)


def test_initialisation():
    mixer = build_mixer("interdomain", d_model=64, n_heads=4, modes=16)
    lam, _, _ = mixer.ssm()
    dt = mixer.log_dt.exp()
    assert (lam.abs() < 1).all() and ((dt >= 1e-3) & (dt <= 1e-1)).all()
    torch.testing.assert_close(mixer.log_A_real.exp(), torch.full((4, 16), 0.5))


def test_ssm_parameters_get_a_capped_rate_and_no_decay():
    model = Decoder(load_config("interdomain-char", ["model.n_layers=1", "model.vocab_size=50"]).model)
    groups = {id(p): (g["peak_lr"], g["weight_decay"]) for g in param_groups(model, TrainConfig(lr=3e-3))
              for p in g["params"]}
    mixer = model.blocks[0].mixer
    for p in (mixer.log_dt, mixer.log_A_real, mixer.A_imag, mixer.C, mixer.key_norm.bias):
        assert groups[id(p)] == (1e-3, 0.0)
    assert groups[id(mixer.q_proj.weight)] == (3e-3, 0.1)


@pytest.mark.parametrize("input_kind", ["dual", "single"])
@pytest.mark.parametrize("query", ["conditioned", "linear"])
@pytest.mark.parametrize("rope", [True, False])
def test_every_cell_of_the_ablation_cube_builds_and_runs(input_kind, query, rope):
    mixer = build_mixer("interdomain", d_model=32, n_heads=4, modes=8, input=input_kind, query=query, rope=rope)
    y, _ = mixer(torch.randn(2, 9, 32))
    assert y.shape == (2, 9, 32) and torch.isfinite(y).all()
    assert (mixer.q_proj is None) == (query == "linear")


def test_normalised_variant_divides_by_the_constant_channel():
    torch.manual_seed(0)
    plain = build_mixer("interdomain", d_model=16, n_heads=2, modes=4).double()
    normed = build_mixer("interdomain", d_model=16, n_heads=2, modes=4, normalize=True).double()
    normed.load_state_dict(plain.state_dict())
    x = torch.randn(1, 20, 16, dtype=torch.float64)
    full, _ = normed(x)
    y, state = normed(x[:, :11])
    outputs = [y]
    for t in range(11, 20):
        y, state = normed(x[:, t : t + 1], state)
        outputs.append(y)
    torch.testing.assert_close(torch.cat(outputs, 1), full, rtol=1e-8, atol=1e-8)
    assert state.memory.shape[-1] == plain(x)[1].memory.shape[-1] + 1  # the constant channel's state
    assert not torch.allclose(plain(x)[0], full)


def test_long_contexts_stay_finite():
    mixer = build_mixer("interdomain", d_model=32, n_heads=4, modes=8)
    y, _ = mixer(torch.randn(1, 448, 32))  # 3.5x a 128-token training context
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("options, message",
                         [({"input": "both"}, "unknown interdomain.input 'both'"),
                          ({"readout": "re"}, "unknown interdomain.readout 're'"),
                          ({"init": "legs"}, "unknown interdomain.init 'legs'. Known: inv, lin"),
                          ({"query": "linear", "normalize": True}, "query=linear has no query readout")])
def test_bad_options(options, message):
    with pytest.raises(ConfigError, match=message):
        build_mixer("interdomain", d_model=32, n_heads=4, **options)
