"""train.compile: compiled blocks compute what the eager ones do; excluded mixers stay eager with a reason."""

import torch

from attnlab.config import ModelConfig
from attnlab.model import Decoder


def test_compiled_blocks_equal_eager_and_a_model_compiled_after_others_is_compiled_too(monkeypatch):
    """Each model's compiled forward equals its eager one and keeps its parameter names (checkpoints keep their
    keys), and models compiled one after another (a suite's runs) are each compiled, not left eager."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)  # as a suite's later models meet the real 8
    tokens = torch.randint(32, (2, 16))
    for mixer in ["softmax", "gla"]:  # the second would be Block.forward's 3rd and 4th variants, past the limit
        torch.manual_seed(0)
        model = Decoder(ModelConfig(vocab_size=32, d_model=32, n_layers=1, n_heads=2, mixer=mixer))
        eager, _ = model(tokens)
        names = [n for n, _ in model.named_parameters()]
        model.compile_blocks()
        graphs = counters["stats"]["unique_graphs"]
        compiled, _ = model(tokens)
        with torch.no_grad():
            model(tokens)
        assert counters["stats"]["unique_graphs"] == graphs + 2  # with and without grad, neither left eager
        torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-5)
        assert [n for n, _ in model.named_parameters()] == names


def test_an_excluded_mixer_stays_eager_and_says_why(monkeypatch):
    from attnlab.mixers.softmax import SoftmaxAttention

    monkeypatch.setattr(SoftmaxAttention, "compile_exclusion", "a reason")
    model = Decoder(ModelConfig(vocab_size=32, d_model=32, n_layers=2, n_heads=2, mixer="softmax"))
    lines = []
    model.compile_blocks(log=lines.append)
    assert lines == [f"block {i} (softmax) runs eagerly under train.compile: a reason" for i in range(2)]
    assert all(block._compiled_call_impl is None for block in model.blocks)


def test_the_mixers_that_do_not_compile_say_why():
    from attnlab.mixers.registry import mixer_class

    assert mixer_class("boltzmann").compile_exclusion and mixer_class("interdomain").compile_exclusion
    assert mixer_class("s4d").compile_exclusion is None  # s4d shares the module but compiles
