"""Where a suite's jobs run: in this process, in worker processes on this machine, or on a Ray cluster.

An executor takes `job.Work` (submit, while `free()`), and hands back (key, record) pairs as jobs finish
(`next_done`); the driver alone writes them to results.json. A job's record does not depend on where it ran: it
trains from its own seed, and a job that is stopped (a worker killed, the driver interrupted) continues from
its last checkpoint when it runs again, and ends as if never stopped.
- `InProcess`: one job at a time, here (the default).
- `LocalWorkers(n)`: n processes on this machine. With CUDA GPUs each worker holds one GPU or a share of one
  (`runs_per_gpu` small runs packed on a GPU); on a CPU each gets its share of the cores. A worker that dies
  (killed, out of memory) has its job started again, which continues from its checkpoint; a worker whose driver
  dies ends with it, sending nothing, and its job continues from its checkpoint when the suite runs again.
- `RayWorkers`: each job a Ray task asking for its share of a GPU (or its CPUs), on the cluster RAY_ADDRESS names
  or a local one; Ray starts a task again where its worker died.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from multiprocessing import connection, get_context
from typing import TYPE_CHECKING

from .. import plugins
from ..errors import UserError

if TYPE_CHECKING:  # torch and the job's code load in a worker only once it holds its GPU (work_in_process)
    from .job import Work
    from .store import Record

RETRIES = 2  # how many times a job whose worker died is started again (each time from its last checkpoint)
PR_SET_PDEATHSIG = 1  # linux/prctl.h: the signal a process gets when its parent ends
RAY_EXTRA = "pip install 'attnlab[ray]'"


class JobFailed(UserError):
    """A job raised in its worker: the suite stops there (its finished records are kept)."""


class InProcess:
    """Each job in this process, one after another."""

    def __init__(self, log=print):
        self.log, self.queue = log, deque()

    def free(self, work: Work) -> bool:
        return not self.queue

    def describe(self) -> None:
        return None  # the driver's own process: its threads are the results' meta

    def submit(self, work: Work) -> None:
        self.queue.append(work)

    def next_done(self):
        work = self.queue.popleft()
        return work.key, _execute(work, self.log)

    def close(self) -> None:
        self.queue.clear()


def slots(jobs: int, gpus: int, runs_per_gpu: int | None, cpus: int) -> list[dict]:
    """What each of `jobs` workers holds: {"gpu": index or None, "threads": n}. With GPUs, worker i takes GPU
    (i // runs_per_gpu) mod gpus; without, every worker gets an equal share of the cpus (at least one thread)."""
    if gpus:
        per_gpu = runs_per_gpu or max(1, -(-jobs // gpus))  # the fewest runs a GPU that holds all n at once
        return [{"gpu": (i // per_gpu) % gpus, "threads": max(1, cpus // jobs)} for i in range(jobs)]
    return [{"gpu": None, "threads": max(1, cpus // jobs)} for _ in range(jobs)]


class LocalWorkers:
    """n worker processes on this machine, a process per job (started fresh: nothing leaks from one job to the
    next, and a worker that dies takes only its own job with it)."""

    def __init__(self, jobs: int, runs_per_gpu: int | None = None, gpus: int | None = None, imports=(),
                 log=print, retries: int = RETRIES):
        if gpus is None:
            import torch  # the driver's process; its workers import torch once they hold their GPU

            gpus = torch.cuda.device_count()
        self.cpus = os.cpu_count() or 1
        self.slots = slots(jobs, gpus, runs_per_gpu, self.cpus)
        self.imports, self.log, self.retries = list(imports), log, retries
        self.context = get_context("spawn")  # CUDA cannot be forked; each worker starts its own interpreter
        self.running: dict[int, tuple] = {}  # slot -> (process, receiving end, work, tries)

    def describe(self) -> str:
        gpus = sorted({slot["gpu"] for slot in self.slots if slot["gpu"] is not None})
        where = f"on {len(gpus)} GPU(s)" if gpus else f"of {self.slots[0]['threads']} thread(s) each"
        return f"{len(self.slots)} local worker processes {where}"

    def free(self, work: Work) -> bool:
        """Room for the job: a free slot, or for a job of several ranks the whole machine (every GPU, or its
        share of the cores for each rank), which it then holds alone."""
        if work.ranks > 1 or any(running.ranks > 1 for _, _, running, _ in self.running.values()):
            return not self.running
        return len(self.running) < len(self.slots)

    def submit(self, work: Work, tries: int = 0) -> None:
        slot = next(i for i in range(len(self.slots)) if i not in self.running)
        held = self.slots[slot] if work.ranks == 1 else {"gpu": None, "threads": max(1, self.cpus // work.ranks)}
        receiver, sender = self.context.Pipe(duplex=False)
        process = self.context.Process(target=work_in_process, daemon=True,
                                       args=(pickle.dumps(work), held, self.imports, sender, os.getpid()))
        process.start()
        sender.close()  # the worker holds the only sending end: a dead worker closes the pipe
        self.running[slot] = (process, receiver, work, tries)

    def next_done(self):
        while True:
            ready = connection.wait([receiver for _, receiver, _, _ in self.running.values()])
            slot = next(s for s, (_, receiver, _, _) in self.running.items() if receiver in ready)
            process, receiver, work, tries = self.running.pop(slot)
            try:
                outcome = receiver.recv()
            except EOFError:  # the worker died before it answered
                outcome = None
            process.join()
            receiver.close()
            if outcome is None:
                if tries >= self.retries:
                    raise JobFailed(f"{work.key}: its worker died {tries + 1} times (exit code {process.exitcode}); "
                                    "its checkpoints are kept, and reproduce continues it from the last")
                self.log(f"    {work.key}: its worker died (exit code {process.exitcode}); starting it again")
                self.submit(work, tries + 1)
                continue
            kind, value = outcome
            if kind == "error":
                raise JobFailed(f"{work.key} failed: {value}")
            return work.key, value

    def close(self) -> None:
        for process, receiver, _, _ in self.running.values():
            process.terminate()
            process.join()
            receiver.close()
        self.running.clear()


def work_in_process(payload: bytes, slot: dict, imports: list[str], sender, driver: int) -> None:
    """A worker's life: hold its GPU (or its threads), import what the driver imported, run one job, send back
    ("done", record) or ("error", one line); it ends with its driver (the process `driver`). Its log lines are
    prefixed with the job's key."""
    _exit_with_driver(driver)
    if slot["gpu"] is not None:  # before torch starts CUDA: the worker sees only its own GPU, as cuda:0
        os.environ["CUDA_VISIBLE_DEVICES"] = str(slot["gpu"])
    _hold_threads(slot["threads"])
    try:
        work = _unpickled(payload, imports)
        record = _execute(work, log=lambda line: print(f"[{work.key}] {line.strip()}", flush=True))
        sender.send(("done", record))
    except Exception as err:  # the driver stops the suite with this line
        sender.send(("error", _said(err)))
    except KeyboardInterrupt:  # Ctrl-C reaches the driver's whole process group: the driver stops the suite, and
        pass  # the job continues from its checkpoint (train wrote one) next time; no traceback of it here
    finally:
        sender.close()


def _execute(work: Work, log) -> Record:
    """The job's record (job.execute), its code imported when a job runs: a worker pins its GPU first."""
    from .job import execute

    return execute(work, log)


def _hold_threads(threads: int) -> None:
    import torch  # after CUDA_VISIBLE_DEVICES is set: the worker sees only its own GPU

    torch.set_num_threads(threads)


def _said(err: Exception) -> str:
    """A job's error in one line for the driver; a bug's traceback (not a mistake's) printed in the worker's log."""
    if not isinstance(err, UserError):
        traceback.print_exc()
    return f"{type(err).__name__}: {err}"


def _exit_with_driver(driver: int) -> None:
    """End this worker when its driver dies (killed, it cannot stop its workers), sending nothing: an orphan would
    go on writing the run folder that the driver, started again, gives the same job, and its record would be
    lost. The job continues from its last checkpoint when the suite runs again. On Linux the kernel kills it
    (PR_SET_PDEATHSIG) whatever it is doing; elsewhere a thread watches for its parent to change, which it sees
    only while the job lets the interpreter's threads take turns (a long call that holds the GIL does not)."""
    if _killed_with_parent():
        if os.getppid() != driver:  # the driver died before the kernel was asked: no signal will come
            os._exit(1)
        return

    def watch():
        while os.getppid() == driver:
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _killed_with_parent() -> bool:
    """Asks Linux to SIGKILL this process when its parent ends (prctl PR_SET_PDEATHSIG); whether it could."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0


def _unpickled(payload: bytes, imports: list[str]) -> Work:
    """The job, once the modules that registered its suite, mixers and metrics are imported here too, as the
    driver's command imported them: the installed papers (attnlab's own among them), the installed plugins and
    the driver's --import list."""
    plugins.import_papers()
    plugins.import_installed()
    for spec in imports:
        plugins.import_plugin(spec, "the driver's --import")
    return pickle.loads(payload)


class RayWorkers:
    """Each job a Ray task on the cluster RAY_ADDRESS names (or a local one): `gpu_share` of a GPU (1 / runs per
    GPU) where the cluster has GPUs, else `cpus` CPUs. Ray starts a task again where its worker died."""

    def __init__(self, jobs: int | None = None, runs_per_gpu: int | None = None, imports=(), log=print,
                 retries: int = RETRIES, init: dict | None = None):
        ray = require_ray()
        if not ray.is_initialized():
            ray.init(**(init or {}))
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        cpus = int(resources.get("CPU", 1))
        self.limit = jobs or (gpus * (runs_per_gpu or 1) if gpus else cpus)
        self.gpus, self.share = bool(gpus), (1 / (runs_per_gpu or 1) if gpus else max(1, cpus // self.limit))
        self.task = ray.remote(max_retries=retries)(work_in_ray)
        self.ray, self.imports, self.log = ray, list(imports), log
        self.running: dict = {}  # object ref -> work

    def describe(self) -> str:
        resources = self.ray.cluster_resources()
        return (f"Ray tasks, at most {self.limit} at once, on a cluster of {resources.get('CPU', 0):g} CPUs and "
                f"{resources.get('GPU', 0):g} GPUs")

    def free(self, work: Work) -> bool:
        return len(self.running) < self.limit

    def submit(self, work: Work) -> None:
        """A task asking for its share of a GPU (or of the CPUs); a job of several ranks asks for that many GPUs
        (CPUs), which Ray finds on one node."""
        if self.gpus:
            resources = {"num_gpus": work.ranks if work.ranks > 1 else self.share, "num_cpus": work.ranks}
        else:
            resources = {"num_cpus": max(work.ranks, self.share)}
        threads = max(1, int(resources["num_cpus"]) // work.ranks)
        ref = self.task.options(**resources).remote(pickle.dumps(work), threads, self.imports)
        self.running[ref] = work

    def next_done(self):
        (ref,), _ = self.ray.wait(list(self.running), num_returns=1)
        work = self.running.pop(ref)
        try:
            kind, value = self.ray.get(ref)
        except self.ray.exceptions.RayError as err:  # retried and died again, or the cluster went away
            raise JobFailed(f"{work.key}: its Ray task failed ({type(err).__name__}); its checkpoints are kept, "
                            "and reproduce continues it from the last") from None
        if kind == "error":
            raise JobFailed(f"{work.key} failed: {value}")
        return work.key, value

    def close(self) -> None:
        for ref in self.running:
            self.ray.cancel(ref, force=True)
        self.running.clear()


def work_in_ray(payload: bytes, threads: int, imports: list[str]):
    """A job in a Ray worker: its threads, the driver's imports, the record (or the error, in one line)."""
    _hold_threads(int(threads))
    work = _unpickled(payload, imports)
    try:
        return "done", _execute(work, log=lambda line: print(f"[{work.key}] {line.strip()}", flush=True))
    except Exception as err:
        return "error", _said(err)


def connect_ray(jobs: int | None, runs_per_gpu: int | None, imports) -> RayWorkers:
    """RayWorkers on the cluster RAY_ADDRESS names (a local one without it), or one line saying why not."""
    ray = require_ray()
    address = os.environ.get("RAY_ADDRESS")
    if address and not reachable(address):  # Ray itself would retry for minutes before it says so
        raise UserError(f"RAY_ADDRESS={address} cannot be reached (nothing answers there); start the cluster (ray "
                        "start --head) or unset RAY_ADDRESS to start a local one")
    try:
        ray.init(address=address or None, log_to_driver=True)
    except (ConnectionError, RuntimeError, TimeoutError) as err:
        raise UserError(f"RAY_ADDRESS={address} cannot be reached ({str(err).splitlines()[0][:160]}); start the "
                        "cluster (ray start --head) or unset RAY_ADDRESS to start a local one") from None
    if runs_per_gpu and not ray.cluster_resources().get("GPU"):
        ray.shutdown()
        raise UserError("--runs-per-gpu packs runs on GPUs, and the Ray cluster has none; leave it out")
    return RayWorkers(jobs, runs_per_gpu, imports)


def reachable(address: str, seconds: float = 5.0) -> bool:
    """Whether something listens at a Ray address ("host:port" or "ray://host:port"; "auto" and "local" are
    Ray's own words for a cluster on this machine, left to Ray)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return True
    try:
        socket.create_connection((host, int(port)), timeout=seconds).close()
    except OSError:
        return False
    return True


def require_ray():
    """Ray, or one line naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise UserError(f"--executor ray needs Ray, which is not installed; {RAY_EXTRA}") from None
    return ray
