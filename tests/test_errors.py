"""Bad input from a person gets one line naming the field and the fix, without a traceback (which
--debug adds). Each row: what was typed, and a piece of the message it must get."""

import pytest
import torch

from attnlab.cli import main
from attnlab.errors import ConfigError
from attnlab.mixers import build_mixer
from attnlab.ops import fla as fla_ops

BAD_INPUT = [
    (["train", "demo", "model.mixr=softmax"], "unknown field 'model.mixr'; did you mean 'model.mixer'?"),
    (["train", "demo", "model.mixer=sofmax"], "unknown mixer 'sofmax'; did you mean 'softmax'?"),
    (["train", "nosuchpreset"], "unknown config preset or file 'nosuchpreset'"),
    (["train", "demo", "model.n_heads=3"], "model.n_heads=3 does not divide model.d_model=128"),
    (["train", "demo", "train.lr=-1"], "train.lr=-1.0 must be above 0, e.g. 1e-3"),
    (["train", "demo", "train.min_lr=-1"], "train.min_lr=-1.0 must be >= 0"),
    (["train", "demo", "train.precision=fp16"], "unknown train.precision 'fp16'; did you mean 'bf16'?"),
    (["train", "demo", "model.mixer_options.softmax.n_heads=1"], "model.mixer_options.softmax.n_heads is set by the "
     "decoder from model.n_heads, for every layer; remove it and set model.n_heads instead"),
    (["train", "demo", "model.mixer_options.softmax.d_model=64"], "model.mixer_options.softmax.d_model is set by the "
     "decoder from model.d_model, for every layer; remove it and set model.d_model instead"),
    (["train", "demo", "train.batch_size=5", "train.grad_accum=2"], "train.batch_size=5 is not divisible"),
    (["train", "demo", "train.context_parallel=2"], "train.context_parallel=2 does not divide the 1 process(es)"),
    (["train", "demo", "data.source=text", "data.path=/no/such/texts"], "data.path=/no/such/texts does not exist"),
    (["train", "demo", "data.source=niah", "data.task_options.niah.kind=passwd"],
     "unknown data.task_options.niah.kind 'passwd'; did you mean 'passkey'? Known: multikey, number, passkey, uuid"),
    (["train", "mqar", "data.mqar.pairs=40"], "MQAR with 40 pairs needs 4 * pairs <= train.seq_len=64"),
    (["train", "demo", "data.source=mixed", "data.max_chars=9000000"], "or lower data.mix.docs"),
    (["train", "boltzmann-char", "model.mixer_options.boltzmann.window=40", "train.seq_len=40", "model.positions=40",
      "--quiet"], "enumerates 2^40 configurations per query"),
    (["train", "boltzmann-char", "train.seq_len=40"],
     "model.positions=12 learned positions cannot cover train.seq_len=40"),
    (["train", "demo", "model.mixer=boltzmann", "model.mixer_options.boltzmann.inference=dqa"],
     "dqa simulates 2^window amplitudes per query; window=16 is above 12"),
    (["eval", "/no/such/run"], "is neither a run folder nor a checkpoint folder"),
    (["reproduce", "ccq", "--seeds", "0"], "argument --seeds: 0 is out of range; give from 1 to 1000"),
    (["reproduce", "ccq", "--scale", "nan"], "argument --scale: 'nan' is not a finite number"),
    (["generate", "runs/x", "--tokens", "0"], "argument --tokens: 0 is out of range; give 1 or more"),
    (["generate", "runs/x", "--temperature", "-1"], "argument --temperature: -1 is not a temperature; give 0"),
    (["generate", "runs/x", "--top-k", "0"], "argument --top-k: 0 is out of range; give 1 or more"),
    (["generate", "runs/x", "--prompt", ""], "argument --prompt: is empty; give at least one character"),
    (["generate", "runs/x", "--context", "1"], "argument --context: 1 is too few; give 0 (unbounded) or 2 or more"),
    (["eval", "runs/x", "--batches", "0"], "argument --batches: 0 is out of range; give 1 or more"),
    (["eval", "runs/x", "--seq-len", "-5"], "argument --seq-len: -5 is out of range; give 1 or more"),
    (["eval", "runs/x", "--task", "niah", "--samples", "0"], "argument --samples: 0 is out of range"),
    (["eval", "runs/x", "--task", "niah", "--lengths", "1.5"], "argument --lengths: '1.5' is not an integer"),
    (["eval", "runs/x", "--kind", "uuid"], "--kind applies to --task niah, not to the loss (no --task); drop it"),
    (["bench", "--lengths", "0"], "argument --lengths: 0 is out of range; give 1 or more"),
    (["bench", "--repeats", "-1"], "argument --repeats: -1 is out of range; give 1 or more"),
    (["bench", "--model", "demo", "--mixers", "sofmax"], "unknown mixer 'sofmax'; did you mean 'softmax'?"),
    (["bench", "--mixers", "gla"], "--mixers applies only to --model, not to the whole bench; add e.g. --model"),
    (["bench", "--batch", "2"], "--batch applies only to the mixers alone (--lengths), not to the whole bench; add "
                                "e.g. --lengths 1024 4096 or drop it"),
    (["bench", "--ops", "--lengths", "64", "--batch", "2"], "--batch applies only to the mixers alone (--lengths), "
                                                           "not to --ops; drop it"),
    (["bench", "--boltzmann", "--repeats", "2"], "--repeats applies only to the mixers alone (--lengths), --ops, "
                                                 "--model, --packed, not to --boltzmann; drop it"),
    (["bench", "--model", "demo", "--lengths", "64"], "--lengths applies only to the mixers alone (--lengths), --ops, "
                                                      "--packed, --cp, not to --model; drop it"),
    (["bench", "--cp", "--lengths", "4"], "--cp --lengths 4: each length must be even and at least 32"),
    (["bench", "--quick", "--lengths", "64"], "--quick is the whole bench at toy sizes, --lengths times the mixers"),
    (["train", "demo", "name="], "name= needs a value: give a str"),
    (["train", "demo", "train.steps="], "train.steps= needs a value: give an int"),
    (["train", "demo", "train.log_to="], "train.log_to= needs a value: give a list, e.g. [a,b], or one name"),
    (["train", "demo", "model.d_model=100"], "model.n_heads=4 makes softmax's heads 100 / 4 = 25 channels wide, "
                                             "and RoPE needs an even width; choose model.n_heads from [1, 2, 5, 10"),
    (["train", "demo", "model.mixer=wavelet"], "unknown mixer 'wavelet': it is not built in and no imported module "
                                               "registered it; pass --import <module or file.py> (before the command) "
                                               "or set ATTNLAB_IMPORT"),
    (["train", "demo", "--import", "x.py"], "--import goes before the command: attnlab --import MODULE_OR_FILE train"),
    (["--import", "no_such_plugin", "list"], "--import no_such_plugin: no module of that name here"),
    (["--import", "no_such_plugin.py", "list"], "no_such_plugin.py: no such file; give the path of a .py file"),
    (["bench", "--model", "dem"], "--model: unknown config preset or file 'dem'; did you mean 'demo'?"),
    (["bench", "--model", ""], "argument --model: is empty; give at least one character"),
    (["bench", "--ops", "--boltzmann"], "argument --boltzmann: not allowed with argument --ops"),
    (["list", "sofmax"], "unknown mixer 'sofmax'; did you mean 'softmax'?"),
    (["list", "demo"], "demo is a config, not a mixer; attnlab list --params demo"),
    (["list", "--params", "dem"], "unknown config preset or file 'dem'"),
    (["doctor", "--train-steps", "-1"], "argument --train-steps: -1 is out of range; give 0 or more"),
    (["doctor", "--train-steps", "x"], "argument --train-steps: 'x' is not an integer"),
    (["demo", "--out", "."], "--out . exists and is not an earlier demo's folder"),
    (["train", "demo", "--resume", "nosuchrun"], "--resume nosuchrun does not exist"),
    (["train", "demo", "--quiet", "--bogus"], "unrecognized arguments: --bogus (see attnlab train --help)"),
    (["results", "--readme", "NOPE.md"], "--readme NOPE.md is not a file"),
    (["generat", "runs/x"], "argument command: invalid choice: 'generat'"),
    (["trian", "demo"], "argument command: invalid choice: 'trian'; did you mean 'train'? (choose from 'train', "),
    (["eval", "runs/x", "--split", "vall"], "argument --split: invalid choice: 'vall'; did you mean 'val'?"),
    (["train", "demo", "out_dir=/proc/attnlab-test", "--quiet"], "out_dir=/proc/attnlab-test: "),
    (["export", "runs/x", "/proc/attnlab-test"], "the output folder /proc/attnlab-test cannot be made in /proc (No "
                                                 "such file or directory); give a folder where you can write"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_INPUT, ids=[" ".join(a[:3]) for a, _ in BAD_INPUT])
def test_bad_input_gets_one_clear_line(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written, but if it were, not into the checkout
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    (tmp_path / "placeholder").write_text("")  # the working folder is not empty (demo --out .)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("argv", [["report", "results/mypaper"], ["results", "--root", "results"]])
def test_results_of_a_paper_nothing_registers_say_how_to_import_it(argv, capsys, tmp_path, monkeypatch):
    """A results folder of a paper kept outside attnlab, which does not record where the paper came from."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "mypaper").mkdir(parents=True)
    (tmp_path / "results" / "mypaper" / "results.json").write_text('{"suite": "mypaper", "runs": {}}')
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: results/mypaper/results.json is of suite 'mypaper', which no imported paper "
                          "registers; pass --import <module or file.py> (before the command) or set "
                          "ATTNLAB_IMPORT"), err
    assert "Traceback" not in err and err.count("\n") == 1
    assert sorted(p.name for p in (tmp_path / "results").rglob("*")) == ["mypaper", "results.json"]


@pytest.mark.parametrize("positions", [12, 0])  # learned positions and the window both stop at 12, or the window alone
def test_decoding_past_a_window_is_refused_in_one_line(positions, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    run = ["name=b", f"out_dir={tmp_path}", "train.steps=1", "train.batch_size=2", "train.eval_batches=1",
           "data.max_chars=20000", f"model.positions={positions}"]
    assert main(["train", "boltzmann-char", *run, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "b"), "--tokens", "30", "--context", "0"]) == 2
    err = capsys.readouterr().err
    message = "--tokens 30 after a prompt of 1 tokens would have the model read 30 at once under --context 0"
    assert message in err and "beyond the 12 it can" in err and "Traceback" not in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def text_run(tmp_path_factory) -> str:
    """A 2-step character model on a little text (no '?', no capital 'W': needle prompts cannot be written)."""
    folder = tmp_path_factory.mktemp("run")
    (folder / "text.txt").write_text("".join(f"Line {i}: the quick brown fox, {i % 7} times.\n" for i in range(300)))
    overrides = ["name=t", f"out_dir={folder}", "data.source=text", f"data.path={folder / 'text.txt'}",
                 f"data.cache_dir={folder / 'cache'}", "model.d_model=16", "model.n_layers=1", "model.n_heads=2",
                 "train.steps=2", "train.batch_size=2", "train.seq_len=16", "train.eval_batches=1"]
    assert main(["train", "demo", *overrides, "--quiet"]) == 0
    return str(folder / "t")


RUN_BAD_INPUT = [
    (["generate", "{run}", "--prompt", "Zürich"], "--prompt: characters ['Z', 'ü'] are not in this model's vocabulary"),
    (["eval", "{run}", "--task", "mqar"], "--task mqar needs a run trained on data.source=mqar"),
    (["eval", "{run}", "--task", "niah"], "--task niah --kind passkey: characters ['H', 'T', "),
    (["eval", "{run}", "--seq-len", "100000"], "--seq-len 100000: the val split of"),
    (["eval", "{run}", "--task", "extrapolation", "--lengths", "100000"], "give --lengths up to"),
    (["couplings", "{run}"], "has no Boltzmann layer with couplings J"),
]


@pytest.mark.parametrize(("argv", "message"), RUN_BAD_INPUT, ids=[" ".join(a[::2]) for a, _ in RUN_BAD_INPUT])
def test_bad_input_for_a_run_gets_one_clear_line(argv, message, text_run, capsys):
    assert main([a.replace("{run}", text_run) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["list", "~nosuchuser0"], ["train", "~nosuchuser0/run.yaml"],
                                  ["train", "demo", "--resume", "~nosuchuser0/ckpt"]])
def test_a_home_folder_of_no_user_is_a_path_like_any_other(capsys, argv):
    """`~name` naming no user stays as typed, as in a shell (pathlib's expanduser raises instead): not found."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "~nosuchuser0" in err and err.count("\n") == 1


def test_debug_adds_the_traceback(capsys):
    assert main(["--debug", "train", "demo", "model.mixer=sofmax"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_the_fla_backend_without_a_gpu_is_one_line(capsys, monkeypatch):
    monkeypatch.setattr(fla_ops, "available", lambda: True)  # fla installed ...
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # ... on a machine without CUDA
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert main(["train", "demo", "model.mixer=gla", "model.mixer_options.gla.backend=fla"]) == 2
    assert capsys.readouterr().err == ("error: model.mixer_options.gla: backend=fla runs flash-linear-attention's "
                                       "Triton kernels, which need a CUDA GPU, and this machine has none; use "
                                       "backend=torch or backend=auto\n")


def test_the_fla_backend_on_cpu_tensors_is_refused_before_any_kernel(monkeypatch):
    monkeypatch.setattr(fla_ops, "available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine, and the model on its CPU
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    mixer = build_mixer("gla", d_model=16, n_heads=2, backend="fla")
    with pytest.raises(ConfigError, match=r"need a CUDA GPU, and this model runs on cpu; use backend=torch or "):
        mixer(torch.randn(1, 8, 16))


@pytest.mark.parametrize("mixer, option, problem", [
    ("boltzmann", "backend=cuda", "boltzmann.backend 'cuda'. Known: auto, flex, torch, triton"),
    ("boltzmann", "backend=flex", "backend=flex runs fields only (mode=h-only without bias_field)"),
    ("interdomain", "backend=cuda", "interdomain.backend 'cuda'. Known: auto, fla, torch"),
    ("interdomain", "query=linear backend=fla", "backend=fla runs the chunk form's query read "
                                                "(query=conditioned, form=chunk), not query=linear"),
])
def test_a_bad_backend_is_one_line(capsys, mixer, option, problem):
    options = [f"model.mixer_options.{mixer}.{each}" for each in option.split()]
    assert main(["train", "demo", f"model.mixer={mixer}", *options]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"model.mixer_options.{mixer}" in err and problem in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("record, said", [({"val_ppl": "abc"}, "'val_ppl' is 'abc', not a number"),
                                          (5, "is not an object of named values (int)")])
@pytest.mark.parametrize("argv", [["report", "res/boltzmann"], ["reproduce", "boltzmann", "--out", "res", "--dry-run"],
                                  ["results", "--root", "res", "--print"]], ids=["report", "dry-run", "results"])
def test_a_results_record_of_the_wrong_shape_gets_one_line_naming_the_file_and_the_record(argv, record, said, capsys,
                                                                                         tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "res" / "boltzmann"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"suite": "boltzmann", "runs": {"lm-T8/softmax/0": record}}))
    before = sorted(tmp_path.rglob("*"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "results.json: the record lm-T8/softmax/0" in err and said in err, err
    assert err.count("\n") == 1 and sorted(tmp_path.rglob("*")) == before  # nothing written
