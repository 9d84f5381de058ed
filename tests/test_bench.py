"""The benchmark harness runs and reports ratios (speed itself is measured by `attnlab bench`, not here)."""

from attnlab.bench import bench_mixers, bench_ops, bench_training_step
from attnlab.mixers import list_mixers


def test_mixer_bench_covers_every_mixer(capsys):
    rows = bench_mixers(lengths=[8], batch=1, d_model=32, n_heads=4, repeats=1)
    assert sorted(r["mixer"] for r in rows) == list_mixers()
    assert next(r for r in rows if r["mixer"] == "softmax")["fwd_bwd_x_softmax"] == 1.0
    assert all(r["fwd_bwd_ms"] > 0 and r["decode_ms"] > 0 for r in rows)


def test_training_step_bench_compares_with_softmax(capsys):
    small = ["model.d_model=32", "model.n_layers=1", "train.batch_size=2", "train.seq_len=16"]
    result = bench_training_step("demo", ["coupled-qk"], repeats=1, overrides=small)
    assert set(result) == {"softmax", "coupled-qk"} and result["softmax"]["x_softmax"] == 1.0
    assert "coupled-qk" in capsys.readouterr().out


def test_ops_bench_reports_the_form_ratios(capsys):
    result = bench_ops(seq_len=32, batch=1, heads=2, head_dim=8, d_model=16, repeats=1)
    assert {"gla reference / chunk", "ccq-gla / gla mixer", "ccq-gdn / gdn mixer"} <= set(result["ratios"])
    assert all(r > 0 for r in result["ratios"].values())


def test_mixers_that_cannot_run_at_a_length_are_reported_not_fatal(capsys):
    rows = bench_mixers(lengths=[20], batch=1, d_model=32, n_heads=4, repeats=1)
    assert "boltzmann" not in {r["mixer"] for r in rows} and "softmax" in {r["mixer"] for r in rows}
    assert "boltzmann                  20  not run with its defaults" in capsys.readouterr().out


def test_interdomain_bench_measures_every_form_in_its_own_process(capsys):
    from attnlab.bench import bench_interdomain

    results = bench_interdomain(lengths=[32], head_dim=8, modes=4)
    assert set(results) == {("chunk", 32), ("fft", 32), ("decode", 32)}
    assert all(seconds > 0 and rss > 0 for seconds, rss in results.values())
    assert "failed" not in capsys.readouterr().out
