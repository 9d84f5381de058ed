"""Trained attnlab runs in Hugging Face transformers: export, Auto classes, logits, generate, tokenizers."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

import attnlab  # noqa: F401  (registers the Auto classes once transformers is imported)
from attnlab.cli import main
from attnlab.data.tokenizer import BPETokenizer, ByteTokenizer, CharTokenizer, IdTokenizer
from attnlab.errors import UserError
from attnlab.hf import AttnlabConfig, AttnlabForCausalLM, hf_tokenizer
from attnlab.hf.export import export
from attnlab.inference import load_run
from attnlab.mixers import list_mixers
from attnlab.train import train
from test_train import tiny_config

SEQ_LEN = 16  # within exact Boltzmann attention's window, so every mixer reads whole training windows
PROMPT = "Line 12: "
NEW_TOKENS = SEQ_LEN - len(PROMPT)
FAMILIES = [[name, name] for name in list_mixers()] + [["softmax", "gla"], ["interdomain", "boltzmann"]]


def trained_run(text_file, tmp_path, layers, extra=()):
    overrides = [f"model.mixer={layers[0]}", f"model.layers=[{', '.join(layers)}]", *extra]
    cfg = tiny_config(text_file, tmp_path, name="-".join(layers), steps=2, warmup_steps=1, seq_len=SEQ_LEN,
                      eval_every=2, ckpt_every=2, extra=overrides)
    return train(cfg, progress=False, log=lambda *_: None)["run_dir"]


@pytest.fixture
def exported(text_file, tmp_path):
    def make(layers, extra=()):
        run_dir = trained_run(text_file, tmp_path, layers, extra)
        return run_dir, export(run_dir, tmp_path / "hf")
    return make


def decode_lengths(model):
    """Records the number of tokens of every forward call of model."""
    lengths = []
    model.register_forward_pre_hook(lambda _, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]),
                                    with_kwargs=True)
    return lengths


@pytest.mark.parametrize("layers", FAMILIES, ids=lambda layers: "+".join(dict.fromkeys(layers)))
def test_an_exported_run_loads_with_the_auto_classes_and_matches_attnlab(exported, layers):
    run_dir, folder = exported(layers)
    run = load_run(run_dir, device="cpu")
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert isinstance(model, AttnlabForCausalLM)

    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    assert ids[0].tolist() == run.tokenizer.encode(PROMPT).tolist()
    text = tokenizer("Line 3: the quic", return_tensors="pt").input_ids  # SEQ_LEN characters
    logits = model(text).logits
    torch.testing.assert_close(logits, run.model(text)[0], rtol=0, atol=1e-6)

    lengths = decode_lengths(model)
    greedy = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert greedy.tolist() == run.model.generate(ids, NEW_TOKENS, temperature=0).tolist()
    assert lengths == [len(PROMPT)] + [1] * (NEW_TOKENS - 1)  # one prefill, then one token per step: the states
    assert tokenizer.decode(greedy[0]) == run.tokenizer.decode(greedy[0].tolist())

    # prompts of different lengths in one batch, padded on either side: every row generates what it does alone
    prompts = ["Line 7", "L", "Line 12: t"]
    alone = [run.model.generate(tokenizer(p, return_tensors="pt").input_ids, 4, temperature=0)[0].tolist()
             for p in prompts]
    for side in ("left", "right"):
        tokenizer.padding_side = side
        batch = tokenizer(prompts, padding=True, return_tensors="pt")
        out = model.generate(**batch, max_new_tokens=4, do_sample=False)
        mask = torch.cat((batch.attention_mask, torch.ones(len(prompts), 4, dtype=torch.long)), 1).bool()
        assert [row[keep].tolist() for row, keep in zip(out, mask, strict=True)] == alone

    # in bf16, within 4 bf16 epsilons (3.1e-2) of the fp32 logits' norm: the weights and activations rounded to
    # bf16 once each, the mixers' states and inference kept in fp32
    bf16_logits = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)(text).logits
    assert bf16_logits.dtype == torch.bfloat16 and torch.isfinite(bf16_logits).all()
    error = (bf16_logits.float() - logits).norm() / logits.norm()
    assert error < 4 * torch.finfo(torch.bfloat16).eps, f"relative error {error:.3g}"


def test_save_pretrained_round_trips_and_trust_remote_code_loads_without_importing_attnlab(exported, tmp_path):
    run_dir, folder = exported(["gdn", "gdn"])
    model = AutoModelForCausalLM.from_pretrained(folder)
    model.save_pretrained(tmp_path / "again")
    AutoTokenizer.from_pretrained(folder).save_pretrained(tmp_path / "again")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "again")
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert again.model.head.weight is again.model.embed.weight  # still tied

    # a process that never imports attnlab: the folder's module imports the classes from the installed attnlab
    script = ("from transformers import AutoModelForCausalLM, AutoTokenizer\n"
              f"m = AutoModelForCausalLM.from_pretrained({str(tmp_path / 'again')!r}, trust_remote_code=True)\n"
              f"t = AutoTokenizer.from_pretrained({str(tmp_path / 'again')!r}, trust_remote_code=True)\n"
              f"ids = t({PROMPT!r}, return_tensors='pt').input_ids\n"
              "print(m.generate(ids, max_new_tokens=4, do_sample=False)[0].tolist())")
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    ids = AutoTokenizer.from_pretrained(folder)(PROMPT, return_tensors="pt").input_ids
    expected = load_run(run_dir, device="cpu").model.generate(ids, 4, temperature=0)[0].tolist()
    assert out.stdout.strip().splitlines()[-1] == str(expected)


@pytest.mark.parametrize("tokenizer", [CharTokenizer("abc \n"), ByteTokenizer(), IdTokenizer(10),
                                       BPETokenizer.train(["the cat sat on the mat"] * 20, 280)],
                         ids=["char", "byte", "ids", "bpe"])
def test_tokenizers_encode_and_decode_as_attnlab_does_after_a_round_trip(tokenizer, tmp_path):
    text = "3 1 4" if tokenizer.kind == "ids" else "a cab\nbc" if tokenizer.kind == "char" else "the cat é"
    hf_tokenizer(tokenizer).save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    ids = tokenizer.encode(text).tolist()
    assert loaded(text).input_ids == ids
    assert loaded.decode(ids) == tokenizer.decode(ids)
    assert len(loaded) == tokenizer.vocab_size
    newline = None if tokenizer.kind == "ids" else int(tokenizer.encode("\n")[0])  # ids have no text boundary
    assert loaded.bos_token_id == loaded.eos_token_id == loaded.pad_token_id == newline


def test_a_vocabulary_without_a_newline_has_no_special_tokens():
    tokenizer = hf_tokenizer(CharTokenizer("abc "))
    assert tokenizer.eos_token_id is None and tokenizer.pad_token_id is None
    assert tokenizer("cab").input_ids == [3, 1, 2]


def test_an_export_pads_batches_with_the_newline_as_its_special_tokens(exported):
    run_dir, folder = exported(["gla", "gla"])
    (newline,) = load_run(run_dir, device="cpu").tokenizer.encode("\n").tolist()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert tokenizer.bos_token_id == tokenizer.eos_token_id == tokenizer.pad_token_id == newline
    assert model.config.bos_token_id == model.config.eos_token_id == model.config.pad_token_id == newline

    batch = tokenizer(["a", "abc"], padding=True, return_tensors="pt")
    abc = tokenizer("abc").input_ids
    assert batch.input_ids.tolist() == [[abc[0], newline, newline], abc]
    assert batch.attention_mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    logits = model(**batch).logits  # padded on the right: each text's logits are its own
    torch.testing.assert_close(logits[0, :1], model(batch.input_ids[:1, :1]).logits[0], rtol=0, atol=1e-6)

    def predict_newlines(_, args, out):
        out.logits[..., newline] = 1e4

    # the newline ends a line, not a text: generate runs for max_new_tokens even when it predicts only newlines
    model.register_forward_hook(predict_newlines)
    generated = model.generate(batch.input_ids[1:], max_new_tokens=4, do_sample=False)
    assert generated[0, 3:].tolist() == [newline] * 4


def test_padded_rows_are_read_alone_and_padding_is_never_a_label(exported):
    _, folder = exported(["gla", "softmax"])
    model = AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0], [0, 0, 0, 9]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 1]])
    out = model(ids, attention_mask=mask, labels=ids)
    torch.testing.assert_close(out.logits[1, :2], model(ids[1:2, :2]).logits[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(out.logits[2, 3], model(ids[2:, 3:]).logits[0, 0], rtol=0, atol=1e-6)
    assert bool((out.logits[1, 2:] == out.logits[1, 1]).all()) and bool((out.logits[2, :3] == 0).all())
    # the loss scores only the first row's three targets and the second row's one
    expected = (model(ids[:1], labels=ids[:1]).loss * 3 + model(ids[1:2, :2], labels=ids[1:2, :2]).loss) / 4
    torch.testing.assert_close(out.loss, expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(UserError, match="attention_mask covers 3 tokens"):
        model(ids, attention_mask=mask[:, :3])
    states = model(ids, attention_mask=mask).states
    with pytest.raises(UserError, match="padding among the new tokens"):
        model(ids[:, :1], states, attention_mask=torch.cat((mask, torch.zeros(3, 1, dtype=torch.long)), 1))


def test_beam_search_is_refused_rather_than_run_on_unordered_states(exported):
    _, folder = exported(["gla", "gla"])
    model = AutoModelForCausalLM.from_pretrained(folder)
    with pytest.raises(UserError, match="beam search"):
        model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, num_beams=2)


@pytest.mark.parametrize("probe", ["", "importlib.util.find_spec('transformers')  # as availability checks do\n"])
def test_importing_attnlab_registers_once_transformers_is_imported_and_not_before(probe):
    script = ("import importlib.util, sys, attnlab\n"
              "assert 'transformers' not in sys.modules  # the command line stays fast\n"
              f"{probe}"
              "from transformers import AutoConfig\n"
              "print(type(AutoConfig.for_model('attnlab', attnlab={'vocab_size': 8})).__name__)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "AttnlabConfig"


def test_the_export_command_writes_a_folder_once(text_file, tmp_path, capsys):
    run_dir = trained_run(text_file, tmp_path, ["softmax", "softmax"])
    assert main(["export", str(run_dir), str(tmp_path / "hf")]) == 0
    assert isinstance(AutoModelForCausalLM.from_pretrained(tmp_path / "hf"), AttnlabForCausalLM)
    assert "Writing model shards" not in capsys.readouterr().err  # stderr is no terminal here: no progress bars
    assert main(["export", str(run_dir), str(tmp_path / "hf")]) == 2  # never over an earlier export
    err = capsys.readouterr().err.strip()
    assert "already exists and is not an empty folder" in err and len(err.splitlines()) == 1


def test_export_says_once_that_it_skips_a_damaged_newest_checkpoint(text_file, tmp_path, capsys):
    cfg = tiny_config(text_file, tmp_path, name="damaged", steps=2, warmup_steps=1, seq_len=SEQ_LEN, eval_every=2,
                      ckpt_every=1)
    run_dir = train(cfg, progress=False, log=lambda *_: None)["run_dir"]
    (Path(run_dir) / "step-00000002" / "model.safetensors").write_bytes(b"damaged")
    capsys.readouterr()
    assert main(["export", str(run_dir), str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert out.count("skipping checkpoint") == 1 and "step-00000002: model.safetensors does not match" in out


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bars_reach_a_terminal_only_and_are_left_as_they_were(tmp_path, capsys, monkeypatch):
    config = AttnlabConfig(attnlab={"vocab_size": 10, "d_model": 16, "n_layers": 1, "n_heads": 2})
    AttnlabForCausalLM(config).save_pretrained(tmp_path / "model")
    AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    err = capsys.readouterr().err  # a redirected stderr, as in a log or a pipe
    assert "Writing model shards" not in err and "Loading weights" not in err
    assert hf_logging.is_progress_bar_enabled()  # turned off for the call only
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    AttnlabForCausalLM(config).save_pretrained(tmp_path / "again")
    AutoModelForCausalLM.from_pretrained(tmp_path / "again")
    assert "Writing model shards" in terminal.getvalue() and "Loading weights" in terminal.getvalue()


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_rows_with_learned_positions_count_their_own_tokens(exported, side):
    """Learned absolute positions (model.positions): a padded row's positions start at its first token, in the
    padded read and in every step after it, so its logits and greedy tokens are those it has alone."""
    _, folder = exported(["softmax", "gla"], [f"model.positions={SEQ_LEN}"])
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side=side)
    with torch.no_grad():  # two training steps leave the embeddings small: make a wrong position show
        model.model.position.weight.normal_(0, 1)
    prompts = ["Line 7", "L", "Line 12: t"]
    batch = tokenizer(prompts, padding=True, return_tensors="pt")
    logits = model(**batch).logits
    out = model.generate(**batch, max_new_tokens=4, do_sample=False, output_scores=True, return_dict_in_generate=True)
    for row, prompt in enumerate(prompts):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        keep = batch.attention_mask[row].bool()
        torch.testing.assert_close(logits[row, keep], model(ids).logits[0], rtol=0, atol=1e-5)
        single = model.generate(ids, max_new_tokens=4, do_sample=False, output_scores=True,
                                return_dict_in_generate=True)
        assert out.sequences[row, torch.cat((keep, torch.ones(4, dtype=torch.bool)))].tolist() == \
            single.sequences[0].tolist()
        for step, expected in zip(out.scores, single.scores, strict=True):
            torch.testing.assert_close(step[row], expected[0], rtol=0, atol=1e-5)
