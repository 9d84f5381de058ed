"""torchrun with two CPU processes (gloo): the same losses as one process with the same global batch,
identical replicas, one checkpoint from rank 0, and a single-process resume from it."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab import checkpoint
from attnlab.config import load_config
from attnlab.errors import ConfigError
from attnlab.evaluate import split_loss
from attnlab.inference import load_run
from attnlab.train import train
from test_train import losses

WORKER = Path(__file__).with_name("distributed_worker.py")


def settings(text_file, tmp_path, name, steps=4, **extra):
    train_settings = dict(steps=steps, batch_size=4, seq_len=16, warmup_steps=1, eval_every=steps, eval_batches=1,
                          log_every=1, ckpt_every=4, keep_last=0) | extra
    return [f"name={name}", f"out_dir={tmp_path / 'runs'}", "data.source=text", f"data.path={text_file}",
            f"data.cache_dir={tmp_path / 'cache'}", "model.d_model=32", "model.n_layers=2", "model.n_heads=4",
            *(f"train.{k}={v}" for k, v in train_settings.items())]


def torchrun(tmp_path, overrides, succeeds=True):
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
               str(WORKER), str(tmp_path), *overrides]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1",
                                                                                       **__import__("os").environ})
    assert (done.returncode == 0) == succeeds, done.stderr[-3000:]


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_two_processes_train_like_one_with_the_same_global_batch(text_file, tmp_path, fsdp):
    single = settings(text_file, tmp_path, "single")
    train(load_config("demo", single), progress=False, log=lambda *_: None)
    torchrun(tmp_path, [*settings(text_file, tmp_path, "pair"), f"train.fsdp={str(fsdp).lower()}"])

    runs = tmp_path / "runs"
    assert_same_records(losses(runs / "pair"), losses(runs / "single"))
    if not fsdp:  # replicas: every rank holds the same weights
        rank0, rank1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
        assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    assert [step for step, _ in checkpoint.list_checkpoints(runs / "pair")] == [4]
    # the validation loss the two processes logged is the one a single process measures on the same weights
    pair = load_run(runs / "pair")
    [(_, _, logged)] = [r for r in losses(runs / "pair") if r[2] is not None]
    assert logged == pytest.approx(split_loss(pair.model, pair.corpus(), "val", 1, 4, 16, None), rel=1e-6)

    # resume the two-process run in one process for two more steps: as if it had run in one process
    for name in ("single", "pair"):
        more = load_config("demo", settings(text_file, tmp_path, name, steps=6, ckpt_every=6))
        train(more, resume="auto", progress=False, log=lambda *_: None)
    assert_same_records(*[[r for r in losses(runs / name) if r[0] > 4] for name in ("pair", "single")])


GDN = ["model.mixer=gdn", "model.mixer_options.gdn.chunk_size=4"]


def test_two_processes_splitting_every_sequence_train_like_one_and_a_run_that_dies_resumes_bitwise(text_file,
                                                                                                 tmp_path):
    """train.context_parallel=2 (DDP): both processes hold the batch's rows, each one half of every sequence (15
    tokens padded to 16 and cut in two), and train GDN (its state scanned across them, its short convolution
    reading across the cut) as one process does, their replicas equal; stopped dead after the checkpoint of step 3
    and resumed, the run logs the losses of the same run never stopped, to the bit."""
    train(load_config("demo", [*settings(text_file, tmp_path, "single", steps=6, ckpt_every=3, seq_len=15), *GDN]),
          progress=False, log=lambda *_: None)
    for name, flags in (("straight", []), ("died", ["--die-after=3"])):
        torchrun(tmp_path, [*settings(text_file, tmp_path, name, steps=6, ckpt_every=3, seq_len=15), *GDN,
                            "train.context_parallel=2", *flags], succeeds=not flags)
    rank0, rank1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")  # the straight run's
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    torchrun(tmp_path, [*settings(text_file, tmp_path, "died", steps=6, ckpt_every=3, seq_len=15), *GDN,
                        "train.context_parallel=2", "--resume"])
    runs = tmp_path / "runs"
    assert_same_records(losses(runs / "straight"), losses(runs / "single"))
    assert losses(runs / "died") == losses(runs / "straight") and len(losses(runs / "straight")) == 7


def test_a_split_and_sharded_run_trains_and_resumes_as_one_process(text_file, tmp_path):
    """train.context_parallel=2 with train.fsdp=true: the same losses as one process, resumed under the split and
    in one process as the one process resumes."""
    train(load_config("demo", [*settings(text_file, tmp_path, "single", seq_len=15), *GDN]), progress=False,
          log=lambda *_: None)
    split = ["train.context_parallel=2", "train.fsdp=true"]
    torchrun(tmp_path, [*settings(text_file, tmp_path, "split", seq_len=15), *GDN, *split])
    runs = tmp_path / "runs"
    assert_same_records(losses(runs / "split"), losses(runs / "single"))
    train(load_config("demo", [*settings(text_file, tmp_path, "single", steps=6, ckpt_every=6, seq_len=15), *GDN]),
          resume="auto", progress=False, log=lambda *_: None)
    torchrun(tmp_path, [*settings(text_file, tmp_path, "split", steps=6, ckpt_every=6, seq_len=15), *GDN, *split,
                        "--resume"])
    assert_same_records(*[[r for r in losses(runs / name) if r[0] > 4] for name in ("split", "single")])
    for name in ("single", "split"):  # and a checkpoint of the split run continues in one process
        more = load_config("demo", [*settings(text_file, tmp_path, name, steps=8, ckpt_every=8, seq_len=15), *GDN])
        train(more, resume="auto", progress=False, log=lambda *_: None)
    assert_same_records(*[[r for r in losses(runs / name) if r[0] > 6] for name in ("split", "single")])


def test_packed_documents_split_across_two_processes_train_like_one(tmp_path):
    """data.pack=true with train.context_parallel=2: each packed row of documents (31 tokens a row, padded to 32)
    split in two, a document running across the cut, trains GDN as one process does."""
    from test_packed_training import documents_folder

    def run(name, *extra):
        return [f"name={name}", f"out_dir={tmp_path / 'runs'}", "data.source=text",
                f"data.path={documents_folder(tmp_path)}", "data.tokenizer=byte", "data.pack=true",
                "data.val_fraction=0.4", f"data.cache_dir={tmp_path / 'cache'}", "model.d_model=32",
                "model.n_layers=2", "model.n_heads=4", "model.mixer=gdn", "model.mixer_options.gdn.chunk_size=4",
                "train.steps=4", "train.batch_size=4", "train.seq_len=31", "train.warmup_steps=1",
                "train.eval_every=4", "train.eval_batches=0", "train.ckpt_every=4", "train.log_every=1", *extra]

    train(load_config("demo", run("single")), progress=False, log=lambda *_: None)
    torchrun(tmp_path, run("split", "train.context_parallel=2"))
    assert_same_records(losses(tmp_path / "runs" / "split"), losses(tmp_path / "runs" / "single"))


def test_context_parallelism_refuses_what_it_cannot_split_in_one_line():
    from attnlab.distributed import Ranks
    from attnlab.model import Decoder
    from attnlab.train import _check_ranks, _check_splits_sequences

    cfg = load_config("demo", ["train.context_parallel=2", "model.vocab_size=16"])
    flex = ["model.mixer=boltzmann", "model.mixer_options.boltzmann.mode=h-only",
            "model.mixer_options.boltzmann.backend=flex"]
    changed = load_config("demo", ["train.context_parallel=2", "model.vocab_size=16", *flex])
    with pytest.raises(ConfigError, match="boltzmann cannot split a sequence across ranks"):
        _check_splits_sequences(Decoder(changed.model), changed)
    _check_splits_sequences(Decoder(cfg.model), cfg)  # softmax attention splits
    with pytest.raises(ConfigError, match="runs eager blocks only"):
        _check_ranks(load_config("demo", ["train.context_parallel=2", "train.compile=true"]).train, Ranks(0, 2))
    with pytest.raises(ConfigError, match="must be divisible by the 2 data-parallel ranks"):  # 4 = 2 x 2 ranks
        _check_ranks(load_config("demo", ["train.context_parallel=2", "train.batch_size=3"]).train, Ranks(0, 4))


def assert_same_records(records, expected):
    """(step, loss, val_loss) records equal up to the order of the reductions (None where not logged)."""
    assert [r[0] for r in records] == [r[0] for r in expected] and len(records) > 0
    for record, reference in zip(records, expected, strict=True):
        for value, want in zip(record[1:], reference[1:], strict=True):
            assert value == want if want is None else value == pytest.approx(want, rel=1e-5)


def test_the_loss_is_reduced_on_its_own_device(monkeypatch):
    """NCCL reduces GPU tensors only: the all-reduce must receive the loss where it lives, not a CPU copy.
    A `meta` tensor stands in for a GPU one."""
    from attnlab import distributed

    seen = []
    monkeypatch.setattr(distributed.dist, "all_reduce", lambda tensor: seen.append(tensor.device))
    loss = torch.ones((), device="meta")
    reduced = distributed.mean(loss, distributed.Ranks(rank=0, world=2, device=loss.device))
    assert seen == [torch.device("meta")] and reduced.device == torch.device("meta")


def test_two_processes_train_packed_documents_like_one(tmp_path):
    """data.pack=true: each rank's rows of documents as one packed row, their boundaries cut with them."""
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(12):
        (folder / f"{i:02d}.txt").write_text(f"Doc {i}: " + " ".join(f"w{(i * 5 + j) % 11}" for j in range(3 + 4 * i)))
    packed = ["data.pack=true", "data.tokenizer=byte", "data.val_fraction=0.3", "train.eval_batches=0"]
    train(load_config("demo", [*settings(folder, tmp_path, "single"), *packed]), progress=False, log=lambda *_: None)
    torchrun(tmp_path, [*settings(folder, tmp_path, "pair"), *packed])
    runs = tmp_path / "runs"
    assert_same_records(losses(runs / "pair"), losses(runs / "single"))
