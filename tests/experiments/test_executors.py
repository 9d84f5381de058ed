"""A suite's plan before anything trains, and its jobs run in this process, in worker processes and on a local Ray
cluster with the same records; a worker killed mid-run and a driver killed mid-suite lose nothing finished."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from multiprocessing import get_context
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attnlab import plugins
from attnlab.bench import registry as bench_registry
from attnlab.cli import main
from attnlab.data import tasks
from attnlab.lab import executors, metrics, registry
from attnlab.lab.claims import Anchor, Claim
from attnlab.lab.configs import Settings
from attnlab.lab.driver import run_suite
from attnlab.lab.plan import measurement_of, plan
from attnlab.lab.spec import Arm, Changes, Experiment, Suite
from attnlab.lab.store import Record, Results, RunKey
from attnlab.mixers import registry as mixer_registry
from attnlab.papers import get_suite

HERE = Path(__file__).parent
TOY, DIE_ONCE = HERE / "toy_paper.py", HERE / "die_once.py"
TIMING = ("seconds", "run", "resumed_from")  # what may differ between two trainings of the same run


def anchored_sweep(tolerance: float) -> Suite:
    arms = [Arm("hJ", "demo", Changes.mixer("sigmoid")), Arm("softmax", "demo")]
    anchor = Anchor("lm", "softmax", "val_ppl", 5.0, tolerance)
    claim = Claim("hJ beats softmax", "lm", "val_ppl", "hJ", "softmax", "lower", calibration=(anchor,))
    return Suite("s", "s", [Experiment("lm", "lm", "val_ppl", arms, "softmax", lrs=[1e-3, 2e-3, 4e-3])],
                 claims=[claim], seeds=2)


def record_of(job, **values) -> dict:
    """What a run of this job would record: its fingerprint, its measurement, these values."""
    return {"best_val_loss": 1.0, **values, "run": f"runs/{job.cfg.name}", "config": job.fingerprint,
            "measured": measurement_of(job.experiment)}


@pytest.mark.parametrize("tolerance", [1e9, 0.1], ids=["calibrated", "missed"])
def test_a_plan_puts_sweeps_then_calibration_then_the_other_arms_and_trains_nothing(tolerance, monkeypatch):
    monkeypatch.setattr("attnlab.lab.job.train", lambda *a, **k: pytest.fail("a plan trains nothing"))
    suite = anchored_sweep(tolerance)
    settings = Settings(Path("runs"), seeds=2)
    results = Results({"suite": "s", "runs": {}})
    first = plan(suite, suite.experiments, results, settings)
    assert [(j.stage, str(j.key), j.status) for j in first.jobs] == [
        ("sweep", "lm/softmax/lr=0.001", "train"), ("sweep", "lm/softmax/lr=0.002", "train"),
        ("sweep", "lm/softmax/lr=0.004", "train"),  # the anchored baseline's sweep first
        ("sweep", "lm/hJ/lr=0.001", "waiting"), ("sweep", "lm/hJ/lr=0.002", "waiting"),
        ("sweep", "lm/hJ/lr=0.004", "waiting"),  # the compared arm's, once the baseline is calibrated
        ("calibration", "lm/softmax/0", "waiting"), ("seed", "lm/hJ/0", "waiting"),
        ("calibration", "lm/softmax/1", "waiting"), ("seed", "lm/hJ/1", "waiting")]
    assert first.jobs[3].why == "the calibration" and first.jobs[6].why == "the sweep of lm/softmax"

    for job in first.jobs[:3]:  # the baseline's sweep measured: 0.002 wins inside the grid
        results.records[job.key] = Record.from_json(record_of(job, best_val_loss=1.0 if job.key.lr == 2e-3 else 2.0))
    second = plan(suite, suite.experiments, results, settings)
    by_key = {str(j.key): j for j in second.jobs}
    assert by_key["lm/softmax/0"].status == "measure" and by_key["lm/softmax/0"].model == RunKey("lm", "softmax",
                                                                                                 lr=2e-3)
    assert by_key["lm/softmax/1"].status == "train" and by_key["lm/softmax/1"].lr == 2e-3
    assert (by_key["lm/hJ/1"].status, by_key["lm/hJ/1"].why) == ("waiting", "the calibration")

    for key in ("lm/softmax/0", "lm/softmax/1"):  # the baseline's seeds measured, 1 away from the paper's 5
        job = by_key[key]
        results.records[job.key] = Record.from_json(record_of(job, val_ppl=6.0))
    third = {str(j.key): j for j in plan(suite, suite.experiments, results, settings).jobs}
    if tolerance > 1:  # calibrated: the compared arm's sweep, then its seeds
        assert third["lm/hJ/lr=0.001"].status == "train" and third["lm/hJ/1"].why == "the sweep of lm/hJ"
    else:
        assert {third[k].status for k in ("lm/hJ/lr=0.001", "lm/hJ/0", "lm/hJ/1")} == {"blocked"}
        assert "the baseline is not the paper's" in third["lm/hJ/1"].why


def test_a_dry_run_lists_the_jobs_and_their_stages_without_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("attnlab.lab.job.train", lambda *a, **k: pytest.fail("a dry run trains nothing"))
    assert main(["reproduce", "coupled-qk", "--quick", "--dry-run", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert ("coupled-qk (default): 72 jobs; estimated time of training and evaluation on this machine's CPU"
            in printed)
    assert "lm/softmax/0" in printed and "waits for the model of lm/coupled-euler/0" in printed
    assert "45 trains, 27 waits for; about" in printed
    assert not (tmp_path / "coupled-qk-quick").exists()  # nothing written


def test_a_jobs_estimate_probes_a_whole_micro_batch_not_one_sequence_times_the_batch(monkeypatch):
    from attnlab import step_cost
    from attnlab.config import load_config
    from attnlab.lab import costs

    probed = []

    def probe(models, seq_len, vocab_size, device, repeats=2, batch=1):
        probed.append((seq_len, batch))
        return {"model": 0.01 + 0.001 * batch}  # a fixed cost per call, and a cost per sequence

    monkeypatch.setattr(step_cost, "probe_seconds", probe)
    cfg = load_config("demo", ["train.batch_size=64", "train.grad_accum=4", "train.seq_len=32", "train.steps=100"])
    assert costs.step_seconds(cfg) == pytest.approx(4 * (0.01 + 0.016))  # 4 micro-batches of 16
    assert probed == [(32, 16)]


def test_a_jobs_estimate_counts_its_evaluations_and_its_measurement_at_the_probes_forward_time(tmp_path,
                                                                                                monkeypatch):
    """A small model's measurement can cost more than its training: every window of the validation split is read,
    and again in the blocks a bootstrap resamples. The plan prices each forward call as the probe times one."""
    from attnlab import step_cost
    from attnlab.data import load_data
    from attnlab.lab import costs
    from attnlab.lab.driver import dry_run
    from attnlab.step_cost import duration

    probed = []

    def probe(models, seq_len, vocab_size, device, repeats=2, batch=1, backward=True):
        probed.append((seq_len, batch, backward))
        return {"model": 0.5 if backward else 1.0}  # a training step's micro-batch; a forward call

    monkeypatch.setattr(step_cost, "probe_seconds", probe)
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    tiny = Changes.train(steps=10, batch_size=8, seq_len=16, eval_every=4, eval_batches=2) | Changes.data(
        max_chars=20000)
    arm = Arm("softmax", "demo", tiny)
    suite = Suite("s", "s", [Experiment("lm", "lm", "val_ppl", [arm], "softmax"),
                             Experiment("again", "the same models", "val_ppl", [arm], "softmax")], seeds=1)
    jobs = dry_run(suite, tmp_path / "s")
    lines, _ = costs.plan_lines(suite, jobs)
    scored = len(load_data(jobs.jobs[0].cfg.data, 16).split("val")) - 1
    assert scored // 16 >= 50  # enough windows for the bootstrap's blocks
    # forward calls of a micro-batch of 8: every window (the last one shorter), then the blocks' full windows;
    # softmax has no component to remove, so no third pass
    measured = math.ceil(math.ceil(scored / 16) / 8) + math.ceil(scored // 16 / 8)
    evaluations = 3 * 2  # at steps 4, 8 and 10, two batches of 8 each time
    assert sorted(set(probed)) == [(16, 8, False), (16, 8, True)]
    assert lines[1].endswith(f" {duration(10 * 0.5 + evaluations + measured)}")  # trains, then measures
    assert "waits for the model of lm/softmax/0" in lines[2] and lines[2].endswith(f" {duration(measured)}")
    evaluated = evaluations + 2 * measured
    assert lines[-1].startswith(f"1 trains, 1 waits for; about {duration(5 + evaluated)} in all, 5 s of training "
                                f"steps and {duration(evaluated)} of evaluation (the jobs that wait counted at their "
                                "presets' rates); evaluation: each job's validation loss every train.eval_every "
                                "steps and its measurement after (the forward passes its metric makes")


@pytest.mark.parametrize("preset, length, options", [
    ("mqar", 16, {"mqar": {"train_examples": 16, "test_examples": 8, "test_pairs": [1, 2, 4]}}),
    ("brackets", 12, {"brackets": {"train_examples": 16, "test_examples": 8}}),
    ("demo", 16, {"parity": {"train_examples": 16, "test_examples": 8, "test_lengths": [1, 2, 4]}}),
])
def test_a_tasks_test_sizes_before_its_examples_are_made_are_those_it_makes(preset, length, options):
    from attnlab.config import load_config
    from attnlab.data import TASKS, load_data

    source = next(iter(options))
    overrides = [f"data.source={source}", ("data.task_options", options), f"train.seq_len={length}"]
    cfg = load_config(preset, overrides).data
    data = load_data(cfg, length)
    made = [tuple(data.test[0].shape)] + [tuple(x.shape) for x, _ in getattr(data, "slices", {}).values()]
    assert TASKS[source].tests(cfg.task_config(), length) == made


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy paper imported (as --import does) for this test only, one thread per process, its own cache."""
    saved = [(table, dict(table)) for table in (registry.SUITES, registry.PAPERS, bench_registry.BENCH_CASES,
                                                 metrics.METRICS, tasks.TASKS, mixer_registry._REGISTRY)]
    imported, files = list(plugins.IMPORTED), dict(plugins._files)
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each of the workers below: the same arithmetic, to the bit
    plugins.import_plugin(str(TOY), "test")
    yield get_suite("toy")
    torch.set_num_threads(threads)
    plugins.IMPORTED[:] = imported
    plugins._files.clear()  # so that the next test imports the toy paper again, into registries without it
    plugins._files.update(files)
    for table, before in saved:
        table.clear()
        table.update(before)


def untimed(results: Results) -> dict:
    return {str(k): {f: v for f, v in r.to_json().items() if f not in TIMING} for k, r in results.items()}


def test_the_toy_paper_gives_the_same_records_in_process_in_workers_and_on_ray(toy, tmp_path):
    quiet = lambda *_: None  # noqa: E731
    here = run_suite(toy, tmp_path / "here" / "toy", log=quiet)
    workers = run_suite(toy, tmp_path / "workers" / "toy", log=quiet,
                               executor=executors.LocalWorkers(2, gpus=0, imports=plugins.IMPORTED, log=quiet))
    assert len(here) == 6 and untimed(workers) == untimed(here)
    assert "workers" not in here.meta and workers.meta["workers"] == "2 local worker processes of 1 thread(s) each"
    ray = pytest.importorskip("ray")
    try:
        cluster = executors.RayWorkers(2, imports=plugins.IMPORTED, log=quiet,
                                       init={"num_cpus": 2, "include_dashboard": False})
        on_ray = run_suite(toy, tmp_path / "ray" / "toy", log=quiet, executor=cluster)
    finally:
        ray.shutdown()
    assert untimed(on_ray) == untimed(here)


def test_a_worker_killed_mid_run_continues_from_its_checkpoint_and_ends_as_if_never_killed(toy, tmp_path,
                                                                                           monkeypatch):
    only_lm = [toy.experiments[0]]
    only_lm[0].arms = only_lm[0].arms[:1]
    toy.experiments = only_lm
    quiet, said = (lambda *_: None), []
    every_2 = ["train.ckpt_every=2"]  # of its 4 steps
    never = run_suite(toy, tmp_path / "never" / "toy", log=quiet, extra=every_2)
    monkeypatch.setenv("ATTNLAB_DIE_AT_STEP", "2")  # the worker SIGKILLs itself after its checkpoint of step 2
    monkeypatch.setenv("ATTNLAB_DIE_MARK", str(tmp_path / "died"))  # once
    plugins.import_plugin(str(DIE_ONCE), "test")
    killed = run_suite(toy, tmp_path / "killed" / "toy", log=said.append, extra=every_2,
                              executor=executors.LocalWorkers(1, gpus=0, imports=plugins.IMPORTED, log=said.append))
    assert (tmp_path / "died").is_file() and any("its worker died (exit code -9)" in line for line in said)
    assert killed.get(RunKey("lm", "softmax", seed=0)).resumed_from == 2
    assert untimed(killed) == untimed(never)


def test_a_job_that_fails_in_its_worker_stops_the_suite_with_one_line_and_keeps_what_finished(toy, tmp_path,
                                                                                            monkeypatch, capfd):
    monkeypatch.setenv("ATTNLAB_FAIL_AT_STEP", "4")
    plugins.import_plugin(str(DIE_ONCE), "test")
    toy.experiments = toy.experiments[:1]
    with pytest.raises(executors.JobFailed, match=r"^lm/softmax/0 failed: UserError: a planted failure at step 4$"):
        run_suite(toy, tmp_path / "toy", log=lambda *_: None,
                         executor=executors.LocalWorkers(1, gpus=0, imports=plugins.IMPORTED, log=lambda *_: None))
    assert "Traceback" not in capfd.readouterr().err  # a mistake, said in one line, not a bug's traceback
    assert not (tmp_path / "toy" / "results.json").exists()  # nothing finished, nothing written


def test_a_driver_killed_mid_suite_and_started_again_loses_no_finished_record(tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "attnlab.cli", "--import", str(TOY), "reproduce", "toy", "--quick", "--jobs",
               "2", "--out", str(out)]
    env = {**os.environ, "ATTNLAB_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    driver = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = out / "toy-quick" / "results.json"
    deadline = time.monotonic() + 120
    while not (path.is_file() and json.loads(path.read_text())["runs"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    first = json.loads(path.read_text())["runs"]
    assert first, "the driver finished no job in two minutes"
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    again = json.loads(path.read_text())["runs"]
    assert len(again) == 6 and all(again[key] == record for key, record in first.items())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="elsewhere a thread of the worker watches its driver")
def test_a_worker_ends_with_its_driver_even_in_a_call_that_holds_the_gil(tmp_path):
    """A driver killed with SIGKILL cannot stop its workers; an orphan would finish its job and send a record that
    nobody keeps, writing the run folder that the driver, started again, gives the same job. The worker is killed
    with it, here in the middle of a long call that lets no thread of its own watch (a minute of it)."""
    mark = tmp_path / "holding"
    command = [sys.executable, "-m", "attnlab.cli", "--import", str(TOY), "--import", str(DIE_ONCE), "reproduce",
               "toy", "--only", "lm", "--arms", "softmax", "--jobs", "1", "--out", str(tmp_path / "out")]
    env = {**os.environ, "ATTNLAB_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
           "ATTNLAB_HOLD_AT_STEP": "4", "ATTNLAB_DIE_MARK": str(mark)}
    driver = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (mark.is_file() and mark.read_text()) and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mark.is_file(), "the worker never reached its checkpoint"
        worker = int(mark.read_text())
        driver.kill()
        driver.wait()
        deadline = time.monotonic() + 10
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(worker), "the worker outlived its driver"
    finally:
        driver.kill()
        if mark.is_file() and alive(int(mark.read_text())):
            os.kill(int(mark.read_text()), signal.SIGKILL)
    assert not (tmp_path / "out" / "toy" / "results.json").exists()  # nothing finished, nothing written


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie that no one has reaped yet does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_job_whose_worker_keeps_dying_is_started_three_times_then_stops_the_suite(monkeypatch):
    """A worker killed (out of memory, say) has its job started again from its checkpoint, twice; a third death
    stops the suite with one line."""
    said, started = [], []
    workers = executors.LocalWorkers(1, gpus=0, log=said.append)
    workers.context = get_context("fork")  # a worker that dies at once needs no interpreter of its own
    monkeypatch.setattr(executors, "work_in_process", lambda *args: os._exit(9))
    submit = workers.submit

    def counted(work, tries=0):
        started.append(tries)
        assert len(started) <= 3, f"started {len(started)} times"
        submit(work, tries)

    monkeypatch.setattr(workers, "submit", counted)
    workers.submit(SimpleNamespace(key=RunKey("lm", "softmax", seed=0), ranks=1))
    with pytest.raises(executors.JobFailed, match=r"^lm/softmax/0: its worker died 3 times \(exit code 9\); "):
        workers.next_done()
    assert started == [0, 1, 2] and not workers.running
    assert said == ["    lm/softmax/0: its worker died (exit code 9); starting it again"] * 2


@pytest.mark.parametrize("argv, says", [
    (["--jobs", "0"], "--jobs: 0 is out of range; give 1 or more"),
    (["--runs-per-gpu", "2"], "--runs-per-gpu packs runs on GPUs, and this machine has none"),
    (["--runs-per-gpu", "2", "--dry-run"], "--runs-per-gpu packs runs on GPUs, and this machine has none"),
    (["--runs-dir", "{file}"], "is a file; give a folder"),
    (["--runs-dir", "{file}/runs"], "cannot be written"),  # a folder inside a file: not even root makes it
])
def test_bad_options_of_where_jobs_run_are_one_line_before_anything_trains(argv, says, tmp_path, capsys,
                                                                         monkeypatch):
    monkeypatch.setattr("attnlab.lab.job.train", lambda *a, **k: pytest.fail("nothing trains"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    (tmp_path / "file").write_text("")
    argv = [a.format(file=tmp_path / "file") for a in argv]
    assert main(["reproduce", "coupled-qk", "--quick", "--out", str(tmp_path / "out"), *argv]) == 2
    captured = capsys.readouterr()
    assert says in captured.err and len(captured.err.strip().splitlines()) == 1 and "Traceback" not in captured.err
    assert not captured.out and not (tmp_path / "out").exists()  # no plan printed, nothing written


def test_ray_without_ray_names_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    assert main(["reproduce", "coupled-qk", "--quick", "--executor", "ray", "--out", str(tmp_path)]) == 2
    assert "pip install 'attnlab[ray]'" in capsys.readouterr().err


def test_an_unreachable_ray_address_is_one_line(monkeypatch, capsys, tmp_path):
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr("attnlab.lab.job.train", lambda *a, **k: pytest.fail("nothing trains"))
    assert main(["reproduce", "coupled-qk", "--quick", "--executor", "ray", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "RAY_ADDRESS=127.0.0.1:9 cannot be reached" in err and "Traceback" not in err


def test_workers_share_the_gpus_and_the_cores():
    assert executors.slots(4, gpus=2, runs_per_gpu=None, cpus=16) == [
        {"gpu": 0, "threads": 4}, {"gpu": 0, "threads": 4}, {"gpu": 1, "threads": 4}, {"gpu": 1, "threads": 4}]
    assert [s["gpu"] for s in executors.slots(6, gpus=1, runs_per_gpu=6, cpus=16)] == [0] * 6
    assert [s["gpu"] for s in executors.slots(4, gpus=4, runs_per_gpu=1, cpus=16)] == [0, 1, 2, 3]
    assert executors.slots(2, gpus=0, runs_per_gpu=None, cpus=2) == [{"gpu": None, "threads": 1}] * 2
    assert executors.slots(3, gpus=0, runs_per_gpu=None, cpus=2) == [{"gpu": None, "threads": 1}] * 3


def test_a_run_of_several_ranks_trains_under_torchrun_and_records_what_one_process_would(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    tiny = (Changes.train(steps=4, batch_size=2, eval_batches=1, eval_every=4, ckpt_every=4)
            | Changes.model(d_model=16, n_layers=1) | Changes.data(max_chars=20000))
    records = {}
    for ranks in (1, 2):
        lm = Experiment("lm", "lm", "val_ppl", [Arm("softmax", "demo", tiny, ranks=ranks)], "softmax")
        results = run_suite(Suite("s", "s", [lm], seeds=1), tmp_path / f"ranks{ranks}" / "s",
                                   log=lambda *_: None)
        records[ranks] = results.get(RunKey("lm", "softmax", seed=0)).to_json()
    assert records[2]["config"] == records[1]["config"]  # the same run, trained by two processes (gloo)
    assert records[2]["val_ppl"] == pytest.approx(records[1]["val_ppl"], rel=1e-4)
    assert records[2]["steps"] == records[1]["steps"] == 4
    assert (tmp_path / "ranks2" / "s" / "runs" / "lm-softmax-s0.yaml").is_file()  # the config torchrun read


def test_a_worker_interrupted_with_its_driver_leaves_quietly_sending_nothing(monkeypatch, capsys):
    """Ctrl-C reaches every process of the driver's group: the worker says nothing (no traceback) and sends no
    record; the driver stops the suite, and the job continues from its checkpoint next time."""
    import pickle
    from multiprocessing import Pipe

    def interrupted(work, log):
        raise KeyboardInterrupt

    monkeypatch.setattr(executors, "_execute", interrupted)
    monkeypatch.setattr(executors, "_exit_with_driver", lambda driver: None)
    threads = torch.get_num_threads()
    receiver, sender = Pipe(duplex=False)
    try:
        executors.work_in_process(pickle.dumps(RunKey("lm", "softmax", seed=0)), {"gpu": None, "threads": 1}, [],
                                  sender, os.getppid())
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(EOFError):  # closed, nothing sent
        receiver.recv()
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
