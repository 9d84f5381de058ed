import importlib.util

import ema_mixer  # noqa: F401  (examples/: a mixer added from one file, so every registry test covers it)
import pytest
import torch
from hypothesis import HealthCheck, settings

import attnlab.papers  # noqa: F401  (the papers: their presets load by name, as on the command line)
from helpers import start_triton_worker, stop_triton_workers

# Hypothesis's too_slow health check and its deadline time the machine (a loaded CI runner draws examples slowly),
# not the code under test: off for every property test
settings.register_profile("any-load", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("any-load")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def text_file(tmp_path):
    """A small UTF-8 corpus on disk: enough for a few training windows."""
    lines = [f"Line {i}: the quick brown fox jumps over the lazy dog, {i % 7} times.\n" for i in range(400)]
    path = tmp_path / "corpus.txt"
    path.write_text("".join(lines), encoding="utf-8")
    return path


def pytest_collection_finish(session):
    """Start the Triton-interpreter workers of the collected modules that read one (their TRITON_CHECKS) at once:
    each is a minute of one thread, which then runs beside the tests collected before its module's."""
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("fla") is None:
        return  # their tests skip, naming what is missing
    for module in dict.fromkeys(item.module for item in session.items if getattr(item, "module", None)):
        if checks := getattr(module, "TRITON_CHECKS", None):
            start_triton_worker(checks)


def pytest_sessionfinish(session):
    stop_triton_workers()
