import json
import os
import re
import string
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import yaml

from attnlab import plugins
from attnlab.bench import mixers as bench_mixers
from attnlab.bench import packed as bench_packed
from attnlab.cli import build_parser, main
from attnlab.config import load_config
from attnlab.data.niah import NOISE
from attnlab.inference import load_run
from attnlab.mixers import list_mixers, registry
from attnlab.papers import PAPERS


def tiny_overrides(text_file, tmp_path):
    return ["name=cli", f"out_dir={tmp_path / 'runs'}", "data.source=text", f"data.path={text_file}",
            f"data.cache_dir={tmp_path / 'cache'}", "model.d_model=32", "model.n_layers=1", "train.steps=4",
            "train.batch_size=2", "train.seq_len=16", "train.eval_batches=1", "train.ckpt_every=4"]


def test_train_eval_generate(text_file, tmp_path, capsys):
    assert main(["train", "demo", "--quiet", *tiny_overrides(text_file, tmp_path)]) == 0  # overrides after options
    run = str(tmp_path / "runs" / "cli")
    assert main(["eval", run, "--batches", "2"]) == 0
    assert "val loss" in capsys.readouterr().out
    assert main(["generate", run, "--prompt", "Line", "--tokens", "12", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Line") and len(text.rstrip("\n")) >= 4


def test_the_example_yaml_trains_into_a_run_named_after_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    example = str(Path(__file__).resolve().parents[1] / "examples" / "train.yaml")
    small = [f"out_dir={tmp_path / 'runs'}", "data.max_chars=20000", "model.d_model=32", "model.n_layers=2",
             "model.layers=[softmax,gla]", "train.steps=1", "train.batch_size=2", "train.seq_len=16",
             "train.eval_batches=1"]
    assert main(["train", example, *small, "--quiet"]) == 0
    assert (tmp_path / "runs" / "train" / "step-00000001").is_dir()


def test_user_errors_are_one_line_without_traceback(capsys):
    assert main(["train", "demo", "model.mixer=sofmax"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model.mixer: unknown mixer 'sofmax'; did you mean 'softmax'?")
    assert "Traceback" not in err and err.count("\n") == 1


def test_generate_from_missing_run(tmp_path, capsys):
    assert main(["generate", str(tmp_path / "nothing")]) == 2
    assert "is neither a run folder nor a checkpoint folder" in capsys.readouterr().err


def test_list_mixers_and_params(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "softmax" in out and "differential" in out and "demo" in out
    assert main(["list", "--params", "demo"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["softmax"][2] == "+0.000%" and rows["differential"][1] != rows["softmax"][1]


def test_couplings_report_and_figure(text_file, tmp_path, capsys):
    overrides = tiny_overrides(text_file, tmp_path) + [
        "model.mixer=boltzmann", "model.n_heads=1", "train.seq_len=8",
        "model.mixer_options.boltzmann.window=8", "model.mixer_options.boltzmann.j_init_std=0.1"]
    assert main(["train", "demo", *overrides, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["couplings", str(tmp_path / "runs" / "cli"), "--out", str(tmp_path / "fig")]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert "mean J by distance" in out and len(rows) == 7  # distances 1..window-1
    assert (tmp_path / "fig" / "couplings-layer0.png").stat().st_size > 1000


def test_couplings_of_a_model_without_them(text_file, tmp_path, capsys):
    assert main(["train", "demo", *tiny_overrides(text_file, tmp_path), "--quiet"]) == 0
    assert main(["couplings", str(tmp_path / "runs" / "cli")]) == 2
    assert "has no Boltzmann layer with couplings J" in capsys.readouterr().err


def test_train_and_evaluate_mqar(tmp_path, capsys):
    overrides = ["name=mq", f"out_dir={tmp_path / 'runs'}", "model.d_model=32", "model.n_layers=1",
                 "data.mqar.train_examples=64", "data.mqar.test_examples=32", "data.mqar.test_pairs=[1,4]",
                 "train.steps=3", "train.batch_size=8", "train.eval_batches=1", "train.ckpt_every=3"]
    assert main(["train", "mqar", *overrides, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "runs" / "mq"), "--task", "mqar"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["mqar test accuracy", "mqar test pairs=1", "mqar test pairs=4"]
    assert main(["eval", str(tmp_path / "runs" / "mq"), "--task", "brackets"]) == 2


def test_train_brackets_with_a_pointer_head(tmp_path, capsys):
    overrides = ["name=br", f"out_dir={tmp_path / 'runs'}", "data.brackets.train_examples=64",
                 "data.brackets.test_examples=16", "train.steps=2", "train.batch_size=8", "train.eval_batches=1",
                 "train.ckpt_every=2", "model.ffn=false"]
    assert main(["train", "brackets", *overrides, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "runs" / "br"), "--task", "brackets"]) == 0
    assert "brackets test accuracy" in capsys.readouterr().out


def test_extrapolation_and_needle_evaluations(text_file, tmp_path, capsys):
    assert main(["train", "demo", *tiny_overrides(text_file, tmp_path), "--quiet"]) == 0
    run = str(tmp_path / "runs" / "cli")
    capsys.readouterr()
    assert main(["eval", run, "--task", "extrapolation", "--lengths", "16", "32", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "context     16 (1.0x training)" in out and (tmp_path / "extrapolation.png").exists()
    assert main(["eval", run, "--task", "niah", "--lengths", "120", "--samples", "1"]) == 2  # vocabulary lacks '?'


def test_a_pointer_head_run_resumes(tmp_path):
    overrides = ["name=br", f"out_dir={tmp_path / 'runs'}", "data.brackets.train_examples=32",
                 "data.brackets.test_examples=8", "train.batch_size=4", "train.eval_batches=1", "train.ckpt_every=2"]
    assert main(["train", "brackets", *overrides, "train.steps=2", "--quiet"]) == 0
    assert main(["train", "brackets", *overrides, "train.steps=4", "--quiet", "--resume", "auto"]) == 0
    assert (tmp_path / "runs" / "br" / "step-00000004").is_dir()


def test_reproduce_estimate_prints_gpu_hours_without_training(tmp_path, capsys):
    assert main(["reproduce", "interdomain", "--tier", "paper", "--estimate", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("interdomain (paper): ≈ ") and "GPU-hours" in out and "scale-1.3b" in out
    assert not list(tmp_path.iterdir())  # nothing trained, nothing written
    assert main(["reproduce", "ccq", "--tier", "protocol"]) == 2
    assert "unknown tier of ccq 'protocol'" in capsys.readouterr().err


def test_report_is_rebuilt_from_results_json_alone(tmp_path, capsys):
    runs = {f"mqar/{arm}/{seed}": {"accuracy": acc, "seconds": 1.0, "params": 10}
            for arm, acc in [("softmax", 0.99), ("coupled-qk", 0.98)] for seed in range(2)}
    (tmp_path / "results.json").write_text(json.dumps({"suite": "coupled-qk", "runs": runs}))
    assert main(["report", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "## Verdicts" in report and "partial: 4 of " in report and "| coupled-qk |" in report
    assert "finished" not in report  # a partial suite is not called finished
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_reproduce_all_takes_the_suites_that_have_the_tier_and_checks_only_first(tmp_path, capsys):
    assert main(["reproduce", "all", "--tier", "converged", "--estimate"]) == 0
    out = capsys.readouterr().out
    assert "ccq (converged)" in out and "interdomain (converged)" in out and "boltzmann" not in out
    assert main(["reproduce", "all", "--only", "nothing-*", "--out", str(tmp_path)]) == 2
    assert "--only nothing-* matches no experiment" in capsys.readouterr().err
    assert main(["reproduce", "all", "--arms", "nothing", "--out", str(tmp_path)]) == 2
    assert "--arms nothing matches no arm of coupled-qk, ccq, boltzmann, interdomain" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    (tmp_path / "results.json").write_text("[]")
    assert main(["report", str(tmp_path)]) == 2
    assert "is not a suite's results" in capsys.readouterr().err


def test_eval_scores_the_whole_split_or_what_training_measured(text_file, tmp_path, capsys):
    overrides = [*tiny_overrides(text_file, tmp_path), "train.eval_batches=3"]
    assert main(["train", "demo", *overrides, "--quiet"]) == 0
    trained = capsys.readouterr().out.split("done: val loss ")[1].split(",")[0]
    assert main(["eval", str(tmp_path / "runs" / "cli"), "--batches", "3"]) == 0
    out = capsys.readouterr().out
    assert f"val loss {trained} nats/token" in out and "(3 batches of 2 x 16 tokens, --batches" in out
    assert main(["eval", str(tmp_path / "runs" / "cli")]) == 0
    out = capsys.readouterr().out
    assert "every position of the split once" in out and f"val loss {trained} nats/token" not in out


def test_niah_lengths_default_to_what_the_kind_needs(tmp_path, capsys):
    """A uuid needle, its question and its answer but the last character take 182 characters, more than the 16 of
    training: eval starts at 192."""
    text = "".join(f"Line {i}: the quick brown fox. " for i in range(300)) + (NOISE + string.printable) * 5
    (tmp_path / "t.txt").write_text(text)
    assert main(["train", "demo", *tiny_overrides(tmp_path / "t.txt", tmp_path), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "runs" / "cli"), "--task", "niah", "--kind", "uuid", "--samples", "1"]) == 0
    out = capsys.readouterr().out
    assert "a uuid sample needs at least 182 tokens" in out
    assert "S-NIAH uuid at 192 tokens" in out and "S-NIAH uuid at 384 tokens" in out


def test_niah_eval_measures_the_needles_a_niah_run_trained_on_unless_told_otherwise(tmp_path, capsys):
    niah = [f"data.task_options.niah.{k}" for k in ("kind=multikey", "keys=2", "train_examples=4", "test_per_depth=1")]
    overrides = ["name=mk", f"out_dir={tmp_path}", "data.source=niah", *niah, "model.d_model=16", "model.n_layers=1",
                 "model.n_heads=2", "train.steps=1", "train.batch_size=2", "train.seq_len=256", "train.eval_batches=1"]
    assert main(["train", "demo", *overrides, "--quiet"]) == 0
    run = ["eval", str(tmp_path / "mk"), "--task", "niah", "--samples", "1", "--lengths", "256"]
    for flags, measured in [([], "multikey, 2 keys"), (["--keys", "3"], "multikey, 3 keys"),
                            (["--kind", "passkey"], "passkey")]:
        capsys.readouterr()
        assert main([*run, *flags]) == 0
        assert f"S-NIAH {measured} at 256 tokens" in capsys.readouterr().out, flags


def test_progress_bar_only_on_a_terminal(text_file, tmp_path, capsys):
    assert main(["train", "demo", *tiny_overrides(text_file, tmp_path)]) == 0  # no --quiet; stderr is no terminal
    assert "it/s" not in capsys.readouterr().err


def test_version_and_help_for_every_option(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0 and capsys.readouterr().out.startswith("attnlab ")
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert set(commands) >= {"train", "eval", "generate", "list", "bench", "doctor"}
    for name, command in commands.items():
        for action in command._actions:
            assert action.help, f"attnlab {name} {action.dest} has no help"


def test_train_help_documents_mixer_options(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "model.mixer_options.<mixer>.<field>=<value>" in capsys.readouterr().out


def test_list_shows_field_types_defaults_and_meaning(capsys):
    assert main(["list", "boltzmann"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["window"].split()[1:4] == ["int", "16", "the"] and "the most positions a query sees" in rows["window"]
    assert "d_model" not in rows and "exact | banded | mean-field | dqa" in rows["inference"]
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "model.mixer_options.<mixer>.<field>" in out and "    chunk_size" in out and "presets:" in out


def test_a_task_run_refuses_text(tmp_path, capsys):
    overrides = ["name=mq", f"out_dir={tmp_path / 'runs'}", "model.d_model=32", "model.n_layers=1",
                 "data.mqar.train_examples=64", "data.mqar.test_examples=32", "train.steps=2", "train.batch_size=8",
                 "train.eval_batches=1"]
    assert main(["train", "mqar", *overrides, "--quiet"]) == 0
    run = str(tmp_path / "runs" / "mq")
    capsys.readouterr()
    assert main(["generate", run, "--prompt", "hello"]) == 2
    assert "--prompt: this model reads token ids, not text: give integers from 0 to" in capsys.readouterr().err
    assert main(["generate", run, "--prompt", "1 2 3", "--tokens", "2"]) == 0
    assert capsys.readouterr().out.startswith("1 2 3 ")
    assert main(["eval", run, "--task", "extrapolation"]) == 2
    assert "--task extrapolation needs a run trained on text" in capsys.readouterr().err
    assert main(["eval", run, "--seq-len", "8"]) == 2
    assert "--seq-len applies to runs trained on text" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------
# mixers from outside attnlab (attnlab.plugins)

PLUGIN = '''
from attnlab.mixers import mixer_class, register_mixer


@register_mixer("echo")
class Echo(mixer_class("softmax")):
    """Softmax attention under another name, registered from a file outside attnlab."""
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A .py file outside attnlab that registers the mixer 'echo', and forget(), which unloads it: what a new
    process would not have."""
    path = tmp_path / "echo_mixer.py"
    path.write_text(PLUGIN)
    built_in = dict(registry._REGISTRY)
    monkeypatch.setattr(registry, "_REGISTRY", dict(built_in))
    monkeypatch.setattr(plugins, "_files", {})
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)

    def forget():
        registry._REGISTRY.clear()
        registry._REGISTRY.update(built_in)
        plugins._files.clear()
        for name in [m for m in sys.modules if m.startswith("attnlab_plugin_") or m == "echo_mixer"]:
            del sys.modules[name]

    yield path, forget
    forget()


def test_a_plugin_mixer_is_listed_trained_evaluated_and_sampled_with_import(plugin, text_file, tmp_path, capsys):
    path, forget = plugin
    assert main(["list", "echo"]) == 2
    assert "unknown mixer 'echo': it is not built in" in capsys.readouterr().err
    imported = ["--import", str(path)]
    assert main([*imported, "list", "echo"]) == 0
    assert "echo: Softmax attention under another name" in capsys.readouterr().out
    assert main([*imported, "train", "demo", "--quiet", *tiny_overrides(text_file, tmp_path), "model.mixer=echo"]) == 0
    run = str(tmp_path / "runs" / "cli")
    forget()
    assert main([*imported, "eval", run, "--batches", "1"]) == 0
    assert "val loss" in capsys.readouterr().out
    forget()
    assert main([*imported, "generate", run, "--prompt", "Line", "--tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith("Line")


def test_a_run_imports_the_plugin_its_mixers_came_from(plugin, text_file, tmp_path, capsys):
    path, forget = plugin
    assert main(["--import", str(path), "train", "demo", "--quiet", *tiny_overrides(text_file, tmp_path),
                 "model.mixer=echo"]) == 0
    run = tmp_path / "runs" / "cli"
    saved = yaml.safe_load(next(run.glob("step-*/config.yaml")).read_text())
    assert saved["imports"] == [str(path.resolve())]
    forget()
    assert main(["eval", str(run), "--batches", "1"]) == 0  # no --import: the run's config names the file
    forget()
    moved = path.rename(tmp_path / "moved_mixer.py")
    capsys.readouterr()
    assert main(["eval", str(run), "--batches", "1"]) == 2
    err = capsys.readouterr().err
    assert "echo_mixer.py: no such file" in err and "mixer 'echo' is not built in: pass --import" in err
    assert err.count("\n") == 1
    assert main(["--import", str(moved), "eval", str(run), "--batches", "1"]) == 0  # stands in for the old place


def test_plugins_named_in_the_environment(plugin, text_file, tmp_path, capsys, monkeypatch):
    path, forget = plugin
    monkeypatch.setenv(plugins.ENV_VAR, f"json, {path}")  # a module and a file, comma-separated
    assert main(["train", "demo", "--quiet", *tiny_overrides(text_file, tmp_path), "model.mixer=echo"]) == 0
    run = str(tmp_path / "runs" / "cli")
    forget()
    assert main(["eval", run, "--batches", "1"]) == 0
    forget()
    assert main(["generate", run, "--prompt", "Line", "--tokens", "4"]) == 0
    monkeypatch.setenv(plugins.ENV_VAR, "no_such_plugin")
    capsys.readouterr()
    assert main(["list"]) == 2
    assert capsys.readouterr().err == ("error: ATTNLAB_IMPORT entry no_such_plugin: no module of that name here; "
                                       "give an importable module or a .py file's path\n")


def test_the_environment_variable_reaches_a_new_process(plugin):
    path, _ = plugin
    env = {**os.environ, plugins.ENV_VAR: str(path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "attnlab.cli", "list", "echo"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "echo: Softmax attention under another name" in done.stdout


def test_installed_entry_points_register_their_mixers(plugin, tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(tmp_path))  # where the plugin's package would be installed
    point = EntryPoint(name="echo", value="echo_mixer", group=plugins.ENTRY_POINTS)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [point] if group == plugins.ENTRY_POINTS else [])
    monkeypatch.setattr(plugins, "_entry_points_loaded", False)
    assert load_config(None, ["model.mixer=echo"]).model.mixer == "echo"  # from Python, without the command line
    assert main(["list", "echo"]) == 0


def test_export_refuses_a_plugin_mixer_in_one_line(plugin, text_file, tmp_path, capsys):
    pytest.importorskip("transformers")
    path, _ = plugin
    assert main(["--import", str(path), "train", "demo", "--quiet", *tiny_overrides(text_file, tmp_path),
                 "model.mixer=echo"]) == 0
    capsys.readouterr()
    assert main(["export", str(tmp_path / "runs" / "cli"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: attnlab export: mixer 'echo' comes from {path.resolve()}, not attnlab")
    assert err.count("\n") == 1 and not (tmp_path / "hf").exists()


# ---------------------------------------------------------------------------------------------------
# list and bench


def test_list_params_counts_the_model_that_train_builds(text_file, tmp_path, capsys):
    overrides = tiny_overrides(text_file, tmp_path)
    assert main(["train", "demo", "--quiet", *overrides]) == 0
    trained = load_run(tmp_path / "runs" / "cli").model
    capsys.readouterr()
    assert main(["list", "--params", "demo", *overrides]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert int(rows["softmax"][1].replace(",", "")) == trained.num_params()
    assert out.startswith(f"demo model, vocab {trained.cfg.vocab_size} (fitted to the data")


def test_every_mixer_has_a_description_that_is_one_plain_sentence(capsys):
    """What list prints of a mixer describes it in one sentence of plain text: no reST markup, no pointer elsewhere."""
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in list_mixers():
        (line,) = [line for line in lines if line.split(":")[0].strip() == name and not line.startswith("    ")]
        description = line.partition(": ")[2]
        assert description[:1].isupper() and description.endswith("."), f"{name}: {description!r}"
        assert "``" not in description and "see the" not in description.lower(), f"{name}: {description!r}"
        # a sentence ends at a full stop before a capital ("et al. 2024" and "q_i . k_j" do not end one)
        assert not re.search(r"(?<! al)(?<! )\.\s+[A-Z]", description[:-1]), f"{name}: {description!r}"


def test_the_suites_reproduce_offers_are_the_registered_papers(capsys):
    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])
    listed = re.sub(r"-\s+", "-", " ".join(capsys.readouterr().out.split()))  # help wraps lines at hyphens too
    assert all(name in listed for name in PAPERS)
    for name in ("demo", "boltzman"):  # the demo's suite is `attnlab demo`'s
        assert main(["reproduce", name, "--estimate"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: unknown suite '{name}'") and all(p in err for p in PAPERS)
        assert err.count("\n") == 1


def test_bench_batch_goes_with_lengths(monkeypatch):
    calls = []
    monkeypatch.setattr(bench_mixers, "bench_mixers", lambda **kwargs: calls.append(kwargs))
    assert main(["bench", "--lengths", "16", "--batch", "2"]) == 0
    assert main(["bench", "--lengths", "16"]) == 0
    assert [c["batch"] for c in calls] == [2, 1]


def test_bench_packed_takes_a_length_and_repeats_and_refuses_a_batch(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(bench_packed, "bench_packed", lambda **kwargs: calls.append(kwargs))
    assert main(["bench", "--packed", "--lengths", "64", "--repeats", "2"]) == 0
    assert main(["bench", "--packed"]) == 0
    assert calls == [{"seq_len": 64, "repeats": 2}, {"seq_len": 512, "repeats": 3}]
    assert main(["bench", "--packed", "--batch", "2"]) == 2
    assert "--batch applies only to the mixers alone (--lengths), not to --packed" in capsys.readouterr().err
