#!/usr/bin/env bash
# Run on the GPU machine, from the repository: attnlab from this working tree on the machine's own PyTorch,
# plus the wheels scripts/gpu-wheels.sh prepared (installed aside, nothing of the system changed); then
# `attnlab doctor`. Usage: scripts/gpu-doctor.sh [output folder, default runs/doctor] [doctor options, e.g. --dry-run]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/doctor}
shift || true
site=$(mktemp -d)
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$site" .whl/*.whl
fi
export PYTHONPATH="$PWD/src:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -m attnlab.cli doctor --out "$out" "$@" 2>&1 | tee "$out.log"
