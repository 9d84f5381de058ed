"""The benchmark harness runs and reports (speed itself is measured by `attnlab bench`, not here)."""

import json

import pytest
import torch

import attnlab.papers  # noqa: F401  (the papers: their bench cases and variants)
from attnlab.bench import instruments, mixers
from attnlab.bench.mixers import bench_decode, bench_mixers, contenders
from attnlab.bench.models import bench_training_step
from attnlab.bench.packed import bench_packed, document_starts
from attnlab.bench.registry import BENCH_CASES
from attnlab.bench.whole import goals, line_styles, run_bench


def test_quick_preset_writes_every_view_the_goals_json_and_plots(tmp_path):
    lines = []
    results = run_bench("quick", tmp_path, log=lines.append)
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["goals"] == results["goals"] and len(results["goals"]) >= 14
    # timed once, the quick preset's goals are labelled, never judged met or not met at random
    assert all(g["value"] is not None and g["met"] is None for g in results["goals"])
    goal_lines = lines[lines.index("\ngoals (measured in this run):") + 1 : -1]
    assert len(goal_lines) == len(results["goals"]) and all(line.endswith("not judged (quick)") for line in goal_lines)
    measured = {r["mixer"] for r in results["mixers"]}
    assert measured >= {"softmax", "gla", "interdomain", "boltzmann (banded 4, window 64)"}
    # the papers' cases that size themselves for the quick preset, each with its goals among the run's
    assert set(results["cases"]) == {name for name, case in BENCH_CASES.items() if "quick" in case.settings} >= {
        "boltzmann", "ccq", "coupled-qk"}
    case_goals = [row[0] for name, case in BENCH_CASES.items() if name in results["cases"]
                  for row in case.goals(results["cases"][name])]
    assert len(case_goals) >= 4 and set(case_goals) <= {g["goal"] for g in results["goals"]}
    assert results["peak"]["gflops"] > 0 and all(r["gflops"] > 0 and r["activation_mib"] > 0 for r in results["mixers"])
    assert all(r["peak_fraction"] is None or 0 < r["peak_fraction"] <= 1 for r in results["mixers"])
    floor = results["decode_floor"]
    assert floor["attention_ms"] > 0 and floor["attention_x_floor"] > 0
    assert any("the one-query attention alone" in line for line in lines)
    for name in ("time_vs_length.png", "decode_vs_context.png"):
        assert (tmp_path / name).stat().st_size > 5000


def test_a_judged_run_says_met_or_not_met():
    results = {"ops": {"ratios": {"gla reference / chunk": 12.0}}, "x_transformers": None,
               "config": {"decode": {"contexts": [8, 16]}}, "decode": [],
               "cases": {"ccq": {"ratios": {"ccq-gla / gla": 1.5}}, "coupled-qk": {"coupled-qk": {"x_softmax": 1.0}}}}
    verdicts = {g["goal"][:20]: g["verdict"] for g in goals(results)}
    assert verdicts["GLA chunkwise vs loo"] == "met" and verdicts["CCQ-GLA / GLA mixer "] == "NOT MET"
    assert verdicts["coupled-qk / softmax"] == "met"
    assert verdicts["our softmax decoder "] == "not measured"
    assert {g["verdict"] for g in goals(results, judged=False)} == {"not judged (quick)"}


def test_the_peak_is_the_best_over_every_size_and_dtype(monkeypatch):
    speeds = {(256, torch.float32): 80.0, (512, torch.float32): 95.0, (256, torch.bfloat16): 400.0,
              (512, torch.bfloat16): 310.0}
    monkeypatch.setattr(instruments, "matmul_gflops", lambda size, dtype: speeds[size, dtype])
    peak = instruments.matmul_peak([torch.float32, torch.bfloat16], sizes=[256, 512])
    assert (peak["gflops"], peak["dtype"], peak["size"]) == (400.0, "bfloat16", 256) and len(peak["measured"]) == 4
    assert instruments.matmul_peak([torch.float32], sizes=[256, 512])["gflops"] == 95.0


def test_the_measured_peak_is_a_real_product_speed():
    peak = instruments.matmul_peak(sizes=[32, 64])
    assert peak["gflops"] > 0 and peak["dtype"] == "float32" and set(peak["measured"]) == {"float32 32", "float32 64"}


@pytest.mark.parametrize("gflops", [0.0, 10.0, 99.9, 100.0, 100.1, 500.0])
def test_a_share_of_the_peak_is_never_above_one(gflops):
    share = instruments.peak_share(gflops, 100.0)
    assert (share is None) == (gflops > 100.0) and (share is None or 0 <= share <= 1)


def test_a_figure_above_the_peak_is_flagged_not_shown_as_a_share(monkeypatch):
    lines = []
    rows = bench_mixers(lengths=[16], d_model=16, n_heads=2, repeats=1, peak_gflops=1e-6, log=lines.append)
    assert all(r["above_peak"] and r["peak_fraction"] is None for r in rows)
    assert all("ABOVE PEAK" in line and "%" not in line for line in lines[2:])


@pytest.mark.parametrize("T", [1, 7, 64])
def test_causal_attention_counts_the_pairs_up_to_the_diagonal(T):
    q, k, v = (torch.randn(2, 3, T, 8, requires_grad=True) for _ in range(3))

    def flops(causal, backward):
        def run():
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            if backward:
                y.sum().backward()
        return instruments.count_flops(run)

    for backward in (False, True):
        full = flops(False, backward)
        assert full > 0 and flops(True, backward) == full * (T + 1) // (2 * T)
    assert instruments.causal_pairs(4, 4) == 10 and instruments.causal_pairs(6, 4) == 10 + 2 * 4


def test_forward_backward_faster_than_forward_is_measured_again_then_called_noise(monkeypatch):
    measured = []

    def fake_round_robin(tasks, repeats):  # softmax's forward+backward always measures faster than its forward
        measured.append((sorted(tasks), repeats))
        return {key: 0.5 if key == ("softmax", "fwd_bwd") else 1.0 if key[1] == "forward" else 2.0 for key in tasks}

    monkeypatch.setattr(mixers, "round_robin", fake_round_robin)
    monkeypatch.setattr(mixers, "contenders", lambda: [("softmax", "softmax", {}), ("gla", "gla", {})])
    lines = []
    rows = bench_mixers(lengths=[8], d_model=16, n_heads=2, repeats=2, log=lines.append)
    assert measured[1] == ([("softmax", "forward"), ("softmax", "fwd_bwd")], 6)  # only the inverted pair, 3x
    assert {r["mixer"]: r["noise"] for r in rows} == {"softmax": True, "gla": False}
    assert "noise" in next(line for line in lines if line.startswith("softmax"))


def test_every_plotted_line_has_its_own_colour_and_shape():
    styles = line_styles(len(contenders()))
    assert len({s["color"] for s in styles}) == len(styles)
    assert len({(s["marker"], s["linestyle"]) for s in styles}) == len(styles)


def test_mixers_run_under_bf16_autocast():
    rows = bench_mixers(lengths=[16], d_model=16, n_heads=2, repeats=1, precision="bf16", log=lambda *_: None)
    assert {"softmax", "gla"} <= {r["mixer"] for r in rows} and all(r["fwd_bwd_ms"] > 0 for r in rows)


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


def test_boltzmann_banded_bench_reports_growth_and_holds_it_to_linear():
    from attnlab.papers.boltzmann.bench import bench_inference, linear_growth

    lines = []
    result = bench_inference(exact_lengths=[4], banded_lengths=[16, 32], exact_batch=1, head_dim=8, window=8,
                             band=3, log=lines.append)
    assert set(result) == {"exact T=4", "banded T=16", "banded T=32"} and any("x2 the length" in x for x in lines)
    [(what, value, relation, bar)] = linear_growth({"banded T=16": 1.0, "banded T=64": 4.4})
    assert "T=64 / T=16" in what and value == 4.4 and (relation, bar) == ("<=", 4.5)
    assert linear_growth({"exact T=4": 1.0, "banded T=16": 1.0}) == []  # one banded length: no growth to judge


def test_interdomain_bench_measures_every_form_in_its_own_process():
    from attnlab.papers.interdomain.bench import bench_forms

    lines = []
    results = bench_forms(lengths=[32], head_dim=8, modes=4, log=lines.append)
    assert set(results) == {"chunk T=32", "fft T=32", "decode T=32"}
    assert all(row["seconds"] > 0 and row["rss_mib"] > 0 for row in results.values())
    assert json.loads(json.dumps(results)) == results  # bench.json can hold it
    assert not any("failed" in line for line in lines)


def test_attention_decode_and_precision_goals_are_judged_from_the_run():
    def row(mixer, seq_len, x_softmax, mib):
        return {"mixer": mixer, "seq_len": seq_len, "x_softmax": x_softmax, "activation_mib": mib}

    results = {"ops": {"ratios": {}}, "x_transformers": None,
               "config": {"decode": {"contexts": [8, 16]}, "mixers": {"lengths": [1024, 4096]}}, "decode": [],
               "mixers": [row("differential", 1024, 2.0, 10), row("differential", 4096, 2.1, 40),
                          row("sigmoid", 1024, 2.5, 10), row("sigmoid", 4096, 3.0, 160)],
               "decode_floor": {"context": 16, "gb_per_s": 20.0, "x_floor": 1.2},
               "utilisation": {"products": {"fp32": 100.0, "bf16": 300.0}, "bf16_speedup": {"d 512": 0.9}}}
    verdicts = {g["goal"].split(" (")[0]: g["verdict"] for g in goals(results)}
    assert verdicts["differential / softmax mixer fwd+bwd at T=4096"] == "met"
    assert verdicts["differential activation memory T=4096 / T=1024"] == "met"
    assert verdicts["sigmoid / softmax mixer fwd+bwd at T=4096"] == "NOT MET"
    assert verdicts["sigmoid activation memory T=4096 / T=1024"] == "NOT MET"  # quadratic: 16x for 4x the length
    assert verdicts["softmax decode ms/token at 16 / one read of its cache at 20 GB/s"] == "met"
    assert verdicts["bf16 / fp32 training step speed, d 512"] == "NOT MET"
    results["utilisation"]["products"]["bf16"] = 100.0  # no faster bf16 products: bf16 is not held to a goal
    assert not any(g["goal"].startswith("bf16") for g in goals(results))
    results["utilisation"].update(products={"fp32": 100.0, "bf16": 1.0}, bf16_speedup={})  # bf16 steps not timed
    assert not any(g["goal"].startswith("bf16") for g in goals(results))


def test_document_starts_fill_every_row_with_documents_cut_at_its_end():
    starts = document_starts(4, 64, 8, 128, seed=3)
    lengths = starts.diff()
    assert starts[0] == 0 and starts[-1] == 4 * 64 and bool((lengths >= 1).all()) and bool((lengths <= 128).all())
    assert set(range(0, 4 * 64 + 1, 64)) <= set(starts.tolist())  # every row starts a document
    assert len(lengths) > 4  # rows hold several documents


def test_the_packed_view_times_every_mixer_that_runs_plain_and_packed():
    lines = []
    results = bench_packed(seq_len=32, batch=2, d_model=32, repeats=1, log=lines.append)
    assert {"softmax", "gla", "interdomain", "boltzmann (banded 4, window 64)"} <= set(results)
    assert "boltzmann" not in results and any("boltzmann" in line and "not run" in line for line in lines)
    assert all(r["plain_ms"] > 0 and r["packed_ms"] > 0 and r["x_plain"] > 0 for r in results.values())


def test_packed_steps_are_held_to_their_goal():
    results = {"ops": {"ratios": {}}, "x_transformers": None, "config": {"decode": {"contexts": [8, 16]}}, "decode": [],
               "packed": {"gla": {"x_plain": 1.1}, "ccq-gla": {"x_plain": 2.0}}}
    verdicts = {g["goal"]: g["verdict"] for g in goals(results) if "packed" in g["goal"]}
    assert verdicts == {"gla packed documents / plain rows, training step (x)": "met",
                        "ccq-gla packed documents / plain rows, training step (x)": "NOT MET"}


def test_bf16_steps_are_not_timed_where_bf16_products_are_slower_and_no_share_exceeds_its_peak(monkeypatch):
    from attnlab.bench import utilisation
    from attnlab.bench.whole import TINY_MODEL

    speeds = {torch.float32: 50.0, torch.bfloat16: 0.5}
    monkeypatch.setattr(utilisation, "matmul_peak", lambda dtypes, sizes: {"gflops": speeds[dtypes[0]]})
    lines = []
    result = utilisation.bench_utilisation({"tiny": TINY_MODEL}, repeats=1, log=lines.append)
    assert [row["precision"] for row in result["rows"]] == ["fp32"] and result["bf16_speedup"] == {}
    assert any("bf16 steps not timed: bf16 products run at 0.01x fp32's" in line for line in lines)
    bf16_only = utilisation.bench_utilisation({"tiny": TINY_MODEL}, ("bf16",), 1, log=lines.append)
    assert bf16_only["peaks"] == {"bf16": 50.0} and bf16_only["rows"] == []  # autocast keeps some fp32 products


def test_context_parallel_traffic_is_flat_for_a_scanned_state_and_grows_for_attention():
    from attnlab.bench.context import bench_context

    lines = []
    found = bench_context([32, 128], d_model=16, n_layers=1, n_heads=2, log=lines.append)
    assert found["softmax"][128] == 4 * found["softmax"][32] and found["softmax"]["trend"] == "grows"
    # the pairs (M, U) and a fixed halo; ema is the examples' plugin, which the ranks' new processes import again
    for label in ("gla", "gdn", "ccq-gla", "s4d", "interdomain", "ema"):
        assert found[label][128] == found[label][32] > 0 and found[label]["trend"] == "flat"
    assert "boltzmann" not in found  # its window of 16 reads no sequence of 32 tokens or more, and it says so
    assert any(line.startswith("boltzmann") and line.endswith("not measured: reads at most 16 tokens (boltzmann's "
                                                               "window=16)") for line in lines)
