"""Sampling: top-k, top-p, the repetition penalty, several samples and stop strings, in Decoder.generate,
LoadedRun.complete and attnlab generate."""

import contextlib
import io
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import inference
from attnlab.cli import main
from attnlab.commands import generate as generate_command
from attnlab.config import ModelConfig, RunConfig, TrainConfig
from attnlab.data.tokenizer import ByteTokenizer, CharTokenizer, IdTokenizer
from attnlab.errors import ConfigError
from attnlab.inference import LoadedRun, TextStream
from attnlab.model import Decoder, Sampling, keep_top_p, penalize_repeats

VOCAB = 50


def tiny(vocab: int = VOCAB) -> Decoder:
    """A small decoder with large weights, so that its next-token distributions are far from uniform."""
    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=vocab, d_model=32, n_layers=2, n_heads=4)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    return model


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# probabilities 0.15, 0.5, 0.05, 0.3: from the most likely, 0.5, 0.8, 0.95, 1
PROBS = torch.tensor([[0.15, 0.5, 0.05, 0.3]])


@pytest.mark.parametrize(("p", "kept"), [(1e-9, {1}), (0.4, {1}), (0.5, {1}), (0.7, {1, 3}), (0.9, {0, 1, 3}),
                                         (0.97, {0, 1, 2, 3})])
def test_top_p_keeps_the_fewest_most_likely_tokens_that_reach_p(p, kept):
    logits = PROBS.log() + 2.0  # a shift changes no probability
    out = keep_top_p(logits, p)
    assert set(torch.isfinite(out[0]).nonzero().flatten().tolist()) == kept
    assert torch.equal(out[torch.isfinite(out)], logits[torch.isfinite(out)])  # the kept logits are unchanged


def test_top_p_samples_the_renormalised_nucleus():
    logits = PROBS.log().expand(20000, 4)
    drawn = Sampling(temperature=1.0, top_p=0.7).pick(logits, torch.zeros(20000, 0, dtype=torch.long), seeded(0))
    counts = torch.bincount(drawn.flatten(), minlength=4) / 20000
    torch.testing.assert_close(counts, torch.tensor([0, 0.5 / 0.8, 0, 0.3 / 0.8]), rtol=0, atol=0.015)


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0, 0.0]])
    seen = torch.tensor([[0, 1, 1, 4]])  # a token seen twice is penalised once
    assert penalize_repeats(logits, seen, 2.0).tolist() == [[1.0, -2.0, 0.5, -3.0, 0.0]]
    assert penalize_repeats(logits, seen, 0.5).tolist() == [[4.0, -0.5, 0.5, -3.0, 0.0]]
    # it acts before the choice: greedy decoding moves off the penalised token
    assert Sampling(temperature=0, repetition_penalty=5.0).pick(logits, seen).item() == 2


def test_a_penalty_far_from_one_keeps_the_logits_finite():
    logits, seen = torch.tensor([[1.0, -2.0, 0.5, -3.0]]), torch.tensor([[0, 1]])
    for penalty in (1e-171, 1e171):  # would overflow to inf, and the softmax after it to nan
        penalized = penalize_repeats(logits, seen, penalty)
        assert bool(torch.isfinite(penalized).all())
        token = Sampling(repetition_penalty=penalty).pick(logits, seen, torch.Generator().manual_seed(0))
        assert token.shape == (1, 1)
    assert Sampling(repetition_penalty=1e-171).pick(logits, seen).item() == 0  # the seen positive logit wins


def test_top_p_and_the_penalty_agree_with_transformers():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor, TopPLogitsWarper

    g = seeded(0)
    logits, seen = 3 * torch.randn(64, VOCAB, generator=g), torch.randint(VOCAB, (64, 20), generator=g)
    for p in (0.1, 0.5, 0.9, 0.99):
        expected = TopPLogitsWarper(p)(seen, logits.clone())
        assert torch.equal(torch.isinf(keep_top_p(logits, p)), torch.isinf(expected))
    torch.testing.assert_close(penalize_repeats(logits, seen, 1.3),
                               RepetitionPenaltyLogitsProcessor(1.3)(seen, logits.clone()), rtol=0, atol=0)


def test_greedy_decoding_with_a_penalty_decodes_incrementally_as_a_full_forward_would():
    model = tiny()
    prompt = torch.randint(VOCAB, (2, 4))
    out = model.generate(prompt, 12, temperature=0, repetition_penalty=3.0)
    tokens = prompt
    for _ in range(12):  # reference: each step recomputed from scratch, the penalty applied by hand
        logits = model(tokens)[0][:, -1]
        tokens = torch.cat((tokens, penalize_repeats(logits, tokens, 3.0).argmax(-1, keepdim=True)), dim=1)
    assert torch.equal(out, tokens)
    assert not torch.equal(out, model.generate(prompt, 12, temperature=0))


def test_greedy_decoding_is_what_top_k_1_and_a_tiny_top_p_give():
    model = tiny()
    prompt = torch.randint(VOCAB, (2, 3))
    greedy = model.generate(prompt, 10, temperature=0)
    assert torch.equal(model.generate(prompt, 10, top_k=1, generator=seeded(3)), greedy)
    assert torch.equal(model.generate(prompt, 10, temperature=1.5, top_p=1e-6, generator=seeded(3)), greedy)
    assert torch.equal(model.generate(prompt, 10, temperature=0, top_k=5, top_p=0.5), greedy)  # no effect on argmax


def test_samples_are_independent_rows_after_their_prompt():
    model = tiny()
    prompt = torch.randint(VOCAB, (2, 3))
    out = model.generate(prompt, 6, temperature=1.5, num_samples=4, generator=seeded(0))
    assert out.shape == (8, 9)
    assert torch.equal(out[:, :3], prompt.repeat_interleave(4, dim=0))  # rows 0-3 continue prompt 0
    assert len({tuple(row) for row in out[:, 3:].tolist()}) == 8
    greedy = model.generate(prompt, 6, temperature=0, num_samples=3)
    assert torch.equal(greedy, model.generate(prompt, 6, temperature=0).repeat_interleave(3, dim=0))


def test_the_first_tokens_of_many_samples_follow_the_models_distribution():
    model = tiny()
    prompt = torch.randint(VOCAB, (1, 3))
    first = model.generate(prompt, 1, temperature=1.0, num_samples=5000, generator=seeded(1))[:, -1]
    expected = torch.softmax(model(prompt)[0][0, -1], dim=-1)
    frequencies = torch.bincount(first, minlength=VOCAB) / 5000
    torch.testing.assert_close(frequencies, expected, rtol=0, atol=0.015)


def test_generation_is_deterministic_given_a_seed():
    model = tiny()
    prompt = torch.randint(VOCAB, (2, 3))
    options = dict(temperature=1.2, top_k=20, top_p=0.9, repetition_penalty=1.3, num_samples=2)
    a = model.generate(prompt, 15, generator=seeded(5), **options)
    assert torch.equal(a, model.generate(prompt, 15, generator=seeded(5), **options))
    assert not torch.equal(a, model.generate(prompt, 15, generator=seeded(6), **options))


def test_generation_lengths():
    model = tiny()
    prompt = torch.randint(VOCAB, (2, 3))
    assert torch.equal(model.generate(prompt, 0), prompt)
    assert model.generate(prompt, 7, generator=seeded(0)).shape == (2, 10)
    assert model.generate(prompt, 7, generator=seeded(0), finished=lambda rows: rows[:, -1] >= 0).shape == (2, 4)
    # generation ends when every row is done, here when row 1 has 5 new tokens (row 0 is done at once)
    def row_1_has_5_new(rows):
        return torch.tensor([True, rows.shape[1] >= 8])

    assert model.generate(prompt, 9, generator=seeded(0), finished=row_1_has_5_new).shape == (2, 8)


@pytest.mark.parametrize(("option", "message"), [
    ({"temperature": -1.0}, "temperature=-1.0 must be 0"),
    ({"temperature": math.nan}, "temperature=nan must be 0"),
    ({"top_k": 0}, "top_k=0 must be 1 or more"),
    ({"top_p": 0.0}, "top_p=0.0 must be above 0 and at most 1"),
    ({"top_p": 1.5}, "top_p=1.5 must be above 0 and at most 1"),
    ({"repetition_penalty": 0.0}, "repetition_penalty=0.0 must be above 0"),
    ({"num_samples": 0}, "num_samples=0 must be 1 or more"),
    ({"max_new_tokens": -1}, "max_new_tokens=-1 must be 0 or more"),
    ({"context": 1}, "context=1 must be 2 or more"),
])
def test_each_bad_argument_is_named_in_one_line(option, message):
    arguments = {"max_new_tokens": 3} | option
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        tiny().generate(torch.zeros(1, 2, dtype=torch.long), **arguments)


CHARS = "ab\n"


def loaded() -> LoadedRun:
    cfg = RunConfig(model=ModelConfig(vocab_size=len(CHARS), d_model=32, n_layers=2, n_heads=4)).validate()
    return LoadedRun(cfg, tiny(len(CHARS)), CharTokenizer(CHARS), torch.device("cpu"), Path("."))


def cut_before(text: str, stops: list[str], start: int) -> str:
    """Reference: text up to the earliest stop found from start on."""
    found = [i for i in (text.find(stop, start) for stop in stops) if i >= 0]
    return text[: min(found)] if found else text


@pytest.mark.parametrize("stops", [["\n"], ["\n", "bb"], ["a"]])  # "a" is in the prompt too: it does not count
def test_a_stop_string_ends_the_sample_and_cuts_it_before_the_stop(stops):
    run = loaded()
    full = run.complete("ab", 40, temperature=1.5, seed=2, num_samples=6)
    cut = run.complete("ab", 40, temperature=1.5, seed=2, num_samples=6, stop=stops)
    assert cut == [cut_before(text, stops, 2) for text in full]
    assert sum(len(c) < len(f) for c, f in zip(cut, full, strict=True)) >= 3  # most samples were cut
    assert all(c.startswith("ab") for c in cut)


def test_generation_stops_once_every_sample_holds_a_stop():
    run = loaded()
    steps = []
    original = run.model.forward

    def counted(*args, **kwargs):
        steps.append(1)
        return original(*args, **kwargs)

    run.model.forward = counted
    texts = run.complete("a", 200, temperature=1.5, seed=0, stop=["a", "b", "\n"], num_samples=3)
    assert texts == ["a", "a", "a"] and len(steps) == 1  # the prefill gives the first token; every row stops at it


def test_one_text_or_a_list_of_samples():
    run = loaded()
    text = run.complete("ab", 8, seed=1)
    assert isinstance(text, str) and text.startswith("ab") and len(text) == 10
    assert run.complete("ab", 8, seed=1, num_samples=1) == [text]
    with pytest.raises(ConfigError, match="stop strings must not be empty"):
        run.complete("ab", 8, stop=["\n", ""])


def tiny_run(tmp_path, preset: str, *overrides: str) -> str:
    assert main(["train", preset, "--quiet", "name=gen", f"out_dir={tmp_path / 'runs'}", "model.d_model=32",
                 "model.n_layers=1", "train.steps=2", "train.batch_size=4", "train.eval_batches=1",
                 "train.ckpt_every=2", *overrides]) == 0
    return str(tmp_path / "runs" / "gen")


@pytest.fixture(scope="module")
def text_run(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("generate")
    (folder / "corpus.txt").write_text("".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n"
                                               for i in range(300)))
    return tiny_run(folder, "demo", "data.source=text", f"data.path={folder / 'corpus.txt'}",
                    f"data.cache_dir={folder}", "train.seq_len=16")


def test_cli_samples_with_the_new_options(text_run, capsys):
    run = text_run
    capsys.readouterr()
    argv = ["generate", run, "--prompt", "Line", "--tokens", "30", "--temperature", "1.5", "--top-p", "0.9",
            "--repetition-penalty", "1.2", "--samples", "3", "--stop", " ", "--stop", "e"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    samples = out.split("--- sample ")[1:]
    assert [s.split(" ---\n")[0] for s in samples] == ["1 of 3", "2 of 3", "3 of 3"]
    texts = [s.split(" ---\n")[1].removesuffix("\n") for s in samples]
    assert all(t.startswith("Line") and " " not in t[4:] and "e" not in t[4:] for t in texts)
    assert main(argv) == 0 and capsys.readouterr().out == out  # the same seed, the same samples


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--top-p", "0", "argument --top-p: 0 is not a probability; give a number above 0 and at most 1"),
    ("--top-p", "1.5", "argument --top-p: 1.5 is not a probability"),
    ("--repetition-penalty", "0", "argument --repetition-penalty: 0 must be above 0"),
    ("--samples", "0", "argument --samples: 0 is out of range; give 1 or more"),
    ("--stop", "", "argument --stop: is empty"),
])
def test_cli_refuses_bad_sampling_options_in_one_line(tmp_path, capsys, flag, value, message):
    assert main(["generate", str(tmp_path), flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1


def test_a_run_on_token_ids_asks_for_a_prompt_of_ids(tmp_path, capsys):
    run = tiny_run(tmp_path, "mqar", "data.mqar.train_examples=64", "data.mqar.test_examples=32")
    capsys.readouterr()
    assert main(["generate", run]) == 2
    err = capsys.readouterr().err
    assert err == ("error: no --prompt: this run was trained on data.source=mqar, whose tokens are ids; give --prompt "
                   "with ids from 0 to 255 separated by spaces, e.g. --prompt '3 1 4'\n")
    assert main(["generate", run, "--prompt", "  "]) == 2
    assert "error: --prompt '  ' holds no tokens: this run was trained on data.source=mqar" in capsys.readouterr().err
    assert main(["generate", run, "--prompt", "3 1 4", "--tokens", "2", "--samples", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "--- sample 1 of 2 ---" and out[1].startswith("3 1 4 ") and len(out[1].split()) == 5


def cli_value(draw_from):
    """A flag's value: in or out of its range, junk, or not a finite number."""
    return st.one_of(draw_from, st.sampled_from(["0", "-1", "nan", "inf", "1e-300", "x", ""]))


SAMPLING = {
    "--top-p": cli_value(st.floats(-1, 2).map(str)),
    "--repetition-penalty": cli_value(st.floats(-1, 5).map(str)),
    "--samples": cli_value(st.integers(-2, 3).map(str)),
    "--stop": st.text(max_size=3),
    "--tokens": st.integers(1, 8).map(str),
}


@settings(max_examples=20, deadline=None, database=None)
@given(st.data())
def test_cli_sampling_options_fuzzed_exit_0_or_one_line(text_run, data):
    argv = ["generate", text_run, "--prompt", "Line"]
    for name in data.draw(st.lists(st.sampled_from(sorted(SAMPLING)), unique=True, min_size=1)):
        argv += [name, data.draw(SAMPLING[name])]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code in (0, 2) and "Traceback" not in err.getvalue()
    if code == 2:
        assert err.getvalue().startswith("error: ") and err.getvalue().count("\n") == 1, (argv, err.getvalue())


# streaming, interrupts and the reach of --tokens


def test_complete_streams_each_samples_text_token_by_token_and_the_pieces_join_into_it():
    run = loaded()
    calls = []
    texts = run.complete("ab", 12, temperature=1.5, seed=3, num_samples=2, on_text=calls.append)
    assert calls[0] == ["ab", "ab"]  # the prompt first
    assert len(calls) == 1 + 12 + 1  # then one call per token, then what was held back
    assert all(len(piece) == 1 for pieces in calls[1:-1] for piece in pieces)  # one character per token
    assert ["".join(column) for column in zip(*calls, strict=True)] == texts
    # with stop strings a piece holds back what may begin one, and nothing of a sample follows its stop
    calls.clear()
    texts = run.complete("ab", 40, temperature=1.5, seed=2, num_samples=4, stop=["bb", "\n"], on_text=calls.append)
    assert ["".join(column) for column in zip(*calls, strict=True)] == texts
    assert texts == [cut_before(text, ["bb", "\n"], 2)
                     for text in run.complete("ab", 40, temperature=1.5, seed=2, num_samples=4)]


@pytest.mark.parametrize("tokenizer, text", [(ByteTokenizer(), "né € 😀 x"), (IdTokenizer(20), "3 1 4 15 9 2 6"),
                                             (CharTokenizer("ab\n"), "ab\nba")], ids=["bytes", "ids", "chars"])
def test_a_text_stream_gives_the_text_of_the_whole_row_piece_by_piece(tokenizer, text):
    """Characters whose bytes span several tokens wait for their last byte; ids keep their spaces."""
    ids = torch.as_tensor(tokenizer.encode(text))
    stream = TextStream(lambda row: tokenizer.decode(row.tolist()), ids[:1], [])
    pieces = [stream.prompt_text] + [stream.piece(ids[:n]) for n in range(2, len(ids) + 1)]
    assert "".join(pieces) + stream.piece(ids, final=True) == text
    assert "\ufffd" not in "".join(pieces)


def test_an_interrupted_completion_gives_the_text_sampled_so_far():
    run = loaded()
    pieces = []
    forward = run.model.forward

    def interrupted_after_5_tokens(*args, **kwargs):
        if len(pieces) == 6:  # the prompt's call and 5 tokens'
            raise KeyboardInterrupt
        return forward(*args, **kwargs)

    run.model.forward = interrupted_after_5_tokens
    stop = ["a" * 8]  # not reached in 5 tokens, but the a's they end with might begin it: held back until the end
    with pytest.raises(KeyboardInterrupt):
        run.complete("ab", 40, temperature=1.5, seed=2, stop=stop, on_text=pieces.append)
    run.model.forward = forward
    assert pieces[-1] == ["aaaaa"]  # given when interrupted
    assert "".join(p[0] for p in pieces) == run.complete("ab", 5, temperature=1.5, seed=2) == "abaaaaa"


def generating(monkeypatch, run: LoadedRun) -> LoadedRun:
    """attnlab generate on this run, whatever the checkpoint argument names."""
    monkeypatch.setattr(inference, "load_run", lambda *args, **kwargs: run)
    return run


class Recorder(io.StringIO):
    """stdout recording what was written and flushed between the model's steps."""

    def __init__(self, events):
        super().__init__()
        self.events = events

    def flush(self):
        self.events.append(("flushed", self.getvalue()))


def test_the_cli_prints_each_token_as_it_is_sampled_and_flushes_it(monkeypatch):
    run = generating(monkeypatch, loaded())
    expected = run.complete("ab", 40, seed=2) + "\n"
    events = []
    forward = run.model.forward
    run.model.forward = lambda *args, **kwargs: events.append(("step", None)) or forward(*args, **kwargs)
    monkeypatch.setattr("sys.stdout", Recorder(events))
    assert main(["generate", "run", "--prompt", "ab", "--tokens", "40", "--seed", "2"]) == 0
    flushed = [text for kind, text in events if kind == "flushed"]
    assert flushed[-1] == expected
    # the text grew between the steps, not all at the end: each step after the probe of the speed flushed more
    steps = [i for i, (kind, _) in enumerate(events) if kind == "step"]
    shown = [max((len(events[j][1]) for j in range(i) if events[j][0] == "flushed"), default=0) for i in steps]
    assert shown[-1] > len("ab") and len(set(shown[-5:])) == 5


@pytest.mark.parametrize("samples", [1, 3])
def test_ctrl_c_during_the_cli_prints_the_text_so_far_and_exits_130(monkeypatch, capsys, samples):
    run = generating(monkeypatch, loaded())
    forward, steps = run.model.forward, []

    def interrupted_at_step_8(*args, **kwargs):
        steps.append(1)
        if len(steps) == 8:  # the prefill and 6 tokens read; the 7th was sampled
            raise KeyboardInterrupt
        return forward(*args, **kwargs)

    run.model.forward = interrupted_at_step_8
    argv = ["generate", "run", "--prompt", "ab", "--tokens", "40", "--seed", "2", "--temperature", "1.5",
            "--samples", str(samples)]
    assert main(argv) == 130
    out, err = capsys.readouterr()
    assert err.strip().splitlines()[-1] == "interrupted"
    run.model.forward = forward
    expected = run.complete("ab", 7, temperature=1.5, seed=2, num_samples=samples)
    if samples == 1:
        assert out == expected[0] + "\n"
    else:
        assert out == "".join(f"--- sample {i} of 3 ---\n{text}\n" for i, text in enumerate(expected, 1))


def test_a_long_generation_says_first_what_it_will_cost_at_the_measured_speed(monkeypatch, capsys):
    generating(monkeypatch, loaded())
    clock = iter(range(10**6))  # every reading one second later: one token per second
    monkeypatch.setattr(generate_command.time, "perf_counter", lambda: float(next(clock)))
    assert main(["generate", "run", "--prompt", "ab", "--tokens", "3000"]) == 0
    out, err = capsys.readouterr()
    assert err == ("--tokens 3000: up to about 50 min more at the 1 tokens/s measured; Ctrl-C stops it and prints "
                   "the text so far\n")
    assert out.startswith("ab") and len(out) == 3003
    assert main(["generate", "run", "--prompt", "ab", "--tokens", "40"]) == 0  # a short one is just printed
    assert capsys.readouterr().err == ""


def test_tokens_past_the_learned_positions_are_refused_before_any_work(monkeypatch, capsys):
    cfg = RunConfig(model=ModelConfig(vocab_size=len(CHARS), d_model=32, n_layers=2, n_heads=4, positions=16),
                    train=TrainConfig(seq_len=16)).validate()
    run = generating(monkeypatch, LoadedRun(cfg, Decoder(cfg.model).eval(), CharTokenizer(CHARS),
                                            torch.device("cpu"), Path(".")))
    forward, steps = run.model.forward, []
    run.model.forward = lambda *args, **kwargs: steps.append(1) or forward(*args, **kwargs)
    assert main(["generate", "run", "--prompt", "ab", "--tokens", "100", "--context", "0"]) == 2
    assert capsys.readouterr().err == (
        "error: --tokens 100 after a prompt of 2 tokens would have the model read 101 at once under --context 0 "
        "(unbounded), beyond the 16 it can (model.positions=16); give --tokens 15 or less, or --context 16 or less "
        "(the view re-reads its newest half when full)\n")
    assert main(["generate", "run", "--prompt", "ab", "--tokens", "100", "--context", "40"]) == 2
    assert "error: --context 40 lets the model read 40 tokens at once, beyond the 16 it can" in capsys.readouterr().err
    assert not steps
    assert main(["generate", "run", "--prompt", "ab", "--tokens", "15", "--context", "0"]) == 0  # reads 16
    assert main(["generate", "run", "--prompt", "ab", "--tokens", "100"]) == 0  # the training length's view slides
    before = len(steps)
    with pytest.raises(ConfigError, match="would read 101 tokens at once, beyond the 16 this model can read "
                       r"\(model.positions=16\); give max_new_tokens at most 15, or a context of at most 16"):
        run.model.generate(torch.zeros(1, 2, dtype=torch.long), 100)
    assert len(steps) == before  # refused before the prefill
