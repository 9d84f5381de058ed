"""Mixer.ablated: the mixer without its paper's own component is exactly the mechanism it extends, and the
component comes back unchanged afterwards."""

import pytest
import torch

from attnlab.mixers import build_mixer, list_mixers

D_MODEL, N_HEADS = 16, 2

# (mixer, its options, the mechanism it extends, that one's options): with the component removed the two compute
# the same
ABLATES_TO = [
    ("boltzmann", {"window": 8}, "boltzmann", {"window": 8, "mode": "h-only"}),
    ("coupled-qk", {}, "softmax", {}),
    ("coupled-qk", {"integrator": "affine", "steps": 2}, "softmax", {}),
    ("uncoupled-qk", {}, "softmax", {}),
    ("coupled-differential", {}, "differential", {}),
    ("coupled-differential", {"integrator": "affine"}, "differential", {}),
    ("ccq-gla", {}, "gla", {}),
    ("ccq-gla", {"read": "ridge"}, "gla", {}),
    ("ccq-gdn", {}, "gdn", {}),
]


def trained_like(name: str, **options):
    """A mixer whose own component is far from its initial value, as after training."""
    torch.manual_seed(0)
    mixer = build_mixer(name, d_model=D_MODEL, n_heads=N_HEADS, **options).double()
    with torch.no_grad():
        for param in mixer.parameters():
            param.add_(0.3 * torch.randn_like(param))
    return mixer


@pytest.mark.parametrize("name, options, base, base_options", ABLATES_TO,
                         ids=[f"{name}{options or ''}" for name, options, _, _ in ABLATES_TO])
def test_the_ablated_mixer_is_the_mechanism_it_extends_and_is_restored(name, options, base, base_options):
    mixer = trained_like(name, **options)
    reference = build_mixer(base, d_model=D_MODEL, n_heads=N_HEADS, **base_options).double()
    reference.load_state_dict(mixer.state_dict(), strict=False)  # the shared projections
    x = torch.randn(2, 8, D_MODEL, dtype=torch.float64)
    before = [p.clone() for p in mixer.parameters()]
    intact, _ = mixer(x)
    with mixer.ablated():
        ablated, _ = mixer(x)
    torch.testing.assert_close(ablated, reference(x)[0], rtol=1e-9, atol=1e-9)
    assert not torch.allclose(intact, ablated)  # the component was in use
    assert all(torch.equal(a, b) for a, b in zip(before, mixer.parameters(), strict=True))
    torch.testing.assert_close(mixer(x)[0], intact, rtol=0, atol=0)


def test_mixers_without_a_component_of_their_own_have_no_ablation():
    without = [name for name in list_mixers() if build_mixer(name, d_model=D_MODEL, n_heads=N_HEADS).ablated() is None]
    assert {"softmax", "sigmoid", "gla", "gdn", "linear", "differential"} <= set(without)
    assert not {name for name, *_ in ABLATES_TO} & set(without)


def test_nonlinear_q_without_f_reads_the_input_itself_as_its_query():
    """Its ablation is softmax attention whose W_q is the identity, with its own W_k and W_v."""
    mixer = trained_like("nonlinear-q")
    reference = build_mixer("softmax", d_model=D_MODEL, n_heads=N_HEADS).double()
    with torch.no_grad():
        reference.qkv.weight.copy_(torch.cat((torch.eye(D_MODEL, dtype=torch.float64), mixer.kv.weight)))
        reference.out_proj.weight.copy_(mixer.out_proj.weight)
    x = torch.randn(2, 8, D_MODEL, dtype=torch.float64)
    intact, _ = mixer(x)
    with mixer.ablated():
        ablated, _ = mixer(x)
    torch.testing.assert_close(ablated, reference(x)[0], rtol=1e-9, atol=1e-9)
    assert not torch.allclose(intact, ablated)
    torch.testing.assert_close(mixer(x)[0], intact, rtol=0, atol=0)


def test_interdomain_without_its_query_path_reads_every_token_with_the_mean_query_and_is_restored():
    mixer = trained_like("interdomain")
    directions = []
    read = mixer.read
    mixer.read = lambda xi_q, *rest, **options: (directions.append(xi_q), read(xi_q, *rest, **options))[1]
    x = torch.randn(2, 8, D_MODEL, dtype=torch.float64)
    before = [p.clone() for p in mixer.parameters()]
    intact, _ = mixer(x)
    with mixer.ablated():
        ablated, _ = mixer(x)
    own, shared = directions
    expected = torch.nn.functional.normalize(own.mean(dim=(0, 2), keepdim=True), dim=-1)
    torch.testing.assert_close(shared, expected.expand_as(own), rtol=0, atol=0)
    assert not torch.allclose(intact, ablated)  # the queries differed from token to token
    assert all(torch.equal(a, b) for a, b in zip(before, mixer.parameters(), strict=True))
    torch.testing.assert_close(mixer(x)[0], intact, rtol=0, atol=0)
    assert build_mixer("interdomain", d_model=D_MODEL, n_heads=N_HEADS, query="linear").ablated() is None


def test_interdomain_without_its_query_path_decodes_with_the_direction_of_its_prompt():
    mixer = trained_like("interdomain")
    x = torch.randn(1, 8, D_MODEL, dtype=torch.float64)
    with mixer.ablated():
        prompt, state = mixer(x[:, :6])
        direction = mixer.mean_query
        steps = [prompt]
        for t in (6, 7):
            y, state = mixer(x[:, t : t + 1], state)
            steps.append(y)
        assert torch.equal(mixer.mean_query, direction)  # decoding keeps the prompt's direction
        mixer.shared_direction = lambda xi_q, state: direction.expand_as(xi_q)
        whole, _ = mixer(x)  # every token read with the prompt's direction at once
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=1e-9, atol=1e-9)
    del mixer.shared_direction
    with mixer.ablated(), pytest.raises(ValueError, match="starts a sequence"):
        mixer(x[:, :1], state)
