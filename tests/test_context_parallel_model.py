"""A whole decoder with its sequences split across two gloo ranks (ops.cp.Context): each rank's logits are
the whole sequence's at its positions, and the parameters' gradients summed over the ranks are the whole sequence's,
for every mixer that splits (attention over the gathered keys; the linear family and CCQ from the scanned state,
short convolutions reaching across the boundary; Boltzmann attention's sliding window reading the previous rank's
last keys), and on packed documents too, a document starting at the shard or running across it; a recurrent layer
returns the whole sequence's final state on every rank. In fp64 to rounding and in fp32 to 1e-5. A mixer that does
not split is refused in one line, and a shard shorter than what the next one reads across the boundary before
training."""

from __future__ import annotations

import dataclasses

import ema_mixer  # noqa: F401  (the examples' mixer, registered in every rank's process too)
import pytest
import torch
import torch.distributed as dist

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError, UserError
from attnlab.model import Decoder, next_token_loss
from attnlab.ops.cp import Context
from helpers import on_gloo_ranks

# each case in fp64, where the split must agree to rounding, and in fp32 to 1e-5, where a transition read off as
# the difference of two states (ops.cp.transition) would show its cancellation
PRECISIONS = {"fp64": (torch.float64, 1e-9), "fp32": (torch.float32, 1e-5)}
B, T, VOCAB, WORLD = 2, 22, 11, 2  # shards of 11 tokens: past one chunk of 4, not a multiple of it
CHUNKED = {"chunk_size": 4, "short_conv": True}  # the short convolution's window crosses the shard boundary
SPLIT = {
    "softmax": {}, "sigmoid": {}, "differential": {}, "stick-breaking": {}, "nonlinear-q": {}, "coupled-qk": {},
    "coupled-differential": {}, "linear": CHUNKED, "gla": CHUNKED, "gdn": CHUNKED, "ccq-gla": CHUNKED,
    "ccq-gdn": CHUNKED | {"ccq_decay": True}, "ccq-gla ridge read": CHUNKED | {"read": "ridge"},
    "softmax with learned positions": {"rope": False},  # the second rank's positions count on from the first's
    "s4d": {"modes": 4}, "interdomain": {"modes": 4}, "interdomain chunk form": {"modes": 4, "form": "chunk",
                                                                                 "chunk_size": 4},
    "interdomain linear query": {"modes": 4, "query": "linear"},
    # sliding banded inference: a query's chain reaches window - 1 = 5 keys back, into the previous rank's shard
    "boltzmann sliding": {"couplings": "distance", "inference": "banded", "band": 2, "window": 6, "j_init_std": 0.1},
    # over positions, a window as long as the sequence: the keys gathered up to the shard, as attention's
    "boltzmann banded": {"inference": "banded", "band": 2, "window": T, "j_init_std": 0.1},
    "boltzmann mean-field": {"inference": "mean-field", "window": T, "mean_field_iterations": 5, "j_init_std": 0.1},
    "ema": {},  # the examples' plugin mixer: it splits by calling an op that takes the context
}


def decoder(case: str, dtype=torch.float64) -> Decoder:
    torch.manual_seed(0)
    mixer = case.split()[0]
    cfg = ModelConfig(vocab_size=VOCAB, d_model=16, n_layers=2, n_heads=2, mixer=mixer,
                      mixer_options={mixer: SPLIT[case]}, positions=T if "positions" in case else 0)
    return Decoder(cfg).to(dtype)


# packed documents in one row of T tokens: a document starting exactly at the second shard, and one crossing it
DOCUMENTS = {"a boundary at the shard": [0, 5, 11, 14, T], "a document across the shard": [0, 3, 9, 17, T]}


CONTEXT = Context()  # one for every case: the documents it holds must follow each call's rows


def rows(cu_seqlens: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole rows' inputs and targets: B rows, or one of packed documents."""
    tokens = torch.randint(0, VOCAB, (1 if cu_seqlens is not None else B, T + 1),
                           generator=torch.Generator().manual_seed(1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:].clone()
    if cu_seqlens is not None:
        targets[0, cu_seqlens[1:] - 1] = -100  # a document's last token predicts nothing across its boundary
    return inputs, targets


def shard(rank: int) -> slice:
    return slice(rank * T // WORLD, (rank + 1) * T // WORLD)


def run_case(case: str, rank: int | None, cu_seqlens: torch.Tensor | None, dtype) -> dict:
    """The logits, states and gradients of one rank's shard, with a context; or, rank None, of one process's
    whole rows. States where a mixer keeps one: the whole sequences' final ones."""
    inputs, targets = rows(cu_seqlens)
    part = slice(None) if rank is None else shard(rank)
    model = decoder(case, dtype)
    logits, states = model(inputs[:, part], cu_seqlens=cu_seqlens, keep_states=cu_seqlens is None,
                           context=None if rank is None else CONTEXT)
    next_token_loss(logits, targets[:, part], reduction="sum").backward()
    return {"logits": logits.detach(), "states": detached(states),
            "grads": {name: p.grad for name, p in model.named_parameters()}}


def detached(states) -> list[dict]:
    """Each layer's state as {field: tensor} (a dataclass's tensors, CCQ's statistics among them), or None."""
    def fields(value, prefix=""):
        if torch.is_tensor(value):
            return {prefix: value.detach()}
        if dataclasses.is_dataclass(value):
            return {k: v for f in dataclasses.fields(value)
                    for k, v in fields(getattr(value, f.name), f"{prefix}.{f.name}").items()}
        return {prefix: value} if isinstance(value, int) else {}
    return [None if state is None else fields(state) for state in states]


def worker(rank: int, store: str, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        for precision, (dtype, _) in PRECISIONS.items():
            for i, case in enumerate(SPLIT):
                for documents, cu_seqlens in {None: None, **DOCUMENTS}.items():
                    key = case if documents is None else f"{case}, packed: {documents}"
                    cu_seqlens = None if cu_seqlens is None else torch.tensor(cu_seqlens)
                    out[key, precision, rank] = run_case(case, rank, cu_seqlens, dtype)
                    if i % WORLD == rank:  # the whole rows, the same on every rank: run once, the ranks taking turns
                        out[key, precision, "whole"] = run_case(case, None, cu_seqlens, dtype)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks_ran(tmp_path_factory) -> dict:
    return on_gloo_ranks(worker, tmp_path_factory.mktemp("gloo"), WORLD)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("mixer", [*SPLIT, *(f"{case}, packed: {documents}" for case in SPLIT
                                              for documents in DOCUMENTS)])
def test_a_decoder_split_across_two_ranks_matches_one_process(mixer, precision, ranks_ran):
    tolerance = PRECISIONS[precision][1]
    whole = ranks_ran[mixer, precision, "whole"]
    for rank in range(WORLD):
        torch.testing.assert_close(ranks_ran[mixer, precision, rank]["logits"], whole["logits"][:, shard(rank)],
                                   rtol=tolerance, atol=tolerance)
    for name, grad in whole["grads"].items():  # the ranks' gradients summed, as data parallelism sums them
        if grad is None:
            continue
        summed = sum(ranks_ran[mixer, precision, rank]["grads"][name] for rank in range(WORLD))
        torch.testing.assert_close(summed, grad, rtol=tolerance, atol=tolerance,
                                   msg=f"{mixer}: the gradient of {name}")


RECURRENT = [case for case in SPLIT if case.split()[0] in ("linear", "gla", "gdn", "ccq-gla", "ccq-gdn", "s4d",
                                                              "interdomain")]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("mixer", RECURRENT)
def test_a_recurrent_layer_split_across_two_ranks_returns_the_whole_sequences_final_state_on_each(mixer, precision,
                                                                                                  ranks_ran):
    tolerance = PRECISIONS[precision][1]
    whole = ranks_ran[mixer, precision, "whole"]["states"]
    for rank in range(WORLD):
        split = ranks_ran[mixer, precision, rank]["states"]
        assert all(state for state in split), f"{mixer}: a layer returned no state on rank {rank}"
        for layer, (ours, theirs) in enumerate(zip(split, whole, strict=True)):
            assert ours.keys() == theirs.keys()
            for field in ours:  # the memory, the short convolution's last inputs, CCQ's statistics, a position
                torch.testing.assert_close(ours[field], theirs[field], rtol=tolerance, atol=tolerance,
                                           msg=f"{mixer}, layer {layer}, rank {rank}: the state's {field}")


def test_a_mixer_that_does_not_split_or_a_state_with_a_context_is_refused_in_one_line():
    flex = {"mode": "h-only", "backend": "flex"}  # FlexAttention: not split
    boltzmann = Decoder(ModelConfig(vocab_size=VOCAB, d_model=16, n_layers=1, n_heads=2, mixer="boltzmann",
                                    mixer_options={"boltzmann": flex}))
    with pytest.raises(ConfigError, match="^boltzmann cannot split a sequence across ranks "
                                          r"\(train.context_parallel\)"):
        boltzmann(torch.zeros(1, 4, dtype=torch.long), context=Context())
    sliding = {"couplings": "distance", "inference": "banded", "band": 2}  # window 16: a halo of 15 keys
    boltzmann = Decoder(ModelConfig(vocab_size=VOCAB, d_model=16, n_layers=1, n_heads=2, mixer="boltzmann",
                                    mixer_options={"boltzmann": sliding}))
    with pytest.raises(UserError, match="a shard of 4 tokens is shorter than Boltzmann attention's halo"):
        boltzmann(torch.zeros(1, 4, dtype=torch.long), context=Context())
    gla = Decoder(ModelConfig(vocab_size=VOCAB, d_model=16, n_layers=1, n_heads=2, mixer="gla"))
    with pytest.raises(UserError, match="runs from its start: give no state with a context"):
        gla.blocks[0].mixer(torch.zeros(1, 4, 16), gla.blocks[0].mixer.init_state(1), context=Context())


# (mixer, its options, what the refusal names, the tokens a shard reads of the one before it)
HALOS = [("gdn", {"conv_size": 4}, "gdn's conv_size=4", 3), ("s4d", {"conv_size": 6}, "s4d's conv_size=6", 5),
         ("boltzmann", {"couplings": "distance", "inference": "banded", "window": 8, "band": 2},
          "boltzmann's window=8", 7)]


@pytest.mark.parametrize("mixer, options, option, halo", HALOS)
def test_a_shard_shorter_than_what_the_next_reads_across_its_boundary_is_refused_before_training(mixer, options,
                                                                                               option, halo):
    from attnlab.config import load_config
    from attnlab.train import _check_splits_sequences

    def check(seq_len):
        cfg = load_config("demo", [f"model.mixer={mixer}", "model.d_model=16", "model.n_heads=2", "model.n_layers=1",
                                   *(f"model.mixer_options.{mixer}.{k}={v}" for k, v in options.items()),
                                   f"train.seq_len={seq_len}", "train.context_parallel=4"])
        _check_splits_sequences(Decoder(dataclasses.replace(cfg.model, vocab_size=VOCAB)), cfg)

    with pytest.raises(ConfigError, match=rf"^train.seq_len={4 * (halo - 1)} split across train.context_parallel=4 "
                                          rf"ranks gives shards of {halo - 1} tokens, fewer than the {halo} that "
                                          rf"{option} reads across a shard's boundary: raise train.seq_len to at least "
                                          rf"{4 * halo} or lower"):
        check(4 * (halo - 1))
    check(4 * halo - 3)  # padded to 4 * halo: shards of halo tokens
