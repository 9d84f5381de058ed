"""The packed-sequence contract every registered mixer must pass: a row of sequences laid end to end with their
starts (cu_seqlens) gives each sequence what it gets alone — outputs, the state it ends in, and gradients."""

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.errors import UserError
from attnlab.mixers import build_mixer
from attnlab.model import Decoder
from attnlab.nn import ShortConv
from attnlab.ops.packing import length_groups, sequences
from helpers import CASE_IDS, CASES

D_MODEL, N_HEADS = 32, 4
LENGTHS = [1, 5, 7, 11, 3]  # a single token and lengths that are no chunk multiple (with one more step, at most
# the 12 tokens that exact Boltzmann inference and the other contract tests take)
contract = pytest.mark.parametrize("name, options", CASES, ids=CASE_IDS)


def make(name, **options):
    torch.manual_seed(0)
    return build_mixer(name, d_model=D_MODEL, n_heads=N_HEADS, **options).double()


def boundaries(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])


def alone(mixer, x, lengths):
    """Each sequence run on its own: (outputs laid end to end, the state each ends in)."""
    outputs, states = [], []
    for piece in x.split(lengths, dim=1):
        y, state = mixer(piece)
        outputs.append(y)
        states.append(state)
    return torch.cat(outputs, dim=1), states


def assert_same_outputs_and_gradients(mixer, x, y, expected, rtol=0.0, atol=1e-10):
    """y equals expected, and so do the gradients of a random projection of each with respect to x and every
    parameter (None where a parameter takes no part)."""
    torch.testing.assert_close(y, expected, rtol=rtol, atol=atol)
    weights = torch.randn_like(y)
    inputs = [x, *mixer.parameters()]
    grads = torch.autograd.grad((y * weights).sum(), inputs, allow_unused=True, retain_graph=True)
    expected_grads = torch.autograd.grad((expected * weights).sum(), inputs, allow_unused=True, retain_graph=True)
    for got, want in zip(grads, expected_grads, strict=True):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


@contract
def test_a_packed_row_gives_each_sequence_what_it_gets_alone(name, options):
    mixer = make(name, **options)
    x = torch.randn(1, sum(LENGTHS), D_MODEL, dtype=torch.float64, requires_grad=True)
    packed, packed_states = mixer(x, cu_seqlens=boundaries(LENGTHS))
    expected, expected_states = alone(mixer, x, LENGTHS)
    assert_same_outputs_and_gradients(mixer, x, packed, expected)
    # each sequence's state continues as the state it has alone: the next token's output is the same
    assert len(packed_states) == len(LENGTHS)
    step = torch.randn(1, 1, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        for state, expected_state in zip(packed_states, expected_states, strict=True):
            torch.testing.assert_close(mixer(step, state)[0], mixer(step, expected_state)[0], rtol=0, atol=1e-10)


@contract
def test_a_packed_row_without_states_gives_the_same_outputs_and_gradients(name, options):
    """keep_state=False (training, scoring) may take another form (the mixer's fastest): the same numbers."""
    mixer = make(name, **options)
    x = torch.randn(1, sum(LENGTHS), D_MODEL, dtype=torch.float64, requires_grad=True)
    y, no_states = mixer(x, cu_seqlens=boundaries(LENGTHS), keep_state=False)
    assert no_states is None
    assert_same_outputs_and_gradients(mixer, x, y, alone(mixer, x, LENGTHS)[0])


@contract
def test_no_token_reads_another_sequence(name, options):
    mixer = make(name, **options)
    x = torch.randn(1, sum(LENGTHS), D_MODEL, dtype=torch.float64)
    other = x.clone()
    other[:, 6:13] = torch.randn(1, 7, D_MODEL, dtype=torch.float64)  # the third sequence only
    y, _ = mixer(x, cu_seqlens=boundaries(LENGTHS))
    y2, _ = mixer(other, cu_seqlens=boundaries(LENGTHS))
    torch.testing.assert_close(torch.cat((y[:, :6], y[:, 13:]), 1), torch.cat((y2[:, :6], y2[:, 13:]), 1),
                               rtol=0, atol=1e-12)
    assert not torch.allclose(y[:, 6:13], y2[:, 6:13])


@pytest.mark.parametrize("cu_seqlens, problem", [
    ([0, 5, 3, 8], "must be strictly increasing"),
    ([0, 5, 5, 8], "must be strictly increasing"),
    ([1, 5, 8], "must start at 0"),
    ([0, 5, 9], "must end at the row's length 8; got 9"),
    ([0, 5, 7], "must end at the row's length 8; got 7"),
    ([0.0, 8.0], "must be a 1-D tensor of integers"),
])
def test_malformed_boundaries_are_one_line(cu_seqlens, problem):
    mixer = make("softmax")
    with pytest.raises(UserError, match=problem) as err:
        mixer(torch.randn(1, 8, D_MODEL, dtype=torch.float64), cu_seqlens=torch.tensor(cu_seqlens))
    assert "\n" not in str(err.value)


def test_a_packed_call_takes_one_row_and_no_state():
    mixer = make("gla")
    with pytest.raises(UserError, match="must be \\[1, N, d_model\\]; got batch 2"):
        mixer(torch.randn(2, 8, D_MODEL, dtype=torch.float64), cu_seqlens=torch.tensor([0, 8]))
    _, state = mixer(torch.randn(1, 3, D_MODEL, dtype=torch.float64))
    with pytest.raises(UserError, match="takes no state"):
        mixer(torch.randn(1, 8, D_MODEL, dtype=torch.float64), state, cu_seqlens=torch.tensor([0, 8]))


@pytest.mark.parametrize("positions", [0, 32])
def test_a_packed_decoder_gives_each_sequence_its_own_logits(positions):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, d_model=D_MODEL, n_heads=N_HEADS, n_layers=2, layers=["softmax", "gla"],
                      positions=positions)
    model = Decoder(cfg).double()
    tokens = torch.randint(50, (1, sum(LENGTHS)))
    logits, states = model(tokens, cu_seqlens=boundaries(LENGTHS))
    expected = torch.cat([model(piece)[0] for piece in tokens.split(LENGTHS, dim=1)], dim=1)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-10)
    assert [len(layer) for layer in states] == [len(LENGTHS)] * 2


@pytest.mark.parametrize("name", ["interdomain", "s4d"])
def test_the_interdomain_read_and_the_s4d_convolution_run_every_sequence_in_one_call(name, monkeypatch):
    """Without states: the chunk scan restarted at every sequence, or one convolution per group of lengths."""
    mixer = make(name)
    forward, calls = mixer.forward, []
    monkeypatch.setattr(mixer, "forward", lambda *args, **kw: calls.append(args[0].shape[0]) or forward(*args, **kw))
    mixer(torch.randn(1, sum(LENGTHS), D_MODEL, dtype=torch.float64), cu_seqlens=boundaries(LENGTHS),
          keep_state=False)
    assert calls == [1]


@pytest.mark.parametrize("name", ["linear", "gla", "gdn"])
def test_the_linear_family_returns_every_sequence_state_from_one_call(name, monkeypatch):
    """fla's kernels or our chunk forms with the scan restarted at every sequence, not a loop over them."""
    mixer = make(name)
    forward, calls = mixer.forward, []
    monkeypatch.setattr(mixer, "forward", lambda *args, **kw: calls.append(args[0].shape[0]) or forward(*args, **kw))
    _, states = mixer(torch.randn(1, sum(LENGTHS), D_MODEL, dtype=torch.float64), cu_seqlens=boundaries(LENGTHS))
    assert calls == [1] and len(states) == len(LENGTHS)


def test_sequences_are_batched_by_length_padding_at_most_a_quarter_more_tokens():
    lengths = [3, 40, 7, 20, 21, 1, 39, 11]
    groups = length_groups(boundaries(lengths))
    assert sorted(i for group in groups for i in group) == list(range(len(lengths)))
    for group in groups:
        longest = max(lengths[i] for i in group)
        assert all(1.25 * lengths[i] >= longest for i in group)
    assert [sorted(lengths[i] for i in group) for group in groups] == [[39, 40], [20, 21], [11], [7], [3], [1]]


@pytest.mark.parametrize("name, keep_state", [("s4d", True), ("boltzmann", False),
                                              *((name, keep) for name in ("softmax", "sigmoid", "differential")
                                                for keep in (True, False))])
def test_the_others_run_a_batch_per_group_of_lengths(name, keep_state, monkeypatch):
    """Without states every other mixer, and the attention mixers with their KV caches too, run the sequences as
    batches of similar lengths padded at their ends."""
    mixer = make(name)
    forward, calls = mixer.forward, []
    monkeypatch.setattr(mixer, "forward", lambda *args, **kw: calls.append(args[0].shape[0]) or forward(*args, **kw))
    mixer(torch.randn(1, sum(LENGTHS), D_MODEL, dtype=torch.float64), cu_seqlens=boundaries(LENGTHS),
          keep_state=keep_state)
    assert calls == [len(group) for group in length_groups(boundaries(LENGTHS))]


def test_the_short_convolution_restarts_at_every_sequence():
    torch.manual_seed(0)
    conv = ShortConv(6, 4).double()
    x = torch.randn(1, 15, 6, dtype=torch.float64)
    cu_seqlens = torch.tensor([0, 1, 3, 9, 15])  # lengths 1 and 2 are shorter than the kernel's window
    y, states = conv.packed(x, cu_seqlens)
    for (start, end), state in zip(sequences(cu_seqlens), states, strict=True):
        y_alone, state_alone = conv(x[:, start:end])
        torch.testing.assert_close(y[:, start:end], y_alone, rtol=0, atol=1e-12)
        torch.testing.assert_close(state, state_alone[0], rtol=0, atol=0)


@pytest.mark.parametrize("name, options", [("linear", {"short_conv": True}), ("gla", {"short_conv": True}),
                                           ("gdn", {}), ("ccq-gla", {}), ("ccq-gdn", {"ccq_decay": True}),
                                           ("interdomain", {}), ("interdomain", {"normalize": True})])
def test_the_chunked_mixers_run_packed_sequences_in_one_call(name, options, monkeypatch):
    """Without states, each sequence begins at a chunk (chunk 4: sequences of 1 to 3 chunks) and the chunk
    form's state scan starts afresh there: one forward, the outputs and gradients of each sequence alone."""
    mixer = make(name, chunk_size=4, **options)
    x = torch.randn(1, sum(LENGTHS), D_MODEL, dtype=torch.float64, requires_grad=True)
    forward, calls = mixer.forward, []
    monkeypatch.setattr(mixer, "forward", lambda *args, **kw: calls.append(1) or forward(*args, **kw))
    y, _ = mixer(x, cu_seqlens=boundaries(LENGTHS), keep_state=False)
    assert len(calls) == 1
    # rtol: normalize divides by small readouts, which chunks of 4 round otherwise than one chunk (fp64)
    assert_same_outputs_and_gradients(mixer, x, y, alone(mixer, x, LENGTHS)[0], rtol=1e-9)


CLOSE = [7, 8, 3, 1]  # 7 and 8 share a batch padded to 8 (length_groups): the 7's state must not keep the pad


@contract
def test_a_sequence_padded_in_its_group_continues_as_it_does_alone(name, options):
    mixer = make(name, **options)
    assert [sorted(CLOSE[i] for i in group) for group in length_groups(boundaries(CLOSE))] == [[7, 8], [3], [1]]
    x = torch.randn(1, sum(CLOSE), D_MODEL, dtype=torch.float64)
    steps = torch.randn(1, 4, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        packed, packed_states = mixer(x, cu_seqlens=boundaries(CLOSE))
        expected, expected_states = alone(mixer, x, CLOSE)
        torch.testing.assert_close(packed, expected, rtol=0, atol=1e-10)
        for state, expected_state in zip(packed_states, expected_states, strict=True):
            for t in range(steps.shape[1]):  # several tokens: a pad kept in a cache would be read by each
                y, state = mixer(steps[:, t : t + 1], state)
                y_alone, expected_state = mixer(steps[:, t : t + 1], expected_state)
                torch.testing.assert_close(y, y_alone, rtol=0, atol=1e-10)
