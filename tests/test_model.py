import math

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError
from attnlab.model import Decoder, ffn_width

VOCAB = 50


def tiny(**fields):
    torch.manual_seed(0)
    values = dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4) | fields
    return Decoder(ModelConfig(**values)).eval()


def test_logits_shape_and_token_causality():
    model = tiny()
    tokens = torch.randint(VOCAB, (2, 10))
    changed = tokens.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % VOCAB
    logits, _ = model(tokens)
    assert logits.shape == (2, 10, VOCAB)
    torch.testing.assert_close(model(changed)[0][:, :6], logits[:, :6], rtol=0, atol=0)


# learned absolute positions instead of RoPE: decoding must pass each token's position on
ABSOLUTE = dict(positions=12, mixer_options={"softmax": {"rope": False}})


@pytest.mark.parametrize("fields", [{}, {"layers": ["softmax", "differential", "sigmoid"]}, ABSOLUTE])
def test_incremental_decoding_equals_full_forward(fields):
    model = tiny(n_layers=3, **fields)
    tokens = torch.randint(VOCAB, (2, 12))
    full, _ = model(tokens)
    logits, states = model(tokens[:, :4])
    steps = [logits]
    for t in range(4, 12):
        logits, states = model(tokens[:, t : t + 1], states, start=t)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("fields", [{}, ABSOLUTE])
def test_greedy_generate_matches_argmax_of_full_forward(fields):
    model = tiny(**fields)
    prompt = torch.randint(VOCAB, (2, 5))
    out = model.generate(prompt, max_new_tokens=6, temperature=0)
    assert out.shape == (2, 11) and torch.equal(out[:, :5], prompt)
    for t in range(5, 11):  # each generated token is the argmax given everything before it
        logits, _ = model(out[:, :t])
        assert torch.equal(out[:, t], logits[:, -1].argmax(-1))


def test_learned_positions_move_outputs_and_have_a_limit():
    model = tiny(**ABSOLUTE)
    tokens = torch.randint(VOCAB, (1, 4))
    logits, _ = model(tokens)
    _, states = model(tokens[:, :3])
    shifted, _ = model(tokens[:, 3:], states, start=5)  # a wrong position gives a different output
    assert not torch.allclose(shifted, logits[:, 3:])
    with pytest.raises(ValueError, match="model.positions"):
        model(torch.randint(VOCAB, (1, 13)))


def test_sampling_respects_top_k_and_seed():
    model = tiny()
    prompt = torch.randint(VOCAB, (1, 3))
    a = model.generate(prompt, 20, temperature=1.0, top_k=1, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, model.generate(prompt, 20, temperature=0))
    b = model.generate(prompt, 20, temperature=1.5, generator=torch.Generator().manual_seed(7))
    c = model.generate(prompt, 20, temperature=1.5, generator=torch.Generator().manual_seed(7))
    assert torch.equal(b, c)


def test_hybrid_layers_build_the_listed_mixers():
    model = tiny(n_layers=3, layers=["softmax", "differential", "sigmoid"])
    assert [b.mixer.name for b in model.blocks] == ["softmax", "differential", "sigmoid"]
    assert [b.mixer.cfg.layer_idx for b in model.blocks] == [0, 1, 2]


def test_mixer_options_reach_the_mixer():
    model = tiny(mixer_options={"softmax": {"rope": False}})
    assert all(b.mixer.rotary is None for b in model.blocks)
    with pytest.raises(ConfigError, match="set by the decoder"):
        tiny(mixer_options={"softmax": {"d_model": 64}})


def test_tied_and_untied_heads():
    tied, untied = tiny(), tiny(tie_embeddings=False)
    assert tied.head.weight is tied.embed.weight
    assert untied.num_params() - tied.num_params() == VOCAB * 32


def test_ffn_width_matches_a_4x_mlp_budget():
    assert ffn_width(ModelConfig(d_model=384)) == 1024
    assert ffn_width(ModelConfig(d_model=128, ffn_hidden=100)) == 100


def test_state_size_grows_with_context_for_attention():
    model = tiny()
    assert model.state_size(100) == 2 * model.state_size(50) == 2 * 2 * 2 * 32 * 50


def test_generation_with_a_bounded_context_rereads_the_newest_tokens():
    model = tiny()
    with torch.no_grad():  # large weights, so that what the model sees changes what it says
        for p in model.parameters():
            p.normal_(0, 1.0)
    prompt = torch.randint(VOCAB, (2, 5))
    out = model.generate(prompt, max_new_tokens=20, temperature=0, context=8)
    # reference: recompute from scratch on the same view the rule describes
    tokens, view_start = prompt, 0
    for _ in range(20):
        logits, _ = model(tokens[:, view_start:])
        tokens = torch.cat((tokens, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
        if tokens.shape[1] - view_start > 8:
            view_start = tokens.shape[1] - 4
    assert torch.equal(out, tokens)
    assert not torch.equal(out, model.generate(prompt, max_new_tokens=20, temperature=0))


def test_the_loss_keeps_fp64_and_ignores_masked_targets():
    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2)).double()
    tokens, targets = torch.randint(11, (2, 5)), torch.randint(11, (2, 5))
    targets[0, :2] = -100
    logits, _ = model(tokens)
    kept = targets != -100
    expected = -torch.log_softmax(logits, -1)[kept].gather(1, targets[kept][:, None]).mean()
    loss = model.loss(tokens, targets)
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-14)


def test_the_papers_block_gelu_feed_forward_and_layernorm():
    cfg = ModelConfig(vocab_size=61, d_model=64, n_layers=1, n_heads=1, ffn_hidden=128, ffn_kind="gelu", norm="layer")
    model = Decoder(cfg)
    block = model.blocks[0]
    assert isinstance(block.mlp_norm, torch.nn.LayerNorm) and isinstance(model.norm, torch.nn.LayerNorm)
    assert sum(p.numel() for p in block.mlp.parameters()) == 2 * 64 * 128 + 128 + 64  # two layers with biases
    x = torch.randn(2, 5, 64)
    expected = block.mlp.down(torch.nn.functional.gelu(block.mlp.up(x)))
    torch.testing.assert_close(block.mlp(x), expected)
    assert ffn_width(ModelConfig(d_model=64, ffn_kind="gelu")) == 256
    with pytest.raises(ConfigError, match="model.ffn_kind"):
        ModelConfig(ffn_kind="relu").validate()
    with pytest.raises(ConfigError, match="model.norm"):
        ModelConfig(norm="batch").validate()


def reference_forward(model: Decoder, tokens: torch.Tensor, eps: float) -> torch.Tensor:
    """The decoder's forward written out with every norm computed here at eps: x + mixer(norm(x)), then
    x + FFN(norm(x)), per block; the head of the final norm."""
    def norm(module, x):
        if isinstance(module, torch.nn.LayerNorm):
            return torch.nn.functional.layer_norm(x, x.shape[-1:], module.weight, module.bias, eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * module.weight

    x = model.embed(tokens)
    for block in model.blocks:
        x = x + block.mixer(norm(block.mixer_norm, x))[0]
        x = x + block.mlp(norm(block.mlp_norm, x))
    return model.head(norm(model.norm, x))


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_every_norm_of_the_decoder_uses_the_configured_eps(kind):
    # the activations' mean square is about 0.02^2 at init: an eps of 0.01 changes every norm's output a lot
    model = tiny(norm=kind, norm_eps=0.01)
    norms = [model.norm, *(n for b in model.blocks for n in (b.mixer_norm, b.mlp_norm))]
    with torch.no_grad():
        for n in norms:  # gains other than 1, so that the reference must apply them too
            n.weight.uniform_(0.5, 1.5)
    tokens = torch.randint(VOCAB, (2, 7))
    logits, _ = model(tokens)
    torch.testing.assert_close(logits, reference_forward(model, tokens, 0.01), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(logits, reference_forward(model, tokens, 1e-6), rtol=1e-2, atol=1e-4)


def test_the_parameter_count_adds_up():
    # embedding V*d; per block two norm gains, attention's qkv and output (4 d^2) and SwiGLU's three matrices;
    # the final norm; the head is the embedding
    d, hidden = 32, ffn_width(ModelConfig(d_model=32))
    assert hidden == 96  # 8/3 * 32 rounded up to a multiple of 32
    assert tiny().num_params() == VOCAB * d + 2 * (2 * d + 4 * d * d + 3 * d * hidden) + d
    no_ffn = tiny(ffn=False, tie_embeddings=False)
    assert no_ffn.num_params() == VOCAB * d + 2 * (d + 4 * d * d) + d + VOCAB * d


def test_initial_weights_and_loss():
    model = tiny(tie_embeddings=False, positions=16, mixer_options={"softmax": {"rope": False}})
    for weight in (model.embed.weight, model.position.weight, model.head.weight):
        assert abs(weight.std().item() - 0.02) < 0.002
    # N(0, 0.02) weights give near-uniform predictions: a loss of about ln(vocab)
    tokens = torch.randint(VOCAB, (4, 16))
    assert abs(model.loss(tokens, torch.randint(VOCAB, (4, 16))).item() - math.log(VOCAB)) < 0.02
