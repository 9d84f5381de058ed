"""`attnlab doctor`: what works on this machine's GPU, and how fast.

1. Every mixer's forward, input gradient and token-by-token decode on the device, in fp32 and under bf16
   autocast, against the same mixer in fp64 on the CPU (relative errors, with pass/fail limits).
2. Every mixer's backends and the one backend=auto takes, and why (on this GPU; without one, on a Hopper
   GPU with the fla and Triton installed here).
3. Every mixer's forward+backward time against SDPA softmax, and each fused backend (fla, Triton,
   FlexAttention) against the torch form (outputs compared, then timed side by side).
4. The demo model trained for a few hundred steps on the device; on a GPU, also compiled (what compiling costs a
   run before its steps), and in 1, 4 and 16 processes at once (how runs packed on one GPU share it).
Without a CUDA GPU it says so and runs the checks on the CPU, which keeps the command itself testable.
The results are printed as tables and written to doctor.json, section by section, so a run cut short
keeps what it measured; doctor_readme.py turns that file into the results README's account.
"""

from __future__ import annotations

import json
import os
import platform
import queue
import re
import tempfile
import time
from pathlib import Path

import torch

from ..bench.mixers import contenders
from ..bench.registry import SPEED_GOALS, VARIANTS
from ..errors import ConfigError, UserError
from ..mixers import build_mixer, list_mixers, mixer_class
from ..ops import fla
from ..timing import round_robin
from .device_times import DEMO_BATCH, DEMO_LENGTH
from .doctor_readme import value_text

# relative error limits against fp64: fp32 kernels differ in summation order only; bf16 rounds the
# projections (the states stay fp32), as the CPU tests allow
LIMITS = {"fp32": 1e-4, "bf16": 3e-2}
# how many demo models train at once in the packing section: on a GPU, and in a dry run
PACKING = {"gpu": (1, 4, 16), "dry run": (1, 2)}
# the timed sections' sizes: on a GPU, and in a dry run (the same code paths at sizes a CPU runs in seconds; its
# times are not judged, so no warm-up call before the timed one)
SIZES = {"gpu": {"batch": 8, "lengths": (2048, 8192), "d_model": 512, "n_heads": 8, "repeats": 5, "warmup": True},
         "dry run": {"batch": 1, "lengths": (8, 16), "d_model": 32, "n_heads": 2, "repeats": 1, "warmup": False}}


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.double().cpu() - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def environment(device: torch.device) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "device": str(device),
            "cuda": device.type == "cuda"}
    if device.type == "cuda":
        info.update(gpu=torch.cuda.get_device_name(device), cuda_version=torch.version.cuda)
    for package in ("triton", "fla"):
        try:
            info[package] = __import__(package).__version__
        except Exception:  # absent, or failing to import on this machine
            info[package] = None
    info["triton_for_torch"] = triton_for_torch()
    return info


def triton_for_torch() -> str | None:
    """The Triton version this torch was built against (its wheel pins it exactly: `triton==3.6.0`), or None
    where it pins none (the CPU builds)."""
    from importlib import metadata

    try:
        requirements = metadata.requires("torch") or []
    except metadata.PackageNotFoundError:  # torch from a source tree
        return None
    for requirement in requirements:
        pinned = re.match(r"(?:pytorch-)?triton\s*==\s*([^\s;,]+)", requirement)
        if pinned:
            return pinned.group(1)
    return None


def pairing(env: dict) -> str:
    """One line: torch -> the Triton it was built for -> the Triton installed, and whether they match (a
    Triton installed over torch's own compiles kernels torch and fla were not tested with)."""
    wanted, found = env["triton_for_torch"], env["triton"]
    line = f"torch {env['torch']} -> Triton {found or 'not installed'}"
    if wanted is None:
        return line + " (this torch pins no Triton)"
    if found is None or found.split("+")[0] != wanted:
        return line + f": NOT the Triton {wanted} this torch was built for (pip install triton=={wanted})"
    return line + " (the one this torch was built for)"


def check_mixer(name: str, options: dict, device: torch.device, d_model: int = 64, n_heads: int = 4,
                seq_len: int = 16) -> dict:
    """Relative errors of the output, the input's gradient and a prefill-then-decode on `device` in fp32
    and bf16, against the fp64 forward on the CPU."""
    torch.manual_seed(0)
    reference = build_mixer(name, d_model=d_model, n_heads=n_heads, **options).double()
    x = torch.randn(2, seq_len, d_model, dtype=torch.float64, requires_grad=True)
    y_ref, _ = reference(x)
    weights = torch.randn_like(y_ref)
    (grad_ref,) = torch.autograd.grad((y_ref * weights).sum(), x)

    mixer = build_mixer(name, d_model=d_model, n_heads=n_heads, **options).to(device)
    mixer.load_state_dict(reference.state_dict())
    result = {}
    for precision in ("fp32", "bf16"):
        x_dev = x.detach().float().to(device).requires_grad_()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            y, _ = mixer(x_dev)
            (grad,) = torch.autograd.grad((y.float() * weights.float().to(device)).sum(), x_dev)
            with torch.no_grad():
                split = seq_len // 2
                out, state = mixer(x_dev[:, :split])
                steps = [out]
                for t in range(split, seq_len):
                    out, state = mixer(x_dev[:, t : t + 1], state)
                    steps.append(out)
        errors = {"forward": relative_error(y, y_ref.detach()), "gradient": relative_error(grad, grad_ref),
                  "decode": relative_error(torch.cat(steps, 1), y_ref.detach())}
        result[precision] = {**errors, "ok": all(e < LIMITS[precision] for e in errors.values())}
    return result


def check_mixers(device: torch.device, log=print, saved=lambda row: None) -> dict:
    """check_mixer for every mixer, in true fp32: TensorFloat-32 products, which PyTorch allows in
    convolutions by default, would cost ~1e-3 of relative error on their own. saved(results so far) is called
    after each mixer, so that a run cut short keeps every row it measured."""
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return _check_mixers(device, log, saved)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32


def _check_mixers(device: torch.device, log, saved) -> dict:
    log(f"\ncorrectness on {device} against fp64 on the CPU (relative errors; limits fp32 {LIMITS['fp32']:g}, "
        f"bf16 {LIMITS['bf16']:g})")
    log(f"{'mixer':<34} {'fp32 fwd':>9} {'grad':>9} {'decode':>9} {'bf16 fwd':>9} {'grad':>9} {'decode':>9}  ok")
    results, warned = {}, False
    machine = fla.machine()
    for label, name, options in contenders():
        options = options or dict(mixer_class(name).deterministic)  # one answer to compare with fp64
        if not warned and device.type == "cuda" and _runs_fla(name, options, machine):
            warned = True
            log("(fla compiles and tunes its Triton kernels on first use, which can take many minutes; "
                "each row is written to doctor.json as it is measured)")
        try:
            row = check_mixer(name, options, device)
        except Exception as err:  # a failure to run on this device is the finding, not a crash of the doctor
            results[label] = {"error": f"{type(err).__name__}: {err}"}
            log(f"{label:<34} FAILED: {results[label]['error'][:200]}")
        else:
            results[label] = row
            cells = " ".join(f"{row[p][k]:>9.1e}" for p in ("fp32", "bf16") for k in ("forward", "gradient", "decode"))
            log(f"{label:<34} {cells}  {'yes' if row['fp32']['ok'] and row['bf16']['ok'] else 'NO'}")
        saved(results)
    return results


def _runs_fla(name: str, options: dict, machine: dict) -> bool:
    """Whether backend=auto runs this mixer on fla's kernels on a machine with these facts."""
    return build_mixer(name, d_model=16, n_heads=2, **options).route(torch.zeros(1, 2, 16), machine)[0] == "fla"


def time_mixers(device: torch.device, batch: int, seq_len: int, d_model: int, n_heads: int, repeats: int,
                warmup: bool = True, log=print) -> dict:
    """Forward+backward milliseconds of every mixer, side by side, and the ratio to SDPA softmax."""
    log(f"\nforward+backward on {device}: batch {batch}, T {seq_len}, d_model {d_model}, {n_heads} heads, "
        f"bf16 autocast, median of {repeats}")
    x = torch.randn(batch, seq_len, d_model, device=device, requires_grad=True)
    tasks = {}
    for label, name, options in contenders():
        torch.manual_seed(0)
        mixer = build_mixer(name, d_model=d_model, n_heads=n_heads, **options).to(device)

        def fwd_bwd(mixer=mixer):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                y, _ = mixer(x)
            y.float().sum().backward()

        try:
            fwd_bwd()
        except UserError as err:  # a mixer with an exact window refuses long contexts
            log(f"{label:<34} not run: {str(err).split(';')[0]}")
            continue
        tasks[label] = fwd_bwd
    seconds = round_robin(tasks, repeats, warmup)
    base = seconds.get("softmax")
    results = {}
    for label, s in seconds.items():
        results[label] = {"ms": 1e3 * s, "x_softmax": s / base if base else None}
        log(f"{label:<34} {1e3 * s:>9.2f} ms {s / base:>7.2f}x softmax" if base else f"{label:<34} {1e3 * s:>9.2f} ms")
    return results


def backend_routes(device: torch.device, log=print) -> dict:
    """{mixer: {backends, auto, why}}: the forms each registered mixer's sequences can run on and the one
    backend=auto takes, on this GPU, or without one on a Hopper GPU (H100/H200) with what is installed here."""
    cuda = device.type == "cuda"
    machine = fla.machine() if cuda else {**fla.machine(), "cuda": True, "hopper": True}
    where = torch.cuda.get_device_name(device) if cuda else "a Hopper GPU (H100/H200) with the packages installed here"
    log(f"\nbackends, and the one backend=auto takes on {where}")
    routes = {}
    for name in list_mixers():
        mixer = build_mixer(name, d_model=64, n_heads=4)
        backend, why = mixer.route(torch.zeros(1, 2, 64), machine)  # the facts decide, not x's device
        routes[name] = {"backends": list(mixer.backends), "auto": backend, "why": why}
        log(f"{name:<22} {', '.join(mixer.backends):<11} auto: {backend:<6} {why}")
    return routes


def fused_cases(device: torch.device) -> list[tuple[str, str, dict]]:
    """(label, mixer, options with a backend) for each contender's, and each untimed variant's, every backend but
    torch that applies to its options (a backend that does not is a ConfigError, and skipped) and runs on this
    device (FlexAttention trains on a GPU only)."""
    untimed = [(v.label, v.mixer, v.options) for v in VARIANTS if not v.timed]
    cases = []
    for label, name, options in [*contenders(), *untimed]:
        for backend in mixer_class(name).backends[1:]:
            if backend == "flex" and device.type != "cuda":
                continue
            try:
                build_mixer(name, d_model=16, n_heads=2, **options, backend=backend)
            except ConfigError:
                continue
            cases.append((f"{label}, {backend}", name, {**options, "backend": backend}))
    return cases


def compare_backends(device: torch.device, batch: int, seq_len: int, d_model: int, n_heads: int, repeats: int,
                     warmup: bool = True, log=print) -> dict:
    """Each fused backend (fla, Triton, FlexAttention) against the same weights with backend=torch: the largest
    relative difference of the outputs, then both timed side by side (forward+backward, bf16 autocast)."""
    log(f"\nfused backends against the torch forms on {device}: batch {batch}, T {seq_len}, d_model {d_model}")
    results = {}
    cases = fused_cases(device)
    if not cases:
        log("none runs here: the fused backends need a CUDA GPU (or Triton's interpreter, TRITON_INTERPRET=1) "
            "and their packages (see the backends above)")
    x = torch.randn(batch, seq_len, d_model, device=device, requires_grad=True)
    for label, name, options in cases:
        try:
            torch.manual_seed(0)
            forms = {"torch": build_mixer(name, d_model=d_model, n_heads=n_heads, **{**options, "backend": "torch"}),
                     "fused": build_mixer(name, d_model=d_model, n_heads=n_heads, **options)}
            forms = {form: mixer.to(device) for form, mixer in forms.items()}
            forms["fused"].load_state_dict(forms["torch"].state_dict())
            with torch.no_grad():
                difference = relative_error(forms["fused"](x)[0], forms["torch"](x)[0].double().cpu())

            def fwd_bwd(mixer):
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    y, _ = mixer(x)
                y.float().sum().backward()

            seconds = round_robin({form: (lambda m=m: fwd_bwd(m)) for form, m in forms.items()}, repeats, warmup)
        except Exception as err:
            results[label] = {"error": f"{type(err).__name__}: {err}"}
            log(f"{label:<44} FAILED: {results[label]['error'][:200]}")
            continue
        results[label] = {"difference": difference, "torch_ms": 1e3 * seconds["torch"],
                          "fused_ms": 1e3 * seconds["fused"], "speedup": seconds["torch"] / seconds["fused"]}
        log(f"{label:<44} difference {difference:.1e}   torch {1e3 * seconds['torch']:8.2f} ms   "
            f"fused {1e3 * seconds['fused']:8.2f} ms   {seconds['torch'] / seconds['fused']:.2f}x")
    return results


def train_demo(device: torch.device, steps: int, log=print, compile: bool = False) -> dict:
    """The demo preset (a softmax decoder on character-level Shakespeare) trained for `steps` steps, its blocks
    compiled with `compile`; its checkpoints go to a temporary folder."""
    from ..train import train

    log(f"\nthe demo model on {device}{' under train.compile' if compile else ''}: {steps} steps")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as runs:
        cfg = _demo_config(device, steps, runs, compile)
        summary = train(cfg, resume=None, progress=False, log=log)
    result = {"steps": summary["steps"], "train_loss": summary.get("train_loss"), "val_loss": summary["val_loss"],
              "tokens_per_s": summary.get("tokens_per_s"), "seconds": time.perf_counter() - start}
    log(f"val loss {result['val_loss']:.3f} after {result['steps']} steps; {result['tokens_per_s'] or 0:,.0f} "
        f"tokens/s; {result['seconds']:.0f} s")
    return result


def _demo_config(device: torch.device, steps: int, runs: str, compile: bool = False):
    """The demo preset for `steps` steps on `device`, its checkpoints in `runs`, validated once at the end."""
    from ..config import load_config

    return load_config("demo", [f"train.steps={steps}", f"train.device={device}", f"out_dir={runs}",
                                "name=doctor-demo", f"train.eval_every={steps}", f"train.ckpt_every={steps}",
                                f"train.warmup_steps={max(1, steps // 10)}", f"train.compile={str(compile).lower()}"])


def compile_demo(device: torch.device, steps: int, eager: dict, log=print) -> dict:
    """The demo model trained again with its blocks compiled, as the converged tiers train theirs: its record,
    with its compile warm-up against `eager`, the same model's record uncompiled (warmup_seconds)."""
    compiled = train_demo(device, steps, log, compile=True)
    compiled["warmup_s"] = warmup_seconds(eager, compiled)
    log(f"compile warm-up: {compiled['warmup_s']:.1f} s; a steady step {_step_ms(compiled):.2f} ms compiled, "
        f"{_step_ms(eager):.2f} ms eager")
    return compiled


def warmup_seconds(eager: dict, compiled: dict) -> float:
    """What compiling cost a run before its steps: the compiled run's seconds besides its steps (at the speed of
    its last logged ones), less the same of the eager run (the set-up and evaluation both pay)."""
    def besides_steps(record: dict) -> float:
        return record["seconds"] - record["steps"] * _step_ms(record) / 1e3

    return max(0.0, besides_steps(compiled) - besides_steps(eager))


def _step_ms(record: dict) -> float:
    """A demo training record's steady step, from the tokens/s of its last logged steps."""
    return 1e3 * DEMO_BATCH * DEMO_LENGTH / record["tokens_per_s"]


def pack_demo(device: torch.device, copies: tuple[int, ...], steps: int, log=print) -> dict:
    """The demo model trained in k processes at once, for each k in copies: their summed tokens/s (each process's
    median over the second half of its training, when all of them run), against one alone. A small model's step
    leaves a GPU idle between kernel launches; this measures how much of that k runs on one device take back."""
    log(f"\nthe demo model in k processes at once on {device}, {steps} steps each: summed tokens/s")
    results = {}
    for k in copies:
        total = sum(_train_copies(device, k, steps))
        one = results["1"]["tokens_per_s"] if "1" in results else total
        results[str(k)] = {"tokens_per_s": total, "x_one": total / one}
        log(f"{k:>3} at once: {total:>12,.0f} tokens/s in all, {total / k:>10,.0f} each, {total / one:.2f}x one alone")
    return results


def _train_copies(device: torch.device, copies: int, steps: int) -> list[float]:
    """Each copy's tokens/s: `copies` processes (started fresh; on a CPU each with its share of the cores) that
    begin training together."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    barrier, answers = context.Barrier(copies), context.Queue()
    threads = max(1, (os.cpu_count() or 1) // copies)
    processes = [context.Process(target=_train_copy, args=(str(device), steps, threads, barrier, answers))
                 for _ in range(copies)]
    for process in processes:
        process.start()
    rates = []
    try:
        for _ in processes:
            kind, value = answers.get(timeout=PACK_TIMEOUT)
            if kind == "error":
                raise RuntimeError(value)
            rates.append(value)
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
    return rates


PACK_TIMEOUT = 900  # seconds a packed copy may take before the section gives up


def _train_copy(device: str, steps: int, threads: int, barrier, answers) -> None:
    import statistics

    from ..train import train

    torch.set_num_threads(threads)
    try:
        with tempfile.TemporaryDirectory() as runs:
            cfg = _demo_config(torch.device(device), steps, runs)
            barrier.wait(timeout=PACK_TIMEOUT)
            train(cfg, resume=None, progress=False, log=lambda *_: None)
            lines = (Path(runs) / cfg.name / "metrics.jsonl").read_text().splitlines()
            rates = [record["tokens_per_s"] for record in map(json.loads, lines) if "tokens_per_s" in record]
        answers.put(("done", statistics.median(rates[len(rates) // 2:])))
    except Exception as err:  # the section says so, and the copies still waiting do not wait for this one
        barrier.abort()
        answers.put(("error", f"{type(err).__name__}: {err}"))


def run_doctor(out: str | Path = "runs/doctor", train_steps: int = 200, dry_run: bool = False, log=print) -> dict:
    """Every check in turn on the GPU if there is one, else on the CPU; doctor.json in `out`. dry_run: the
    timed sections too, at tiny sizes and unjudged, wherever this runs (a CPU test of the GPU run's code)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        log("no CUDA GPU found: running the checks on the CPU"
            + (" (a dry run: the timed sections at tiny sizes)" if dry_run else
               " (GPU timings and the fused backends are skipped)"))
    report = {"environment": environment(device)}
    log(json.dumps(report["environment"]))
    log(pairing(report["environment"]))
    report["backends"] = backend_routes(device, log)

    def save():  # after every section, so that a run cut short keeps what it measured
        (out / "doctor.json").write_text(json.dumps(report, indent=1))

    def save_rows(rows):
        report["mixers"] = rows
        save()

    report["mixers"] = check_mixers(device, log, save_rows)
    report["failed"] = [m for m, r in report["mixers"].items()
                        if "error" in r or not (r["fp32"]["ok"] and r["bf16"]["ok"])]
    save()
    if train_steps > 0:
        copies = PACKING["dry run" if dry_run else "gpu"] if cuda or dry_run else ()
        _train_sections(report, device, train_steps, copies, log, save)
    if cuda or dry_run:  # last, the slowest to start: fla compiles and tunes its kernels on first use
        _timed_sections(report, device, dict(SIZES["dry run" if dry_run else "gpu"]), log, save)
    report["goals"] = doctor_goals(report, judged=cuda and not dry_run)
    save()
    _log_verdicts(report, out / "doctor.json", log)
    return report


def _train_sections(report: dict, device: torch.device, steps: int, copies: tuple[int, ...], log, save) -> None:
    """The demo model trained alone; where `copies` are given (a GPU, a dry run), compiled, and in each count of
    `copies` of processes at once."""
    report["train"] = train_demo(device, steps, log)
    save()
    if copies:
        # Dynamo and Inductor raise errors of their own: any is what compiling does on this machine, the finding
        _section(report, "compile", lambda: compile_demo(device, steps, report["train"], log), Exception, log, save)
        _section(report, "packing", lambda: pack_demo(device, copies, steps, log),
                 (RuntimeError, OSError, queue.Empty), log, save)


def _section(report: dict, name: str, measure, errors, log, save) -> None:
    """report[name] = measure(), or its error where it raises one of `errors`: a failure is the finding, not a
    crash of the doctor."""
    try:
        report[name] = measure()
    except errors as err:
        report[name] = {"error": f"{type(err).__name__}: {err}"}
        log(f"{name} FAILED: {report[name]['error'][:200]}")
    save()


def _timed_sections(report: dict, device: torch.device, sizes: dict, log, save) -> None:
    """At every length of `sizes`: every mixer timed against softmax, then the fused backends against torch's."""
    lengths = sizes.pop("lengths")
    report["speed"], report["fused"] = {}, {}
    for seq_len in lengths:
        report["speed"][str(seq_len)] = time_mixers(device, seq_len=seq_len, log=log, **sizes)
        save()
        report["fused"][str(seq_len)] = compare_backends(device, seq_len=seq_len, log=log, **sizes)
        save()


def _log_verdicts(report: dict, written: Path, log) -> None:
    """The goals, one a line, and how many mixers are within the limits."""
    log("\ngoals (bf16, B 8, d_model 512 on an H100/H200):")
    for goal in report["goals"]:
        log(f"  {goal['goal']:<64} {value_text(goal['value']):>8}  {goal['bar']:<7} {goal['verdict']}")
    failed, mixers = report["failed"], report["mixers"]
    log(f"\n{len(mixers) - len(failed)} of {len(mixers)} mixers within limits"
        + (f"; outside: {', '.join(failed)}" if failed else "") + f". Written to {written}")


def doctor_goals(report: dict, judged: bool = True) -> list[dict]:
    """SPEED_GOALS and the fused backends' agreement with the torch forms (bf16 limit), each met, NOT MET, not
    measured (this run has no such number: no GPU, a mixer that failed) or not judged (a dry run)."""
    rows, timed_lengths = [], list(report.get("speed", {}))  # a dry run's lengths stand in for the GPU's in turn
    gpu_lengths = SIZES["gpu"]["lengths"]
    for goal in SPEED_GOALS:
        at = gpu_lengths.index(goal.length) if goal.length in gpu_lengths else len(timed_lengths)  # a length not timed
        timed = report["speed"][timed_lengths[at]].get(goal.label) if at < len(timed_lengths) else None
        rows.append((f"{goal.label} / softmax fwd+bwd at T={goal.length} (x)", timed and timed["x_softmax"],
                     goal.relation, goal.bar))
    for seq_len, compared in report.get("fused", {}).items():
        for label, row in compared.items():
            rows.append((f"{label} vs torch form at T={seq_len} (relative difference)", row.get("difference"),
                         "<=", LIMITS["bf16"]))
    goals = []
    for goal, value, relation, bar in rows:
        met = None if value is None or not judged else (value <= bar if relation == "<=" else value < bar)
        verdict = ("not measured" if value is None else "not judged" if not judged else "met" if met else "NOT MET")
        goals.append({"goal": goal, "value": value, "bar": f"{relation} {bar:g}", "met": met, "verdict": verdict})
    return goals
