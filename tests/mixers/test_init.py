"""Each mixer owns its initialisation: the decoder only calls its reset_parameters with the model's depth."""

import pytest
import torch

from attnlab import model as model_module
from attnlab.config import ModelConfig
from attnlab.mixers import build_mixer, list_mixers, mixer_class, mixer_config
from attnlab.model import Decoder

D_MODEL, N_HEADS, N_LAYERS = 32, 4, 3


def same_weights(a, b) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("name", list_mixers())
def test_a_mixer_built_alone_starts_as_it_does_in_a_decoder(name, monkeypatch):
    """Replaying the random state the decoder had when it built a mixer and when it initialised it, the
    same mixer built alone and initialised for that depth has the same weights: the decoder adds nothing."""
    cls = mixer_class(name)
    built, initialised = [], []
    build, reset = model_module.build_layer_mixer, cls.reset_parameters

    def recording_build(*args):
        built.append(torch.get_rng_state())
        return build(*args)

    def recording_reset(self, n_layers=1):
        initialised.append((torch.get_rng_state(), n_layers))
        reset(self, n_layers)

    monkeypatch.setattr(model_module, "build_layer_mixer", recording_build)
    monkeypatch.setattr(cls, "reset_parameters", recording_reset)
    decoder = Decoder(ModelConfig(vocab_size=40, d_model=D_MODEL, n_heads=N_HEADS, n_layers=N_LAYERS, mixer=name))
    monkeypatch.undo()

    assert len(built) == len(initialised) == N_LAYERS
    for i, block in enumerate(decoder.blocks):
        torch.set_rng_state(built[i])
        alone = cls(mixer_config(name, d_model=D_MODEL, n_heads=N_HEADS, layer_idx=i))
        state, depth = initialised[i]
        torch.set_rng_state(state)
        alone.reset_parameters(depth)
        assert depth == N_LAYERS
        same_weights(alone, block.mixer)


@pytest.mark.parametrize("name", list_mixers())
def test_build_mixer_initialises_the_mixer_as_one_layer(name):
    torch.manual_seed(0)
    built = build_mixer(name, d_model=D_MODEL, n_heads=N_HEADS)
    torch.manual_seed(0)
    by_hand = mixer_class(name)(mixer_config(name, d_model=D_MODEL, n_heads=N_HEADS))
    by_hand.reset_parameters(1)
    same_weights(built, by_hand)
    out_proj = getattr(built, "out_proj", None)
    if out_proj is not None:  # the residual projection is drawn with 0.02 / sqrt(2), not nn.Linear's default
        assert out_proj.weight.std().item() == pytest.approx(0.02 / 2 ** 0.5, rel=0.2)
