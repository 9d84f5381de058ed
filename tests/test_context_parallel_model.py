"""A whole decoder with its sequences split across two gloo ranks (context_parallel.Context): each rank's logits are
the whole sequence's at its positions, and the parameters' gradients summed over the ranks are the whole sequence's,
for every mixer that splits (attention over the gathered keys; the linear family and CCQ from the scanned state,
short convolutions reaching across the boundary; Boltzmann attention's sliding window reading the previous rank's
last keys). A mixer that does not split is refused in one line."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from attnlab.config import ModelConfig
from attnlab.context_parallel import Context
from attnlab.errors import ConfigError, UserError
from attnlab.model import Decoder, next_token_loss
from helpers import on_gloo_ranks

B, T, VOCAB, WORLD = 2, 22, 11, 2  # shards of 11 tokens: past one chunk of 4, not a multiple of it
CHUNKED = {"chunk_size": 4, "short_conv": True}  # the short convolution's window crosses the shard boundary
SPLIT = {
    "softmax": {}, "sigmoid": {}, "differential": {}, "stick-breaking": {}, "nonlinear-q": {}, "coupled-qk": {},
    "coupled-differential": {}, "linear": CHUNKED, "gla": CHUNKED, "gdn": CHUNKED, "ccq-gla": CHUNKED,
    "ccq-gdn": CHUNKED | {"ccq_decay": True},
    "softmax with learned positions": {"rope": False},  # the second rank's positions count on from the first's
    "s4d": {"modes": 4}, "interdomain": {"modes": 4}, "interdomain chunk form": {"modes": 4, "form": "chunk",
                                                                                 "chunk_size": 4},
    "interdomain linear query": {"modes": 4, "query": "linear"},
    # sliding banded inference: a query's chain reaches window - 1 = 5 keys back, into the previous rank's shard
    "boltzmann sliding": {"couplings": "distance", "inference": "banded", "band": 2, "window": 6, "j_init_std": 0.1},
}


def decoder(case: str) -> Decoder:
    torch.manual_seed(0)
    mixer = case.split()[0]
    cfg = ModelConfig(vocab_size=VOCAB, d_model=16, n_layers=2, n_heads=2, mixer=mixer,
                      mixer_options={mixer: SPLIT[case]}, positions=T if "positions" in case else 0)
    return Decoder(cfg).double()


def worker(rank: int, store: str, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        part = slice(rank * T // WORLD, (rank + 1) * T // WORLD)
        for mixer in SPLIT:
            tokens = torch.randint(0, VOCAB, (B, T + 1), generator=torch.Generator().manual_seed(1))
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            model = decoder(mixer)
            logits, _ = model(inputs[:, part], keep_states=False, context=Context())
            next_token_loss(logits, targets[:, part], reduction="sum").backward()
            whole = decoder(mixer)
            whole_logits, _ = whole(inputs, keep_states=False)
            next_token_loss(whole_logits, targets, reduction="sum").backward()
            out[mixer, rank] = {"logits": (logits.detach(), whole_logits.detach()[:, part]),
                                "grads": {name: p.grad for name, p in model.named_parameters()},
                                "whole": {name: p.grad for name, p in whole.named_parameters()}}
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks_ran(tmp_path_factory) -> dict:
    return on_gloo_ranks(worker, tmp_path_factory.mktemp("gloo"), WORLD)


@pytest.mark.parametrize("mixer", list(SPLIT))
def test_a_decoder_split_across_two_ranks_matches_one_process(mixer, ranks_ran):
    for rank in range(WORLD):
        torch.testing.assert_close(*ranks_ran[mixer, rank]["logits"], rtol=1e-9, atol=1e-9)
    whole = ranks_ran[mixer, 0]["whole"]
    for name, grad in whole.items():  # the ranks' gradients summed, as data parallelism sums them
        if grad is None:
            continue
        summed = sum(ranks_ran[mixer, rank]["grads"][name] for rank in range(WORLD))
        torch.testing.assert_close(summed, grad, rtol=1e-9, atol=1e-9, msg=f"{mixer}: the gradient of {name}")


def test_a_mixer_that_does_not_split_or_a_state_with_a_context_is_refused_in_one_line():
    boltzmann = Decoder(ModelConfig(vocab_size=VOCAB, d_model=16, n_layers=1, n_heads=2, mixer="boltzmann"))
    with pytest.raises(ConfigError, match="^boltzmann cannot split a sequence across ranks "
                                          r"\(train.context_parallel\)"):
        boltzmann(torch.zeros(1, 4, dtype=torch.long), context=Context())
    sliding = {"couplings": "distance", "inference": "banded", "band": 2}  # window 16: a halo of 15 keys
    boltzmann = Decoder(ModelConfig(vocab_size=VOCAB, d_model=16, n_layers=1, n_heads=2, mixer="boltzmann",
                                    mixer_options={"boltzmann": sliding}))
    with pytest.raises(UserError, match="a shard of 4 tokens is shorter than Boltzmann attention's halo"):
        boltzmann(torch.zeros(1, 4, dtype=torch.long), context=Context())
    gla = Decoder(ModelConfig(vocab_size=VOCAB, d_model=16, n_layers=1, n_heads=2, mixer="gla"))
    with pytest.raises(UserError, match="runs from its start and unpacked"):
        gla.blocks[0].mixer(torch.zeros(1, 4, 16), gla.blocks[0].mixer.init_state(1), context=Context())
