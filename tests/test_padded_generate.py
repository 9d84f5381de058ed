"""Prompts of different lengths in one batch: Decoder.generate with an attention mask (padding on the left or the
right) gives every row what it gets alone, for every registered mixer; the rows' states continue batched where
they stack and row by row where they do not."""

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError, UserError
from attnlab.mixers import build_mixer
from attnlab.model import Decoder
from attnlab.ops.packing import stack_rows
from helpers import CASE_IDS, CASES

VOCAB, PAD, NEW = 40, 0, 5
PROMPTS = [[5, 9, 3, 7, 2, 11], [4], [8, 1, 6]]  # lengths 6, 1 and 3: no two the same


def decoder(name: str, options: dict, positions: int = 0) -> Decoder:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, layers=[name, "gla"],
                      mixer_options={name: options} if options else {}, positions=positions)
    model = Decoder(cfg).double().eval()
    with torch.no_grad():  # weights large enough that the greedy tokens depend on the whole prompt
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def padded(prompts, side: str):
    width = max(map(len, prompts))
    rows, masks = [], []
    for p in prompts:
        pad = [PAD] * (width - len(p))
        rows.append(pad + p if side == "left" else p + pad)
        masks.append([0] * len(pad) + [1] * len(p) if side == "left" else [1] * len(p) + [0] * len(pad))
    return torch.tensor(rows), torch.tensor(masks)


def tokens_of(out: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    full = torch.cat((mask, torch.ones(len(out), out.shape[1] - mask.shape[1], dtype=mask.dtype)), 1).bool()
    return [row[keep].tolist() for row, keep in zip(out, full, strict=True)]


@pytest.mark.parametrize("name, options", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_generates_what_each_prompt_generates_alone(name, options, side):
    model = decoder(name, options)
    alone = [model.generate(torch.tensor([p]), NEW, temperature=0)[0].tolist() for p in PROMPTS]
    ids, mask = padded(PROMPTS, side)
    out = model.generate(ids, NEW, temperature=0, attention_mask=mask)
    assert out.shape == (len(PROMPTS), ids.shape[1] + NEW)
    assert tokens_of(out, mask) == alone


@pytest.mark.parametrize("positions", [0, 32])
def test_padding_with_learned_positions_and_a_repetition_penalty(positions):
    """Positions count each row's own tokens; the penalty sees each row's tokens, not its padding."""
    model = decoder("softmax", {}, positions)
    prompts = [[PAD, 3, PAD, 9], [7], [PAD]]  # the pad id is a token too where the mask says so
    alone = [model.generate(torch.tensor([p]), NEW, temperature=0, repetition_penalty=2.5)[0].tolist()
             for p in prompts]
    for side in ("left", "right"):
        ids, mask = padded(prompts, side)
        out = model.generate(ids, NEW, temperature=0, repetition_penalty=2.5, attention_mask=mask)
        assert tokens_of(out, mask) == alone


def test_a_padded_read_is_the_rows_read_alone():
    """Decoder.forward_padded: each row's logits where it has tokens, a pad's those of the token before it."""
    model = decoder("gdn", {})
    ids, mask = padded(PROMPTS, "right")
    logits, states = model.forward_padded(ids, mask)
    for row, prompt in enumerate(PROMPTS):
        alone, _ = model(torch.tensor([prompt]))
        torch.testing.assert_close(logits[row, : len(prompt)], alone[0], rtol=0, atol=1e-10)
        assert bool((logits[row, len(prompt):] == logits[row, len(prompt) - 1]).all())
    ids, mask = padded(PROMPTS, "left")
    logits, _ = model.forward_padded(ids, mask)
    assert bool((logits[1, :-1] == 0).all())  # before a row's first token nothing has been read
    assert [len(layer) for layer in states] == [len(PROMPTS)] * 2


def test_states_of_rows_continue_batched_where_they_stack_and_row_by_row_where_not(monkeypatch):
    x = torch.randn(1, 10, 32, dtype=torch.float64)
    for name, batched in (("gla", True), ("softmax", False)):  # fixed-size states; KV caches of 6 and 4 tokens
        torch.manual_seed(0)
        mixer = build_mixer(name, d_model=32, n_heads=4).double()
        _, states = mixer(x, cu_seqlens=torch.tensor([0, 6, 10]))
        assert (stack_rows(states) is not None) == batched
        forward, calls = mixer.forward, []
        monkeypatch.setattr(mixer, "forward", lambda *args, forward=forward, calls=calls: calls.append(1) or
                            forward(*args))
        step = torch.randn(2, 1, 32, dtype=torch.float64)
        y, _ = mixer(step, states)
        assert len(calls) == (1 if batched else 2)
        for row, state in enumerate(states):
            torch.testing.assert_close(y[row : row + 1], forward(step[row : row + 1], state)[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("mask, problem", [
    ([[1, 1, 1], [0, 1, 1]], "shape"),
    ([[1, 0, 1, 1], [0, 1, 1, 0]], "row 0 marks 2 runs"),
    ([[1, 1, 1, 1], [0, 0, 0, 0]], "row 1 marks 0 runs"),
    ([[1, 1, 1, 2], [0, 1, 1, 1]], "only 1"),
])
def test_a_malformed_attention_mask_is_one_line(mask, problem):
    model = decoder("softmax", {})
    with pytest.raises(ConfigError, match=problem) as err:
        model.generate(torch.ones(2, 4, dtype=torch.long), 2, temperature=0, attention_mask=torch.tensor(mask))
    assert "\n" not in str(err.value)


def test_a_sliding_view_is_refused_for_a_padded_batch():
    ids, mask = padded(PROMPTS, "left")
    with pytest.raises(ConfigError, match="context"):
        decoder("softmax", {}).generate(ids, 2, context=4, attention_mask=mask)


def test_a_list_of_states_holds_one_per_row():
    mixer = build_mixer("gla", d_model=32, n_heads=4)
    _, states = mixer(torch.randn(1, 5, 32), cu_seqlens=torch.tensor([0, 2, 5]))
    with pytest.raises(UserError, match="one per row: got 2 for a batch of 3"):
        mixer(torch.randn(3, 1, 32), states)


CLOSE_PROMPTS = [[5, 9, 3, 7, 2, 11, 6, 1], [4, 8, 1, 6, 3, 10, 2]]  # 8 and 7 tokens: one group of the padded read


@pytest.mark.parametrize("name, options", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_prompts_of_close_lengths_read_as_one_padded_group_generate_what_each_does_alone(name, options, side):
    """The shorter prompt's states come from a batch padded to the longer one: they must hold none of its padding."""
    model = decoder(name, options)
    alone = [model.generate(torch.tensor([p]), NEW, temperature=0)[0].tolist() for p in CLOSE_PROMPTS]
    ids, mask = padded(CLOSE_PROMPTS, side)
    assert tokens_of(model.generate(ids, NEW, temperature=0, attention_mask=mask), mask) == alone
