"""The benchmark harness runs and reports (speed itself is measured by `attnlab bench`, not here)."""

import json

from attnlab.bench import bench_boltzmann, bench_decode, bench_mixers, bench_training_step, contenders, run_bench


def test_quick_preset_writes_every_view_the_goals_json_and_plots(tmp_path):
    lines = []
    results = run_bench("quick", tmp_path, log=lines.append)
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["goals"] == results["goals"] and len(results["goals"]) >= 14
    assert all(g["value"] is not None and g["met"] in (True, False) for g in results["goals"])
    measured = {r["mixer"] for r in results["mixers"]}
    assert measured >= {"softmax", "gla", "interdomain", "boltzmann (banded 4, window 64)"}
    assert results["peak_gflops"] > 0 and all(r["gflops"] > 0 and r["activation_mib"] > 0 for r in results["mixers"])
    for name in ("time_vs_length.png", "decode_vs_context.png"):
        assert (tmp_path / name).stat().st_size > 5000
    assert any("goals (measured in this run)" in line for line in lines)


def test_mixers_that_cannot_run_at_a_length_are_reported_not_fatal():
    lines = []
    rows = bench_mixers(lengths=[20], d_model=32, n_heads=4, repeats=1, log=lines.append)
    measured = {r["mixer"] for r in rows}
    assert "boltzmann" not in measured and {"softmax", "boltzmann (banded 4, window 64)"} <= measured
    refusal = "not run: Boltzmann attention with window=16"
    assert any(line.startswith("boltzmann ") and refusal in line for line in lines)
    assert measured | {"boltzmann"} == {label for label, *_ in contenders()}


def test_decode_latency_is_measured_for_every_mixer_that_runs_at_the_context():
    rows = bench_decode(contexts=[8, 24], d_model=32, steps=1, prefill_chunk=8, log=lambda *_: None)
    at_24 = {r["mixer"] for r in rows if r["context"] == 24}
    assert "boltzmann" not in at_24 and {"softmax", "gla", "s4d"} <= at_24
    assert all(r["decode_ms"] > 0 for r in rows)


def test_training_step_bench_compares_with_softmax(capsys):
    small = ["model.d_model=32", "model.n_layers=1", "train.batch_size=2", "train.seq_len=16"]
    result = bench_training_step("demo", ["coupled-qk"], repeats=1, overrides=small)
    assert set(result) == {"softmax", "coupled-qk"} and result["softmax"]["x_softmax"] == 1.0
    assert "coupled-qk" in capsys.readouterr().out


def test_boltzmann_banded_bench_reports_growth():
    lines = []
    result = bench_boltzmann(exact_lengths=[4], banded_lengths=[16, 32], exact_batch=1, head_dim=8, window=8,
                             band=3, log=lines.append)
    assert set(result) == {"exact T=4", "banded T=16", "banded T=32"} and any("x2 the length" in x for x in lines)


def test_interdomain_bench_measures_every_form_in_its_own_process():
    from attnlab.bench import bench_interdomain

    lines = []
    results = bench_interdomain(lengths=[32], head_dim=8, modes=4, log=lines.append)
    assert set(results) == {("chunk", 32), ("fft", 32), ("decode", 32)}
    assert all(seconds > 0 and rss > 0 for seconds, rss in results.values())
    assert not any("failed" in line for line in lines)
