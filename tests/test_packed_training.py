"""Training and evaluation on packed documents (data.pack=true): each document read from its own start, no
target predicted across a boundary, and the scores equal a hand computation over the documents one by one."""


import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from attnlab import train as train_module
from attnlab.config import load_config
from attnlab.data import load_corpus
from attnlab.data.corpus import IGNORE, packed_rows
from attnlab.evaluate import scored_positions, split_loss
from attnlab.model import Decoder
from attnlab.train import train
from helpers import Crash, crash_after_checkpoint

SEQ_LEN = 32


def documents_folder(tmp_path):
    """Twelve short documents (each shorter than a row) and three longer than a row."""
    folder = tmp_path / "docs"
    folder.mkdir(exist_ok=True)
    for i in range(15):
        words = " ".join(f"w{(i * 7 + j) % 13}" for j in range(4 + 3 * i))
        (folder / f"{i:02d}.txt").write_text(f"Doc {i}: {words}.")
    return folder


def config(tmp_path, *extra):
    return load_config("demo", [
        f"out_dir={tmp_path / 'runs'}", "data.source=text", f"data.path={documents_folder(tmp_path)}",
        "data.tokenizer=byte", "data.pack=true", "data.val_fraction=0.4", f"data.cache_dir={tmp_path / 'cache'}",
        "model.d_model=32", "model.n_layers=2", "model.n_heads=4", "model.layers=[softmax,gla]",
        "train.steps=4", "train.batch_size=4", f"train.seq_len={SEQ_LEN}", "train.warmup_steps=1",
        "train.eval_every=2", "train.eval_batches=0", "train.ckpt_every=4", "train.log_every=1", *extra])


def test_the_packed_whole_split_loss_is_the_mean_over_each_document_read_alone(tmp_path):
    cfg = config(tmp_path)
    corpus = load_corpus(cfg.data)
    torch.manual_seed(0)
    model = Decoder(cfg.model.fitted(corpus.vocab_size)).double().eval()
    data, bounds = torch.from_numpy(corpus.split("val").astype("int64")), corpus.document_bounds("val")
    total, count = 0.0, 0
    with torch.no_grad():
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            document = data[start:end]
            for lo in range(0, len(document) - 1, SEQ_LEN - 1):  # pieces of a row, each from a fresh state
                piece = document[lo : lo + SEQ_LEN]
                logits, _ = model(piece[None, :-1])
                total += F.cross_entropy(logits[0], piece[1:], reduction="sum").item()
                count += len(piece) - 1
    assert scored_positions(corpus, "val", packed=True) == count == len(data) - (len(bounds) - 1)
    for chunk in (1, 3):  # however many rows a forward takes
        loss = split_loss(model, corpus, "val", 0, 4, SEQ_LEN, None, chunk=chunk, packed=True)
        assert abs(loss - total / count) < 1e-9
    assert abs(split_loss(model, corpus, "val", 0, 4, SEQ_LEN, None) - total / count) > 1e-3  # windows differ


def test_packed_training_passes_the_boundaries_and_never_predicts_across_one(tmp_path, monkeypatch):
    seen = []
    loss = train_module._loss

    def recording_loss(trained, tokens, targets, cu_seqlens=None, context=None):
        seen.append((tokens, targets, cu_seqlens))
        return loss(trained, tokens, targets, cu_seqlens, context)

    monkeypatch.setattr(train_module, "_loss", recording_loss)
    summary = train(config(tmp_path), progress=False, log=lambda *_: None)
    assert len(seen) == 4 and summary["val_loss"] < 6
    for tokens, targets, cu_seqlens in seen:
        assert tokens.shape == targets.shape == (1, 4 * SEQ_LEN)
        ends = cu_seqlens[1:] - 1
        assert bool((targets[0, ends] == IGNORE).all())  # the last token of each sequence predicts nothing
        assert set(range(0, 4 * SEQ_LEN, SEQ_LEN)) <= set(cu_seqlens.tolist())  # every row starts a sequence


def test_rows_of_a_packed_batch_cut_with_their_boundaries():
    x = torch.arange(12).view(3, 4)
    y = x + 100
    cu_seqlens = torch.tensor([0, 2, 4, 8, 9, 12])
    rows_x, rows_y, inside = packed_rows(x, y, cu_seqlens, slice(1, 3))
    assert rows_x.tolist() == [[4, 5, 6, 7, 8, 9, 10, 11]] and rows_y.tolist() == [[104, 105, 106, 107, 108, 109,
                                                                                      110, 111]]
    assert inside.tolist() == [0, 4, 5, 8]


def test_a_packed_run_resumes_bitwise_and_says_it_never_predicts_across_a_boundary(tmp_path, monkeypatch):
    messages = []
    train(config(tmp_path, "name=straight"), progress=False, log=messages.append)
    assert any("packed documents: " in m and "no target is predicted across a document boundary" in m
               for m in messages)
    recover = crash_after_checkpoint(monkeypatch, 2)
    with pytest.raises(Crash):
        train(config(tmp_path, "name=stopped", "train.ckpt_every=2"), progress=False, log=lambda *_: None)
    recover()
    train(config(tmp_path, "name=stopped", "train.ckpt_every=2"), resume="auto", progress=False,
          log=lambda *_: None)
    runs = tmp_path / "runs"
    a, b = (load_file(runs / name / "step-00000004" / "model.safetensors") for name in ("straight", "stopped"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_boundary_that_is_easy_to_predict_across_is_never_a_target(tmp_path, monkeypatch):
    """Two documents, a run of 'a' and a run of 'b': windows of the stream hold the first document's end and the
    second's start in about every other batch; packed, no batch ever asks what follows the last 'a'."""
    folder = tmp_path / "two"
    folder.mkdir()
    (folder / "1.txt").write_text("a" * 200)
    (folder / "2.txt").write_text("b" * 200)
    overrides = [
        f"out_dir={tmp_path / 'runs'}", "data.source=text", f"data.path={folder}", "data.tokenizer=byte",
        "data.val_fraction=0.1", f"data.cache_dir={tmp_path / 'cache'}", "model.d_model=32",
        "model.n_layers=1", "model.n_heads=4", "train.steps=20", "train.batch_size=8",
        f"train.seq_len={SEQ_LEN}", "train.warmup_steps=1", "train.eval_every=20", "train.eval_batches=0"]
    crossings = []
    loss = train_module._loss

    def recording_loss(trained, tokens, targets, cu_seqlens=None, context=None):
        # the first document is all 'a': only across its end can an 'a' be followed by anything else
        crossings.append(bool(((tokens == ord("a")) & (targets != ord("a")) & (targets != IGNORE)).any()))
        return loss(trained, tokens, targets, cu_seqlens, context)

    monkeypatch.setattr(train_module, "_loss", recording_loss)
    for pack in ("false", "true"):
        crossings.clear()
        train(load_config("demo", [*overrides, f"data.pack={pack}", f"name=pack-{pack}"]),
              progress=False, log=lambda *_: None)
        assert len(crossings) == 20 and any(crossings) == (pack == "false")



def test_accumulated_packed_micro_batches_give_the_gradient_of_one_batch_of_the_same_rows(tmp_path, monkeypatch):
    """Two micro-batches of packed rows that score different numbers of targets: each one's summed loss is divided
    by the whole batch's count, so that the step is the mean over every target, as one batch of the rows gives it
    (a mean of the two micro-batches' means would weigh the targets of the smaller one more)."""
    import dataclasses
    from contextlib import nullcontext
    from types import SimpleNamespace

    from attnlab.distributed import Ranks

    cfg = config(tmp_path)
    corpus = load_corpus(cfg.data)
    x, y, cu_seqlens = corpus.packed_batch("train", 4, SEQ_LEN, torch.Generator().manual_seed(0))
    halves = [packed_rows(x, y, cu_seqlens, slice(0, 2)), packed_rows(x, y, cu_seqlens, slice(2, 4))]
    counts = [train_module.scored_targets(targets) for _, targets, _ in halves]
    assert counts[0] != counts[1] and sum(counts) == train_module.scored_targets(y)
    model = Decoder(cfg.model.fitted(corpus.vocab_size)).double()

    def step(grad_accum, micro_batches):
        run = SimpleNamespace(cfg=dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, grad_accum=grad_accum)),
                              ranks=Ranks(), trained=model, device=torch.device("cpu"), autocast=nullcontext,
                              context=None)
        drawn = iter(micro_batches)
        monkeypatch.setattr(train_module, "_micro_batch", lambda _: next(drawn))
        model.zero_grad(set_to_none=True)
        loss = train_module._accumulate_gradients(run).item()
        return loss, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    whole_loss, whole = step(1, [(*packed_rows(x, y, cu_seqlens, slice(0, 4)), sum(counts))])
    # each micro-batch comes with the count of targets its rows score, as _micro_batch gives it
    split_loss_, split = step(2, [(*half, count) for half, count in zip(halves, counts, strict=True)])
    assert split_loss_ == pytest.approx(whole_loss, rel=1e-6) and whole.keys() == split.keys()  # summed in fp32
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], rtol=1e-10, atol=1e-12)
