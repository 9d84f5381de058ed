"""Runs that cannot clash or fail late: a run folder locked while a training writes it, files that follow the
umask, writability checked and memory estimated before the first step, and a refusal said once under torchrun."""

import logging
import os
import stat

import pytest
import torch

from attnlab import checkpoint, distributed, step_cost
from attnlab.config import ModelConfig, RunConfig, TrainConfig, load_config
from attnlab.errors import ConfigError, UserError
from attnlab.model import Decoder
from attnlab.train import train
from test_train import losses, tiny_config


def quiet_train(cfg, **kwargs):
    return train(cfg, progress=False, log=lambda *_: None, **kwargs)


def no_model_built(monkeypatch):
    """Make building the model fail the test: what is checked must be checked before."""
    monkeypatch.setattr("attnlab.train.Decoder", lambda *args: pytest.fail("the model was built"))


# ---------------------------------------------------------------------------------------------------
# the run lock


def test_a_second_training_into_a_running_run_is_refused_and_leaves_the_first_intact(text_file, tmp_path,
                                                                                      monkeypatch):
    cfg = tiny_config(text_file, tmp_path, steps=4, ckpt_every=2)
    run_dir = tmp_path / "runs" / "run"
    save, refusals = checkpoint.save_checkpoint, []

    def save_then_start_a_twin(folder, step, *args, **kwargs):
        saved = save(folder, step, *args, **kwargs)
        if step == 2:  # the first training is under way: a second one into the same run starts now
            with pytest.raises(UserError) as refused:
                quiet_train(cfg, resume="auto")
            refusals.append(str(refused.value))
        return saved

    monkeypatch.setattr(checkpoint, "save_checkpoint", save_then_start_a_twin)
    quiet_train(cfg)
    assert refusals == [f"{run_dir} is in use by another training (pid {os.getpid()}); choose another name= or "
                        "wait for it to finish"]
    assert [step for step, loss, _ in losses(run_dir) if loss is not None] == [1, 2, 3, 4]  # one run's, unmixed
    assert [step for step, _ in checkpoint.list_checkpoints(run_dir)] == [2, 4]


def test_the_lock_is_released_when_training_ends_or_fails(text_file, tmp_path):
    cfg = tiny_config(text_file, tmp_path, steps=2, ckpt_every=2)
    run_dir = tmp_path / "runs" / "run"
    quiet_train(cfg)
    with pytest.raises(UserError, match="already holds checkpoints"):  # refused, and the lock released after
        quiet_train(cfg)
    with checkpoint.run_lock(run_dir):  # taken again, so free
        assert (run_dir / checkpoint.LOCK).read_text() == str(os.getpid())


# ---------------------------------------------------------------------------------------------------
# permissions and writability


@pytest.fixture
def umask():
    """Set the process's umask for the test, and put the old one back."""
    previous = os.umask(0o022)
    yield os.umask
    os.umask(previous)


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_checkpoints_under_umask_022_are_readable_by_group_and_others(text_file, tmp_path, umask):
    umask(0o022)
    quiet_train(tiny_config(text_file, tmp_path, steps=2, ckpt_every=2))
    folder = tmp_path / "runs" / "run" / checkpoint.step_dir_name(2)
    assert mode(folder) == 0o755
    assert {path.name: mode(path) for path in folder.iterdir()} == dict.fromkeys(
        ["model.safetensors", "optimizer.pt", "train_state.pt", "config.yaml", "tokenizer.json", "manifest.json"],
        0o644)


def test_a_token_cache_under_umask_022_is_readable_by_group_and_others(text_file, tmp_path, umask):
    umask(0o022)
    quiet_train(tiny_config(text_file, tmp_path, steps=1))  # its cache is tmp_path/cache
    written = list((tmp_path / "cache").rglob("*"))
    assert {mode(p) for p in written if p.is_dir()} == {0o755}
    assert {mode(p) for p in written if p.is_file()} == {0o644} and any(p.name == "tokens.bin" for p in written)


def test_an_export_under_umask_022_is_readable_by_group_and_others(text_file, tmp_path, umask):
    pytest.importorskip("transformers")
    from attnlab.hf.export import export

    umask(0o022)
    quiet_train(tiny_config(text_file, tmp_path, steps=2, ckpt_every=2))
    folder = export(tmp_path / "runs" / "run", tmp_path / "exported")
    assert mode(folder) == 0o755 and {mode(path) for path in folder.iterdir()} == {0o644}
    assert (folder / "model.safetensors").is_file()


def test_files_follow_a_stricter_umask_too(tmp_path, umask):
    (tmp_path / "sub").mkdir(mode=0o700)
    (tmp_path / "sub" / "weights").write_bytes(b"")
    (tmp_path / "sub" / "weights").chmod(0o600)
    umask(0o027)
    checkpoint.follow_umask(tmp_path / "sub")
    assert mode(tmp_path / "sub") == 0o750 and mode(tmp_path / "sub" / "weights") == 0o640


def test_an_out_dir_that_is_a_file_is_refused_before_the_model_is_built(text_file, tmp_path, monkeypatch):
    no_model_built(monkeypatch)
    blocker = tmp_path / "runs"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError) as err:
        quiet_train(tiny_config(text_file, tmp_path))
    assert str(err.value) == f"out_dir={blocker}: {blocker} is a file, not a folder; choose another out_dir="


def test_a_run_name_that_is_a_file_is_refused_before_the_model_is_built(text_file, tmp_path, monkeypatch):
    no_model_built(monkeypatch)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "run").write_text("")
    with pytest.raises(ConfigError, match=r"runs/run is a file, not a run folder; choose another name= or out_dir="):
        quiet_train(tiny_config(text_file, tmp_path))


def test_a_token_cache_that_cannot_be_written_is_refused_naming_data_cache_dir(text_file, tmp_path, monkeypatch):
    no_model_built(monkeypatch)
    cache = tmp_path / "cache-file"
    cache.write_text("")  # a file where the cache's folder would go: unwritable for root too
    with pytest.raises(ConfigError) as err:
        quiet_train(tiny_config(text_file, tmp_path, extra=[f"data.cache_dir={cache}"]))
    assert str(err.value) == (f"data.cache_dir={cache}: the token cache cannot be written there (Not a directory); "
                              "give a writable data.cache_dir= (or set $ATTNLAB_CACHE)")


def deny_writes(monkeypatch, folder):
    """os.access answering as a read-only mount of folder would, which root cannot write either."""
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, how: access(path, how) and not (path == folder and how & os.W_OK))


def test_an_unwritable_out_dir_is_refused_before_the_model_is_built(text_file, tmp_path, monkeypatch):
    (tmp_path / "runs").mkdir()
    deny_writes(monkeypatch, tmp_path / "runs")
    no_model_built(monkeypatch)
    with pytest.raises(ConfigError, match=r"out_dir=.*runs: .*runs cannot be written \(permission denied"):
        quiet_train(tiny_config(text_file, tmp_path))


def test_resume_in_a_run_folder_that_cannot_be_written_is_refused_before_the_model_is_built(text_file, tmp_path,
                                                                                            monkeypatch):
    cfg = tiny_config(text_file, tmp_path, steps=2, ckpt_every=2)
    quiet_train(cfg)
    run_dir = tmp_path / "runs" / "run"
    deny_writes(monkeypatch, run_dir)
    no_model_built(monkeypatch)
    with pytest.raises(ConfigError) as err:
        quiet_train(cfg, resume="auto")
    assert str(err.value) == (f"{run_dir} cannot be written (permission denied or a read-only file system), so no "
                              "checkpoint could be saved; make it writable, or copy the run to a writable out_dir= "
                              "and resume it there")


# ---------------------------------------------------------------------------------------------------
# memory


def test_live_bytes_counts_each_storage_once_while_it_lives():
    weight = torch.zeros(300)
    with step_cost.LiveBytes() as live:
        weight.t().mul_(2)  # a view and an in-place update of a tensor made before: nothing allocated
        a = torch.empty(1000)  # 4000 bytes
        a.view(10, 100).add_(1)  # a view and an in-place op: the same storage
        b = torch.empty(500)  # 2000 more: the peak
        del b
        c = torch.empty(250)  # 1000, after b's 2000 were freed
    assert (live.peak, live.live) == (6000, 5000) and a.numel() + c.numel() == 1250


def test_the_step_memory_estimate_matches_the_memory_of_a_training_step():
    cfg = RunConfig(model=ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4), train=TrainConfig(seq_len=64))
    model = Decoder(cfg.model)
    optimizer = torch.optim.AdamW(model.parameters())
    tokens = torch.randint(50, (6, 64))

    def step():
        model.loss(tokens, tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    with step_cost.LiveBytes() as first:  # AdamW's moments are made here, and live on
        step()
    with step_cost.LiveBytes() as steady:
        step()
    moments = 2 * sum(p.numel() * 4 for p in model.parameters())
    assert first.live == moments
    assert step_cost.step_memory(model, cfg, torch.device("cpu"), 6) == pytest.approx(steady.peak + moments, rel=0.05)


def test_a_step_too_large_for_the_memory_is_refused_before_training(text_file, tmp_path, monkeypatch):
    monkeypatch.setattr("attnlab.train._loss", lambda *args: pytest.fail("a training step ran"))
    monkeypatch.setattr(step_cost, "available_memory", lambda device: 1 << 17)  # 128 KiB
    with pytest.raises(ConfigError, match=r"^a step needs about [\d.]+ MiB; this machine has 0.125 MiB available: "
                                          r"lower train.batch_size or train.seq_len, or raise train.grad_accum$"):
        quiet_train(tiny_config(text_file, tmp_path))
    assert not (tmp_path / "runs" / "run").exists()


@pytest.mark.parametrize("sequences, fix", [
    (8, "lower train.batch_size or train.seq_len, or raise train.grad_accum"),
    (1, "lower train.seq_len or the model's size (model.d_model, model.n_layers)")])
def test_the_memory_refusal_gives_the_numbers_and_the_fix(monkeypatch, sequences, fix):
    monkeypatch.setattr(step_cost, "step_memory", lambda *args: 31 * step_cost.GiB)
    monkeypatch.setattr(step_cost, "available_memory", lambda device: 22 * step_cost.GiB)
    with pytest.raises(ConfigError) as err:
        step_cost.check_memory(None, None, torch.device("cpu"), sequences)
    assert str(err.value) == f"a step needs about 31 GiB; this machine has 22 GiB available: {fix}"
    monkeypatch.setattr(step_cost, "available_memory", lambda device: None)  # nothing says: no check
    step_cost.check_memory(None, None, torch.device("cpu"), sequences)


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="reads /proc/meminfo (Linux)")
def test_the_available_ram_is_read_from_proc_meminfo(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "psutil", None)  # as without psutil
    total = next(int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal:"))
    assert 0 < step_cost.available_memory(torch.device("cpu")) <= total


# ---------------------------------------------------------------------------------------------------
# torchrun: one voice


def gathered(found_by_rank, contributed):
    """A stand-in for all_gather_object that gives back what each rank found and keeps what this one gave."""
    def all_gather_object(found, mine):
        contributed.append(mine)
        found[:] = found_by_rank
    return all_gather_object


def test_under_torchrun_rank_0_raises_the_refusal_that_another_rank_found(monkeypatch):
    given = []
    monkeypatch.setattr(distributed.dist, "all_gather_object", gathered([None, "train.seq_len is too long"], given))
    with pytest.raises(UserError) as err:
        with distributed.refusals_once(distributed.Ranks(rank=0, world=2)):
            pass  # rank 0 itself found nothing
    assert str(err.value) == "train.seq_len is too long" and given == [None]


def test_under_torchrun_the_other_ranks_leave_quietly_with_status_2(monkeypatch, capsys):
    given = []
    monkeypatch.setattr(distributed.dist, "all_gather_object", gathered(["too many ranks", "too many ranks"], given))
    with pytest.raises(SystemExit) as leaving:
        with distributed.refusals_once(distributed.Ranks(rank=1, world=2)):
            raise ConfigError("too many ranks")
    assert leaving.value.code == 2 and given == ["too many ranks"] and capsys.readouterr() == ("", "")


def test_under_torchrun_the_set_up_goes_on_when_no_rank_refuses(monkeypatch):
    monkeypatch.setattr(distributed.dist, "all_gather_object", gathered([None, None], []))
    with distributed.refusals_once(distributed.Ranks(rank=1, world=2)):
        pass


@pytest.mark.parametrize("rank, notes", [("0", 1), ("1", 0)])
def test_a_config_note_is_given_by_rank_0_only(monkeypatch, caplog, rank, notes):
    monkeypatch.setenv("RANK", rank)
    with caplog.at_level(logging.WARNING, logger="attnlab.config"):
        load_config("demo", ["train.steps=10"])  # the preset's warmup of 100 steps is capped
    assert sum("train.warmup_steps=100 is more than half" in r.message for r in caplog.records) == notes
