#!/usr/bin/env bash
# Run on the GPU machine, from the repository: attnlab from this working tree on the machine's own PyTorch,
# plus the wheels scripts/gpu-wheels.sh prepared (installed aside, nothing of the system changed); then
# `attnlab doctor`. Usage: scripts/gpu-doctor.sh [output folder, default runs/doctor] [doctor options, e.g. --dry-run]
# NO_FLA=1 leaves fla's wheel out: every mixer then runs its torch form, and the doctor ends in minutes (fla's first
# use compiles and tunes its Triton kernels, which took more than 7 minutes on an H200 with Triton 3.6).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/doctor}
shift || true
site=$(mktemp -d)
shopt -s nullglob
wheels=()
for wheel in .whl/*.whl; do
    [[ -n "${NO_FLA:-}" && $wheel == */fla_core-* ]] || wheels+=("$wheel")
done
if (( ${#wheels[@]} )); then
    python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "${wheels[@]}"
fi
export PYTHONPATH="$PWD/src:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -m attnlab.cli doctor --out "$out" "$@" 2>&1 | tee "$out.log"
