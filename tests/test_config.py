import logging
import re
from pathlib import Path

import ema_mixer
import pytest
import torch

from attnlab.config import ModelConfig, RunConfig, apply_overrides, list_presets, load_config
from attnlab.errors import ConfigError
from attnlab.model import Decoder
from attnlab.typed import field_docs, from_dict


def test_presets_load_and_validate():
    assert "demo" in list_presets()
    for name in list_presets():
        assert isinstance(load_config(name), RunConfig)


def test_dotted_overrides_are_typed():
    cfg = load_config("demo", ["model.mixer=sigmoid", "train.steps=7", "train.lr=3e-4",
                               "model.layers=[softmax, sigmoid, softmax, differential]",
                               "model.mixer_options.softmax.rope=false"])
    assert cfg.model.mixer == "sigmoid" and cfg.train.steps == 7 and cfg.train.lr == 3e-4
    assert cfg.model.layer_mixers()[3] == "differential"
    assert cfg.model.mixer_options == {"softmax": {"rope": False}}


def test_int_is_accepted_for_float_fields():
    assert load_config(None, ["train.lr=1"]).train.lr == 1.0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.mixer=sofmax"], "model.mixer: unknown mixer 'sofmax'; did you mean 'softmax'?"),
        (["model.d_model=-8"], "model.d_model=-8 must be a positive integer"),
        (["model.n_heads=0"], "model.n_heads=0 must be a positive integer"),
        (["model.d_model=100", "model.n_heads=3"], "model.n_heads=3 does not divide model.d_model=100"),
        (["model.layers=[softmax]"], "model.layers lists 1 mixers but model.n_layers=4"),
        (["model.mixer_options.sigmod.bias=1"], "model.mixer_options: unknown mixer 'sigmod'; did you mean 'sigmoid'?"),
        (["model.mixer_options.gla.chunk_size=0"], "model.mixer_options.gla: chunk_size=0 must be positive"),
        (["train.setps=5"], "unknown field 'train.setps'; did you mean 'train.steps'?"),
        (["train.steps=many"], "train.steps='many' must be of type int"),
        (["train.batch_size=10", "train.grad_accum=3"], "train.batch_size=10 is not divisible"),
        (["train.precision=fp8"], "unknown train.precision 'fp8'"),
        (["data.source=text"], "data.source=text needs data.path"),
        (["data.source=text", "data.path=/no/such/file.txt"], "data.path=/no/such/file.txt does not exist"),
        (["data.val_fraction=1.5"], "data.val_fraction=1.5 must be between 0 and 1"),
        (["train"], "override 'train' must look like section.field=value"),
        (["modle.d_model=8"], "unknown field 'modle'; did you mean 'model'?"),
        (["model.positions=64"], "model.positions=64 learned positions cannot cover train.seq_len=128"),
        (["model.positions=-1"], "model.positions=-1 must be >= 0"),
    ],
)
def test_bad_values_get_clear_messages(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config("demo", overrides)
    assert message in str(err.value)


def test_the_example_yaml_loads_and_names_its_run_after_itself():
    cfg = load_config(str(Path(__file__).resolve().parents[1] / "examples" / "train.yaml"))
    assert cfg.name == "train" and cfg.model.layer_mixers() == ["softmax", "gla", "softmax", "gla"]
    assert cfg.model.mixer_config("gla").chunk_size == 32 and cfg.train.steps == 1000


def test_a_yaml_file_without_a_name_names_its_run_after_the_file(tmp_path):
    (tmp_path / "small.yaml").write_text("train:\n  steps: 3\n")
    (tmp_path / "named.yaml").write_text("name: mine\ntrain:\n  steps: 3\n")
    assert load_config(str(tmp_path / "small.yaml")).name == "small"
    assert load_config(str(tmp_path / "named.yaml")).name == "mine"
    assert load_config(str(tmp_path / "small.yaml"), ["name=other"]).name == "other"


def test_a_mixers_unknown_field_lists_only_the_fields_its_entry_may_set():
    """d_model, n_heads and layer_idx come from the model, and an entry that sets one is refused: never offered."""
    with pytest.raises(ConfigError) as err:
        load_config("demo", ["model.mixer_options.softmax.rop=false"])
    known = str(err.value).split("Known: ")[1].split(", ")
    assert known == ["model.mixer_options.softmax.output_gate", "model.mixer_options.softmax.rope",
                     "model.mixer_options.softmax.rope_base"]


def test_unknown_preset_suggests():
    with pytest.raises(ConfigError, match="did you mean 'demo'"):
        load_config("dem")


def test_yaml_file_by_path(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nmodel:\n  d_model: 64\ntrain:\n  steps: 3\n")
    cfg = load_config(str(path), ["train.steps=4"])
    assert (cfg.name, cfg.model.d_model, cfg.train.steps) == ("mine", 64, 4)
    path.write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(str(path))


def test_round_trip_through_dict():
    cfg = load_config("demo")
    assert from_dict(RunConfig, cfg.to_dict()) == cfg


def test_overrides_build_nested_sections():
    assert apply_overrides({}, ["a.b.c=1", "a.d=x"]) == {"a": {"b": {"c": 1}, "d": "x"}}


def test_a_short_run_keeps_half_its_steps_out_of_warmup(caplog):
    with caplog.at_level(logging.WARNING, logger="attnlab.config"):
        assert load_config("demo", ["train.steps=20"]).train.warmup_steps == 10
    assert "train.warmup_steps=100 is more than half of train.steps=20; warming up for 10 steps" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="attnlab.config"):
        assert load_config("demo", ["train.steps=200"]).train.warmup_steps == 100  # the preset's own
        saved = load_config("demo", ["train.steps=20"]).to_dict()
        caplog.clear()
        from_dict(RunConfig, saved).validate()  # a trained run read back: already capped, nothing to say
    assert caplog.text == ""


def test_field_docs_are_the_source_comments():
    docs = field_docs(ModelConfig)
    assert docs["ffn_hidden"].startswith("feed-forward width; None: SwiGLU 8/3 * d_model")  # on the field's line
    assert docs["positions"].startswith("learned absolute position embeddings for this many positions")  # above it
    assert docs["d_model"] == ""


@pytest.mark.parametrize("override, message", [
    ("model.mixer_options.boltzmann.windw=8", "unknown field 'model.mixer_options.boltzmann.windw'; did you mean"),
    ("model.mixer_options.gla.chunk_size=0", "chunk_size=0 must be positive"),
    ("model.mixer_options.gla.chunk_size=big", "model.mixer_options.gla.chunk_size='big' must be of type int"),
])
def test_every_mixer_options_entry_is_typed_at_load_even_for_mixers_not_in_use(override, message, monkeypatch):
    """The model is softmax: a mistake in another mixer's options still fails when the config loads,
    before any data is read."""
    def no_data(*_):
        raise AssertionError("data was read")

    monkeypatch.setattr("attnlab.data.load_corpus", no_data)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("demo", ["model.mixer=softmax", override])


@pytest.mark.parametrize("overrides, expected", [
    (["train.log_to=tensorboard"], {"log_to": ["tensorboard"]}),
    (["model.n_layers=1", "model.layers=gla"], {"layers": ["gla"]}),
    (["train.log_to=[tensorboard, wandb]"], {"log_to": ["tensorboard", "wandb"]}),
])
def test_one_name_is_a_list_of_one(overrides, expected):
    cfg = load_config("demo", overrides)
    for name, value in expected.items():
        assert getattr(cfg.train if name == "log_to" else cfg.model, name) == value


@pytest.mark.parametrize("d_model, n_heads", [(100, 4), (100, 3), (96, 5)])
def test_a_head_count_that_does_not_fit_suggests_only_counts_that_do(d_model, n_heads):
    sizes = [f"model.d_model={d_model}", "model.n_layers=1"]
    with pytest.raises(ConfigError) as error:
        load_config("demo", [*sizes, f"model.n_heads={n_heads}"])
    suggested = re.search(r"choose model.n_heads from \[([\d, ]+)\]", str(error.value))[1].split(", ")
    assert len(suggested) >= 2
    for heads in suggested:
        cfg = load_config("demo", [*sizes, f"model.n_heads={heads}"])
        with torch.device("meta"):
            Decoder(cfg.sized_model())  # RoPE, which needs an even head width, builds


def test_an_odd_head_width_is_refused_under_rope_and_builds_without_it():
    odd = ["model.d_model=100", "model.n_heads=4", "model.n_layers=1"]
    with pytest.raises(ConfigError, match="heads 100 / 4 = 25 channels wide, and RoPE needs an even width"):
        load_config("demo", odd)
    cfg = load_config("demo", [*odd, "model.mixer_options.softmax.rope=false"])
    with torch.device("meta"):
        assert Decoder(cfg.sized_model()).blocks[0].mixer.cfg.head_dim == 25


def test_the_sixty_million_preset_takes_its_vocabulary_from_its_tokenizer():
    cfg = load_config("coupled-qk-60m")
    assert cfg.model.vocab_size == 0 and cfg.data.tokenizer == "bpe"
    assert cfg.sized_model().vocab_size == cfg.data.bpe_vocab == 50257  # GPT-2's size, which its 60M counts
    assert load_config("coupled-qk-60m", ["data.bpe_vocab=4096"]).sized_model().vocab_size == 4096


def test_a_saved_config_names_the_plugins_of_its_mixers():
    cfg = load_config("demo", ["model.mixer=ema", "imports=json"])  # ema: examples/ema_mixer.py, from conftest
    saved = cfg.to_dict()
    assert saved["imports"] == ["json", str(Path(ema_mixer.__file__).resolve())]
    assert from_dict(RunConfig, saved).validate().to_dict() == saved  # read back, the same
    assert load_config("demo").to_dict()["imports"] == []  # built-in mixers need nothing


def test_the_sizes_a_model_leaves_to_the_data_are_filled_in_one_place():
    from attnlab.config import ModelConfig

    left = ModelConfig()  # vocab_size 0: the tokenizer's; output_size 0: the vocabulary
    assert left.fitted(65).vocab_size == 65 and left.fitted(65).output_size == 0 and left.fitted(65).tie_embeddings
    pointer = left.fitted(40, output_size=16)  # a task's pointer head scores positions: its embeddings are untied
    assert (pointer.vocab_size, pointer.output_size, pointer.tie_embeddings) == (40, 16, False)
    given = ModelConfig(vocab_size=300, output_size=8)
    assert given.fitted(65, output_size=16) == given  # sizes the config sets stay
    with pytest.raises(ConfigError, match="model.vocab_size=300 is smaller than the data's 400; set it to 0"):
        given.fitted(400)
    assert load_config("demo", ["model.vocab_size=100"]).sized_model().vocab_size == 100  # a bound is no data


# ---------------------------------------------------------------------------------------------------
# choices (Literal) and the settings of tasks (data.task_options)


@pytest.mark.parametrize("overrides, message", [
    (["model.norm=rsm"], "unknown model.norm 'rsm'; did you mean 'rms'? Known: layer, rms"),
    (["model.ffn_kind=gelu2"], "unknown model.ffn_kind 'gelu2'; did you mean 'gelu'? Known: gelu, swiglu"),
    (["data.tokenizer=bytes"], "unknown data.tokenizer 'bytes'; did you mean 'byte'? Known: bpe, byte, char"),
    (["data.source=mixed", "data.mix={poems: 1}"], "unknown data.mix key 'poems'. Known: docs, plays, python"),
    (["train.precision=fp8"], "unknown train.precision 'fp8'. Known: bf16, fp32"),
    (["train.precision="], "train.precision= needs a value: give one of fp32, bf16"),
])
def test_a_value_outside_its_choices_names_the_field_the_value_and_the_choices(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config("demo", overrides)
    assert str(err.value) == message


def test_a_config_made_in_python_has_its_choices_checked_too():
    with pytest.raises(ConfigError, match="unknown model.norm 'batch'"):
        ModelConfig(norm="batch").validate()


def test_a_literal_of_other_types_compares_by_type():
    from dataclasses import dataclass
    from typing import Literal

    @dataclass
    class Options:
        bits: Literal[4, 8] = 8
        strict: Literal[True] = True

    assert from_dict(Options, {"bits": 4}).bits == 4
    with pytest.raises(ConfigError, match="unknown bits '5'. Known: 4, 8"):
        from_dict(Options, {"bits": 5})
    with pytest.raises(ConfigError, match="unknown strict '1'"):
        from_dict(Options, {"strict": 1})  # 1 == True in Python, not in a config


def test_a_task_reads_its_typed_settings_from_task_options():
    cfg = load_config("mqar", ["data.task_options.mqar.pairs=8", "train.seq_len=64"])
    assert cfg.data.task_config().pairs == 8 and cfg.data.task_config().vocab_size == 256  # the preset's
    assert cfg.to_dict()["data"]["task_options"]["mqar"]["power_a"] == 0.01  # a run records every setting
    with pytest.raises(ConfigError, match=re.escape("data.task_options.mqar.power_a='steep' must be of type float")):
        load_config("mqar", ["data.task_options.mqar.power_a=steep"])
    with pytest.raises(ConfigError, match=re.escape("data.task_options: unknown task 'mqr'; did you mean 'mqar'?")):
        load_config("mqar", ["data.task_options.mqr.pairs=8"])


OLD_SAVED_DATA = {  # the data section of a run saved before data.task_options: every task's settings, all fields
    "source": "mqar", "path": None, "tokenizer": "char", "bpe_vocab": 4096, "max_chars": None, "val_fraction": 0.1,
    "mix": {"plays": 1.0, "python": 1.0, "docs": 1.0}, "chunk_chars": 512, "seed": 0, "cache_dir": None,
    "pack": False,
    "mqar": {"vocab_size": 256, "pairs": 2, "test_pairs": [2], "power_a": 0.01, "random_non_queries": True,
             "train_examples": 64, "test_examples": 32, "seed": 0},
    "brackets": {"train_examples": 20000, "test_examples": 2000, "balanced": False, "seed": 0},
    "niah": {"kind": "passkey", "prose": "plays", "depths": [0.0, 0.25, 0.5, 0.75, 1.0], "train_examples": 5000,
             "test_per_depth": 20, "seed": 0},
}


def test_a_run_saved_with_task_sections_loads_as_task_options():
    saved = {**RunConfig().to_dict(), "data": OLD_SAVED_DATA}
    cfg = from_dict(RunConfig, saved).validate()
    assert cfg.data.task_config().pairs == 2 and cfg.data.task_config().test_examples == 32
    assert set(cfg.to_dict()["data"]["task_options"]) == {"mqar"}  # the other tasks' defaults are not recorded


def test_old_section_keys_set_the_task_options_in_the_order_given():
    old = load_config("mqar", ["data.mqar.pairs=2", "data.mqar.test_pairs=[2]", "train.seq_len=32"])
    new = load_config("mqar", ["data.task_options.mqar.pairs=2", "data.task_options.mqar.test_pairs=[2]",
                               "train.seq_len=32"])
    assert old == new
    last = load_config("mqar", ["data.mqar.pairs=2", "data.task_options.mqar.pairs=3", "train.seq_len=32"])
    assert last.data.task_config().pairs == 3
    assert load_config("demo", ["data.source=brackets", "data.brackets.balanced=true"]).data.task_config().balanced


def test_a_fingerprint_does_not_depend_on_where_the_task_settings_were_given():
    from attnlab.lab.configs import fingerprint

    saved = from_dict(RunConfig, {**load_config("mqar").to_dict(), "data": OLD_SAVED_DATA})
    given = load_config("mqar", ["data.task_options.mqar.pairs=2", "data.task_options.mqar.test_pairs=[2]",
                                 "data.task_options.mqar.train_examples=64",
                                 "data.task_options.mqar.test_examples=32"])
    assert fingerprint(saved) == fingerprint(given)
    # the settings hashed are where the task sections were, only those that differ from the task's defaults
    assert given.settings()["data"]["mqar"] == {"pairs": 2, "test_pairs": [2], "train_examples": 64,
                                                "test_examples": 32}
    assert "task_options" not in given.settings()["data"]


def test_config_and_data_do_not_import_each_other():
    """The data package reads the config it is given without importing attnlab.config (which imports the data
    package's registry of tasks, as it imports the mixers'), and inference needs nothing of training."""
    import ast

    import attnlab

    root = Path(attnlab.__file__).parent

    def imported(path: Path) -> set[str]:
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names |= {f"{node.module or ''}.{alias.name}".strip(".") for alias in node.names}
            elif isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
        return names

    for path in (root / "data").rglob("*.py"):
        assert not any("config" in name.split(".") for name in imported(path)), path
    assert not any("train" in name.split(".") for name in imported(root / "inference.py"))


def cli_refuses(argv, capsys) -> str:
    """The one line `attnlab` prints for argv, which must exit with code 2."""
    from attnlab.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    err = cli_refuses(["train", str(path)], capsys)
    assert f"{path} is not UTF-8 text (invalid continuation byte at byte 9); save it as UTF-8" in err
    assert [p.name for p in tmp_path.iterdir()] == ["latin1.yaml"]  # nothing written


@pytest.mark.parametrize("text, key, lines", [
    ("model:\n  d_model: 64\ntrain:\n  steps: 3\nmodel:\n  n_layers: 2\n", "model", (1, 5)),
    ("model:\n  mixer: softmax\n  d_model: 64\n  mixer: gla\n", "model.mixer", (2, 4)),
    ("model:\n  mixer_options:\n    gla: {chunk_size: 8, chunk_size: 16}\n", "model.mixer_options.gla.chunk_size",
     (3, 3)),
])
def test_a_key_given_twice_in_a_config_file_is_refused_naming_it(text, key, lines, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    message = f"{path}: '{key}' is given twice (lines {lines[0]} and {lines[1]}); keep one"
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(str(path))
    assert message in cli_refuses(["train", str(path)], capsys)
    assert [p.name for p in tmp_path.iterdir()] == ["twice.yaml"]


def test_the_same_key_in_two_sections_is_not_a_repeat(tmp_path):
    path = tmp_path / "fine.yaml"
    path.write_text("model:\n  n_layers: 2\n  layers: [softmax, gla]\ndata:\n  source: mixed\n  seed: 3\n"
                    "train:\n  seed: 3\n")
    cfg = load_config(str(path))
    assert cfg.model.layer_mixers() == ["softmax", "gla"] and cfg.data.seed == cfg.train.seed == 3


def test_a_mixer_set_against_the_layers_is_refused_naming_both(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    message = ("model.mixer=gdn is not used: model.layers=[softmax, gla, softmax, gla] names the mixer of every "
               "layer; drop model.mixer")
    overrides = ["model.mixer=gdn", "model.layers=[softmax,gla,softmax,gla]"]
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("demo", overrides)
    assert message in cli_refuses(["train", "demo", *overrides], capsys)
    assert list(tmp_path.iterdir()) == []
    # layers on the command line replace the preset's mixer (demo: softmax), as the hybrids' help shows
    assert load_config("demo", ["model.layers=[gla,gla,gla,gla]"]).model.layer_mixers() == ["gla"] * 4
    assert load_config("demo", ["model.mixer=gla", "model.layers=[softmax,gla,softmax,gla]"]).model.mixer == "gla"
    # a saved run's config holds its model.mixer beside layers without it: it loads as a file
    saved = tmp_path / "saved.yaml"
    saved.write_text("model:\n  mixer: interdomain\n  n_layers: 2\n  layers: [softmax, gla]\n")
    assert load_config(str(saved)).model.layer_mixers() == ["softmax", "gla"]


def test_options_typed_for_a_mixer_no_layer_uses_are_refused_by_train(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = cli_refuses(["train", "demo", "model.mixer_options.gla.chunk_size=32"], capsys)
    assert ("model.mixer_options.gla sets options of mixer gla, which no layer uses (the layers are softmax); "
            "remove it, or use gla in model.mixer or model.layers") in err
    err = cli_refuses(["train", "demo", "model.mixer_options={gla: {chunk_size: 32}}"], capsys)
    assert "model.mixer_options.gla sets options of mixer gla, which no layer uses" in err
    assert list(tmp_path.iterdir()) == []
    # a preset's options for the mixers its suites compare it with stay, and so do a suite's settings shared by
    # arms of several mixers (load_config, which the suites call, keeps them)
    assert "coupled-qk" in load_config("coupled-qk-char", ["model.mixer=softmax"]).model.mixer_options
    shared = ["model.mixer=softmax", "model.mixer_options.boltzmann.window=12"]
    assert load_config("brackets", shared).model.mixer_options["boltzmann"]["window"] == 12


def test_every_arm_of_every_suite_loads():
    from attnlab.papers import SUITES, get_suite

    arms = [arm for name, paper in SUITES.items() for tier in paper.tiers
            for experiment in get_suite(name, tier).experiments for arm in experiment.arms]
    assert len(arms) > 100
    for arm in arms:
        load_config(arm.preset, arm.changes)


def test_min_lr_above_lr_is_refused_naming_both(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    message = ("train.min_lr=0.01 is above train.lr=0.001; the schedule decays from lr to min_lr: lower "
               "train.min_lr or raise train.lr")
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("demo", ["train.lr=1e-3", "train.min_lr=1e-2"])
    assert message in cli_refuses(["train", "demo", "train.lr=1e-3", "train.min_lr=1e-2"], capsys)
    assert list(tmp_path.iterdir()) == []
    assert load_config("demo", ["train.lr=1e-3", "train.min_lr=1e-3"]).train.min_lr == 1e-3  # a flat schedule
