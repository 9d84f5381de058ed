#!/usr/bin/env bash
# Run on the GPU machine, from the repository: `attnlab doctor` on the machine's own PyTorch (scripts/gpu-site.sh).
# Usage: scripts/gpu-doctor.sh [output folder, default runs/doctor] [doctor options, e.g. --dry-run]
# NO_FLA=1 leaves fla's wheel out, and the doctor ends in minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/doctor}
shift || true
source scripts/gpu-site.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -m attnlab.cli doctor --out "$out" "$@" 2>&1 | tee "$out.log"
