import ema_mixer  # noqa: F401  (examples/: a mixer added from one file, so every registry test covers it)
import pytest
import torch


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
