"""Helpers shared by the tests: random inputs and comparisons of forms (outputs, states, gradients), made-up
suite results with a known effect, a training process that dies at a chosen checkpoint, and workers on gloo ranks."""

import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

from attnlab import checkpoint
from attnlab.lab.claims import Claim
from attnlab.lab.store import Record, Results, RunKey
from attnlab.mixers import list_mixers


def random_linear_inputs(B=2, H=3, T=37, K=8, V=6, seed=0, per_channel_decay=True, decay_scale=1.0, max_beta=1.0):
    """fp64 inputs for the linear-attention ops, each requiring grad (the initial state too); write strengths
    beta uniform in (0, max_beta)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    q, k, v = rand(B, H, T, K), torch.nn.functional.normalize(rand(B, H, T, K), dim=-1), rand(B, H, T, V)
    decay_shape = (B, H, T, K) if per_channel_decay else (B, H, T)
    log_decay = torch.nn.functional.logsigmoid(rand(*decay_shape)) * decay_scale
    beta = max_beta * torch.rand(B, H, T, generator=g, dtype=torch.float64)
    h0 = rand(B, H, K, V)
    return [t.requires_grad_() for t in (q, k, v, log_decay, beta, h0)]


_TRITON_WORKERS: dict[tuple[str, ...], tuple[subprocess.Popen, Path]] = {}  # checks -> the worker, its output


def start_triton_worker(checks: list[str]) -> None:
    """Start tests/triton_worker.py's checks in a process of its own (Triton's interpreter on, fla imported
    there), in the background: its single thread runs beside the tests collected before its own."""
    if tuple(checks) in _TRITON_WORKERS:
        return
    output = Path(tempfile.mkdtemp(prefix="triton-worker-"))
    worker = Path(__file__).parent / "triton_worker.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread, numpy's included
    with open(output / "stdout", "w") as stdout, open(output / "stderr", "w") as stderr:
        # at the lowest priority: it takes the core the tests leave idle, never one they want
        process = subprocess.Popen([sys.executable, str(worker), *checks], stdout=stdout, stderr=stderr, text=True,
                                   env=env, preexec_fn=lambda: os.nice(19))
    _TRITON_WORKERS[tuple(checks)] = process, output


def stop_triton_workers() -> None:
    """Stop the workers whose results no test asked for (a session stopped early)."""
    for process, output in _TRITON_WORKERS.values():
        process.kill()
        process.wait()
        shutil.rmtree(output, ignore_errors=True)
    _TRITON_WORKERS.clear()


def triton_worker_results(checks: list[str]) -> dict:
    """The worker's checks (started now unless the session started it already) -> {check: None where it passed,
    else its error}."""
    pytest.importorskip("triton")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Triton is not supported on current platform, roll back to CPU"
        pytest.importorskip("fla")
    start_triton_worker(checks)
    process, output = _TRITON_WORKERS.pop(tuple(checks))
    try:
        process.wait(timeout=600)
        stdout, stderr = ((output / name).read_text() for name in ("stdout", "stderr"))
    finally:
        process.kill()
        shutil.rmtree(output, ignore_errors=True)
    assert process.returncode == 0, stderr[-4000:]
    return json.loads(stdout.splitlines()[-1])


def grads_of(fn, inputs, seed=1):
    """Outputs of fn(*inputs) -> (o, state) and the gradients of a random projection of both."""
    o, state = fn(*inputs)
    g = torch.Generator().manual_seed(seed)
    loss = (o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum()
    loss = loss + (state * torch.randn(state.shape, generator=g, dtype=state.dtype)).sum()
    grads = torch.autograd.grad(loss, inputs)
    return o.detach(), state.detach(), grads


def assert_same(a, b, atol=1e-10):
    o_a, s_a, g_a = a
    o_b, s_b, g_b = b
    torch.testing.assert_close(o_a, o_b, rtol=0, atol=atol)
    torch.testing.assert_close(s_a, s_b, rtol=0, atol=atol)
    for x, y in zip(g_a, g_b, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=atol)


def step_through(step, *inputs, state):
    """Run a single-token step function over time: inputs [B, H, T, ...] -> (o [B, H, T, ...], state)."""
    outputs = []
    for t in range(inputs[0].shape[2]):
        o, state = step(*(x[:, :, t] for x in inputs), state)
        outputs.append(o)
    return torch.stack(outputs, dim=2), state


# every registered mixer with its defaults, plus non-default options that change the computation
CASES = [(name, {}) for name in list_mixers()] + [
    ("coupled-qk", {"integrator": "leapfrog", "steps": 7, "per_head_mlp": True}),
    ("coupled-differential", {"integrator": "leapfrog", "steps": 2}),
    ("uncoupled-qk", {"steps": 3}),
    ("coupled-qk", {"integrator": "affine", "steps": 2, "per_head_mlp": True}),
    ("coupled-differential", {"integrator": "affine"}),
    ("softmax", {"rope": False}),
    ("softmax", {"output_gate": True}),
    ("differential", {"output_gate": True}),
    ("boltzmann", {"j_init_std": 0.3}),
    ("boltzmann", {"mode": "h+J+K", "j_init_std": 0.3}),
    ("boltzmann", {"inference": "banded", "couplings": "distance", "band": 3, "j_init_std": 0.3}),
    ("boltzmann", {"inference": "mean-field", "j_init_std": 0.3}),
    # windows shorter than the 12-token inputs: sliding windows
    ("boltzmann", {"inference": "banded", "couplings": "distance", "band": 3, "window": 6, "j_init_std": 0.3}),
    ("boltzmann", {"inference": "mean-field", "couplings": "distance", "window": 5, "j_init_std": 0.3}),
    ("boltzmann", {"inference": "dqa", "window": 12, "dqa_shots": 0, "dqa_steps": 20, "j_init_std": 0.3}),
    ("boltzmann", {"mode": "h-only", "normalise": False}),
    ("boltzmann", {"inference": "banded", "couplings": "distance", "band": 3, "window": 6, "j_init_std": 0.3,
                   "normalise": False}),
    ("ccq-gdn", {"ccq_decay": True}),
    ("ccq-gla", {"read": "ridge", "ccq_lambda_init": 0.7}),
    ("ccq-gdn", {"read": "ridge", "ccq_decay": True}),
    ("gdn", {"negative_eigenvalues": True}),
    ("interdomain", {"form": "fft", "readout": "hermitian", "modes": 8}),
    ("interdomain", {"input": "single", "gate": True, "chunk_size": 5, "modes": 8}),
    ("interdomain", {"query": "linear", "rope": False, "modes": 8}),
    ("s4d", {"rope": True}),  # the paper's "S4D-only + RoPE": RoPE's positions restart in every packed sequence
]
CASE_IDS = [name + "".join(f"-{k}={v}" for k, v in options.items()) for name, options in CASES]


# made-up suite results: two arms whose per-seed difference is known


def centred_noise(seed: int, n: int, sd: float) -> list[float]:
    """n deterministic normal draws shifted to mean exactly 0, so the mean Δ is known exactly."""
    rng = random.Random(seed)
    draws = [rng.gauss(0, sd) for _ in range(n)]
    return [d - sum(draws) / n for d in draws]


def toy_results() -> Results:
    return Results({"suite": "toy", "runs": {}})


def add_runs(results: Results, experiment: str, arm: str, values: list, key: str = "val_ppl") -> Results:
    """Sets key to values[s] in the record of seed s of the arm, adding the records it lacks."""
    for seed, value in enumerate(values):
        run = RunKey(experiment, arm, seed=seed)
        record = results.records.get(run, Record(seconds=1.0))
        results.records[run] = record.replace(values={**record.values, key: value})
    return results


def change(results: Results, key: RunKey, **fields) -> None:
    """Replaces fields of the record at key (values, details, extent, seconds, ...), as a run written anew."""
    results.records[key] = results.get(key).replace(**fields)


def two_arms(delta: float, sd: float, n: int = 5, seed: int = 0, experiment: str = "lm") -> Results:
    """Baseline perplexities around 10 and an arm whose per-seed difference is delta + centred noise."""
    base = [10 + x for x in centred_noise(seed + 100, n, 0.5)]
    arm = [b + delta + x for b, x in zip(base, centred_noise(seed, n, sd), strict=True)]
    return add_runs(add_runs(toy_results(), experiment, "softmax", base), experiment, "hJ", arm)


def lower(paper: float | None = None, direction: str = "lower", **kwargs) -> Claim:
    return Claim("h+J beats softmax", "lm", "val_ppl", "hJ", "softmax", direction, paper=paper, **kwargs)


class Crash(Exception):
    """The process dying (raised by crash_after_checkpoint)."""


def crash_after_checkpoint(monkeypatch, step: int):
    """Until the returned function is called, training raises Crash right after writing its checkpoint of step."""
    save = checkpoint.save_checkpoint

    def save_then_crash(run_dir, at, *args, **kwargs):
        folder = save(run_dir, at, *args, **kwargs)
        if at == step:
            raise Crash
        return folder

    monkeypatch.setattr(checkpoint, "save_checkpoint", save_then_crash)
    return lambda: monkeypatch.setattr(checkpoint, "save_checkpoint", save)


def on_gloo_ranks(worker, folder, world: int = 2) -> dict:
    """What worker(rank, store, out) puts in out on `world` processes, which join a gloo group through the file
    store in folder (starting them is most of the cost: one start serves a module's tests)."""
    import torch.multiprocessing as mp

    mp.spawn(_rank_into_file, args=(worker, str(folder)), nprocs=world)
    out = {}
    for rank in range(world):
        out.update(pickle.loads((folder / f"out{rank}.pickle").read_bytes()))
    return out


def _rank_into_file(rank: int, worker, folder: str) -> None:
    """One rank: worker fills a plain dict, handed back pickled in one file. (A multiprocessing Manager's dict
    moved every tensor into shared memory on its own, which took longer than the ranks' work.)"""
    # one thread a rank: the ranks are already one process a core, and more threads on their small tensors only
    # contended (the model's fixture took minutes where OMP_NUM_THREADS was unset, seconds with one thread)
    torch.set_num_threads(1)
    out = {}
    worker(rank, f"{folder}/store", out)
    (Path(folder) / f"out{rank}.pickle").write_bytes(pickle.dumps(out))


def load_script(name: str):
    """scripts/<name>.py as a module: scripts/ is not a package."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"attnlab_script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
