import json
import shutil
import sys

import pytest

from attnlab import loggers
from attnlab.config import load_config
from attnlab.errors import ConfigError
from attnlab.train import train
from test_train import tiny_config

STEPS = 6  # evaluations and checkpoints at steps 3 and 6


def run_with(text_file, tmp_path, sinks: str, resume=None):
    cfg = tiny_config(text_file, tmp_path, steps=STEPS, eval_every=3, ckpt_every=3, extra=[f"train.log_to={sinks}"])
    return train(cfg, resume=resume, progress=False, log=lambda *_: None)


def logged(run_dir) -> dict[tuple[str, int], float]:
    """{(scalar, step): value} from metrics.jsonl."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {(k, r["step"]): v for r in records for k, v in r.items() if k in loggers.SCALARS}


def test_tensorboard_gets_the_scalars_of_metrics_jsonl_once_per_step_across_a_resume(text_file, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_with(text_file, tmp_path, "[tensorboard]")
    run_dir = tmp_path / "runs" / "run"
    shutil.rmtree(run_dir / "step-00000006")  # as if it died before its last checkpoint: steps 4-6 run again
    run_with(text_file, tmp_path, "[tensorboard]", resume="auto")

    events = EventAccumulator(str(run_dir / "tensorboard"))  # reads both attempts' event files
    events.Reload()
    scalars = {(tag, e.step): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}
    expected = logged(run_dir)
    assert {name for name, _ in expected} == set(loggers.SCALARS)
    assert len(expected) == STEPS * 4 + 2 * 2  # loss, lr, tokens/s, grad norm each step; two evaluations
    for tag in events.Tags()["scalars"]:  # the second attempt hid the first one's steps 4-6
        steps = [e.step for e in events.Scalars(tag)]
        assert len(steps) == len(set(steps))
    assert scalars.keys() == expected.keys()
    assert all(scalars[key] == pytest.approx(value, rel=1e-6) for key, value in expected.items())  # float32
    assert events.Tags()["tensors"] == ["config/text_summary"] and events.PluginTagToContent("hparams")


BLOCK = 32768  # the .wandb file is a LevelDB-style log: 32 KiB blocks of chunks, each with a 7-byte header


def wandb_records(path):
    """The protobuf records of an offline W&B run's .wandb file."""
    from wandb.proto import wandb_internal_pb2

    raw, pos, chunk = path.read_bytes(), 7, b""  # after the file's header (':W&B', magic, version)
    while pos + 7 <= len(raw):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a chunk header is padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = int.from_bytes(raw[pos + 4:pos + 6], "little"), raw[pos + 6]  # after a crc32
        chunk += raw[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            yield wandb_internal_pb2.Record.FromString(chunk)
            chunk = b""


def test_wandb_offline_run_holds_the_scalars_and_the_config(text_file, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)  # no key: offline, whatever the network
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_with(text_file, tmp_path, "[wandb]")
    run_dir = tmp_path / "runs" / "run"

    (offline,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    wandb.teardown()  # the W&B service process finishes writing the file when it stops
    records = list(wandb_records(offline))
    rows = [r.history for r in records if r.HasField("history")]
    # each item's name is its key or, as this wandb writes it, the parts of a nested key
    scalars = {(item.key or ".".join(item.nested_key), row.step.num): json.loads(item.value_json)
               for row in rows for item in row.item}
    scalars = {key: value for key, value in scalars.items() if not key[0].startswith("_")}  # wandb's own columns
    assert scalars == logged(run_dir)
    (run,) = [r.run for r in records if r.HasField("run")]
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["train"]["log_to"] == ["wandb"] and config["model"]["d_model"] == 32
    assert run.run_id == (run_dir / "wandb" / "run-id").read_text()


def test_an_unknown_sink_is_one_line_with_the_choices():
    with pytest.raises(ConfigError) as err:
        load_config("demo", ["train.log_to=[tensorbord]"])
    assert str(err.value) == ("unknown train.log_to[0] 'tensorbord'; did you mean 'tensorboard'? "
                              "Known: tensorboard, wandb")


@pytest.mark.parametrize("package", loggers.SINKS)
def test_a_missing_package_is_one_line_with_the_pip_fix(package, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)  # makes `import package` fail
    with pytest.raises(ConfigError) as err:
        loggers.open_sinks([package], tmp_path, {}, None)
    assert str(err.value) == f"train.log_to lists {package} but it is not installed; pip install 'attnlab[log]'"
