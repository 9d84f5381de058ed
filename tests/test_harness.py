"""lm-evaluation-harness on an attnlab run, over local tasks the tests write: its numbers are attnlab's."""

import importlib
import json
import runpy
import sys

import pytest
import torch
import torch.nn.functional as F
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager

from attnlab.cli import main
from attnlab.errors import UserError
from attnlab.hf import lm_eval as harness  # noqa: F401  (registers the model type)
from attnlab.inference import load_run
from attnlab.train import train
from test_train import tiny_config

SEQ_LEN = 16
DOCS = [{"context": "Line 3: the quick", "choices": ["brown", "lazy", "dog"], "answer": 0,
         "text": "Line 5: the quick brown fox jumps over the lazy dog, 5 times.\n"},
        {"context": "Line 4: over the", "choices": ["lazy", "quick"], "answer": 0, "text": "Line 6: the fox"}]
TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: {output_type}
{fields}
"""
TASKS = {
    "local_choice": ("multiple_choice", 'doc_to_text: "{{context}}"\ndoc_to_choice: "{{choices}}"\n'
                     'doc_to_target: "{{answer}}"\nmetric_list:\n  - metric: acc'),
    "local_text": ("loglikelihood_rolling", 'doc_to_text: ""\ndoc_to_target: "{{text}}"\n'
                   "metric_list:\n  - metric: bits_per_byte"),
    "local_until": ("generate_until", 'doc_to_text: "{{context}}"\ndoc_to_target: " lazy"\ngeneration_kwargs:\n'
                    '  until: ["e"]\n  max_gen_toks: 12\nmetric_list:\n  - metric: exact_match'),
}


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("harness")
    text = "".join(f"Line {i}: the quick brown fox jumps over the lazy dog, {i % 7} times.\n" for i in range(400))
    (tmp_path / "corpus.txt").write_text(text)
    cfg = tiny_config(tmp_path / "corpus.txt", tmp_path, steps=40, warmup_steps=1, seq_len=SEQ_LEN, eval_every=40,
                      ckpt_every=40, extra=["model.mixer=gla"])
    run_dir = train(cfg, progress=False, log=lambda *_: None)["run_dir"]
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "docs.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    for name, (output_type, fields) in TASKS.items():
        (tasks / f"{name}.yaml").write_text(TASK.format(name=name, data=tasks / "docs.jsonl",
                                                        output_type=output_type, fields=fields))
    return run_dir, tasks


@pytest.fixture(scope="module")
def samples(setting):
    run_dir, tasks = setting
    out = simple_evaluate(model="attnlab", model_args=f"path={run_dir},device=cpu", tasks=list(TASKS),
                          task_manager=TaskManager(include_path=str(tasks)), log_samples=True, batch_size=3)
    return out["samples"]


def tail_log_likelihood(model, tokens: list[int], scored: int) -> float:
    """Summed log p of the last `scored` tokens, reading at most the training length before each: the
    window of the last SEQ_LEN + 1 tokens, as attnlab's evaluation reads windows."""
    window = torch.tensor(tokens[-(SEQ_LEN + 1):])
    with torch.no_grad():
        logits, _ = model(window[None, :-1])
    log_probs = F.log_softmax(logits[0, -scored:], -1)
    return float(log_probs.gather(1, window[-scored:, None]).sum())


def test_choice_log_likelihoods_are_attnlabs(setting, samples):
    run = load_run(setting[0], device="cpu")
    encode = run.tokenizer.encode
    for sample in samples["local_choice"]:
        for (context, choice), (score, _) in zip(sample["arguments"], sample["filtered_resps"], strict=True):
            both = encode(context + choice).tolist()
            expected = tail_log_likelihood(run.model, both, len(both) - len(encode(context)))
            assert score == pytest.approx(expected, abs=1e-4)


def test_rolling_log_likelihood_is_attnlabs_over_training_windows(setting, samples):
    run = load_run(setting[0], device="cpu")
    newline = run.tokenizer.encode("\n").tolist()
    longest = 0
    for sample in samples["local_text"]:
        tokens = newline + run.tokenizer.encode(sample["doc"]["text"]).tolist()
        # every token is scored once, in spans of SEQ_LEN, each window reading from a fresh state
        ends = [*range(1 + SEQ_LEN, len(tokens), SEQ_LEN), len(tokens)]
        expected = sum(tail_log_likelihood(run.model, tokens[:end], end - start)
                       for start, end in zip([1, *ends[:-1]], ends, strict=True))
        assert sample["filtered_resps"][0] == pytest.approx(expected, abs=1e-3)
        longest = max(longest, len(tokens))
    assert longest > 2 * SEQ_LEN  # a text spans several windows


def test_generation_is_attnlabs_greedy_generation_cut_at_the_stop_string(setting, samples):
    run = load_run(setting[0], device="cpu")
    cut = 0
    for sample in samples["local_until"]:
        prompt = torch.as_tensor(run.tokenizer.encode(sample["doc"]["context"]))[None]
        out = run.model.generate(prompt, 12, temperature=0, context=SEQ_LEN)
        generated = run.tokenizer.decode(out[0, prompt.shape[1]:].tolist())
        assert sample["filtered_resps"][0] == generated.split("e")[0]
        cut += "e" in generated
    assert cut  # the stop string was met


def test_the_eval_shortcut_prints_lm_evals_table(setting, capsys):
    run_dir, tasks = setting
    assert main(["eval", str(run_dir), "--lm-eval", "local_choice", "--include-path", str(tasks), "--limit", "1"]) == 0
    table = capsys.readouterr().out
    assert "local_choice" in table and "acc" in table


@pytest.mark.parametrize("argv, message", [
    (["--lm-eval", "local_choise"], "unknown task 'local_choise'; did you mean local_choice"),
    (["--lm-eval", "local_choice", "--task", "niah"], "--task niah and --lm-eval are two measurements"),
    (["--limit", "3"], "--limit applies to --lm-eval, not to the loss"),
    (["--lm-eval", "x", "--include-path", "missing-folder"], "--include-path missing-folder is not a folder"),
])
def test_lm_eval_mistakes_are_one_line(setting, capsys, argv, message):
    run_dir, tasks = setting
    argv = [a.replace("missing-folder", str(tasks / "missing")) for a in argv]
    if "local_choise" in argv:
        argv += ["--include-path", str(tasks)]
    assert main(["eval", str(run_dir), *argv]) == 2
    err = capsys.readouterr().err
    assert message.replace("missing-folder", str(tasks / "missing")) in err and len(err.strip().splitlines()) == 1


def test_a_continuation_longer_than_the_context_is_refused_in_one_line(setting):
    run_dir, _ = setting
    model = harness.AttnlabLM(path=str(run_dir), device="cpu")
    tokens = model.tok_encode("the quick brown fox jumps")
    with pytest.raises(UserError, match=f"does not fit the model's context of {SEQ_LEN}"):
        model._scores([(tokens[:2], tokens * 2)])


def test_without_lm_eval_the_harness_names_the_extra_in_one_line(monkeypatch, capsys):
    for name in [m for m in sys.modules if m.startswith("lm_eval.")] + ["attnlab.hf.lm_eval"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # importing it then fails as where it is not installed
    message = "attnlab.hf.lm_eval needs lm-evaluation-harness: pip install 'attnlab[eval]'"
    with pytest.raises(UserError) as error:
        importlib.import_module("attnlab.hf.lm_eval")
    assert str(error.value) == message
    with pytest.raises(SystemExit) as exit:  # python -m attnlab.hf.lm_eval
        runpy.run_module("attnlab.hf.lm_eval", run_name="__main__")
    assert exit.value.code == 2 and capsys.readouterr().err == f"error: {message}\n"


class Request:  # what the model type reads of lm-eval's Instance
    def __init__(self, *args):
        self.args = args


def counting_forwards(model):
    calls = []
    model.run.model.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("mixer_batch", [2, "auto"])
def test_requests_are_read_batch_size_at_a_time_and_score_as_alone(setting, mixer_batch):
    run_dir, _ = setting
    alone, batched = (harness.AttnlabLM(path=str(run_dir), device="cpu", batch_size=b) for b in (1, mixer_batch))
    encode = alone.tok_encode
    pairs = [(encode("Line 3: the"), encode(" quick")), (encode("L"), encode("ine")),
             (encode("Line 12: the quick brown fox"), encode(" jumps")), (encode("x"), encode("y"))]
    calls = counting_forwards(batched)
    for (score, greedy), (expected, expected_greedy) in zip(batched._scores(pairs), alone._scores(pairs),
                                                            strict=True):
        assert score == pytest.approx(expected, abs=1e-4) and greedy == expected_greedy
    assert len(calls) == (2 if mixer_batch == 2 else 1)


def test_short_generations_run_as_one_left_padded_batch_and_match_each_alone(setting):
    run_dir, _ = setting
    alone, batched = (harness.AttnlabLM(path=str(run_dir), device="cpu", batch_size=b) for b in (1, 8))
    requests = [Request(context, {"until": ["\n"], "max_gen_toks": 6})
                for context in ["Line 3", "L", "Line 1: t", "Line 4: the quick brown"]]  # the last one slides
    calls = counting_forwards(batched)
    assert batched.generate_until(requests) == alone.generate_until(requests)
    assert len(calls) == 2 * 6  # two generations, a read and five steps each


def test_a_batch_size_that_is_not_a_number_is_one_line(setting):
    with pytest.raises(UserError, match="batch_size=many must be a whole number"):
        harness.AttnlabLM(path=str(setting[0]), device="cpu", batch_size="many")
