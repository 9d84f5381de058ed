#!/usr/bin/env bash
# On one GPU, in about 8 minutes, the runs that would settle the open headlines at convergence, side by side:
# - interdomain: the cube's IA / S4D-only / softmax x 3 seeds with a cap their patience can reach (cube-patient,
#   and its extrapolation on the same models), at the rates the CPU's sweep chose;
# - coupled-qk: 7 more paired seeds of softmax and coupled-euler on the language model (10 in all);
# - ccq: S-NIAH pass-key trained at 256 tokens, tested to 4x, for softmax (the control), GLA and CCQ-GLA.
# Each starts from the committed records of its tier (the sweeps, the CPU's seeds), copied into the output folder,
# and writes its own results there: <out>/<suite>-converged/, with MACHINE.txt naming the device. Every record
# finished by the deadline is kept; a second call continues from the checkpoints.
# Usage: scripts/gpu-science.sh [--dry-run] [output folder, default runs/gpu-science]
#   --dry-run: prints each suite's plan with its times predicted on the H200 of results/doctor/doctor.json, and
#   fails where one would take longer than the deadline. PYTHON (default python3) runs attnlab; DEADLINE (default
#   480) is in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
dry=()
if [[ ${1:-} == --dry-run ]]; then dry=(--dry-run --predict-on results/doctor/doctor.json); shift; fi
out=${1:-runs/gpu-science}
deadline=${DEADLINE:-480}
python=${PYTHON:-python3}
if (( ${#dry[@]} )); then
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
else
    NO_FLA=1 source scripts/gpu-site.sh
fi
mkdir -p "$out"
# suite, workers (runs at once on the GPU), then the reproduce options
plans=(
    "interdomain 7 --only cube-patient extrapolation-patient"
    "ccq 7 --only niah-256 --arms softmax gla ccq-gla"
    "coupled-qk 2 --only lm --arms softmax coupled-euler --seeds 10"
)
for plan in "${plans[@]}"; do
    read -r suite _ _ <<< "$plan"
    mkdir -p "$out/$suite-converged"
    [[ -e $out/$suite-converged/results.json ]] || cp "results/$suite-converged/results.json" "$out/$suite-converged/"
done
run() {  # suite workers options...: one suite's plan on the GPU (or, dry, printed)
    local suite=$1 workers=$2
    shift 2
    local command=("$python" -m attnlab.cli reproduce "$suite" --tier converged --out "$out" --jobs "$workers" "$@")
    if (( ${#dry[@]} )); then
        "${command[@]}" "${dry[@]}"
    else
        timeout --signal=INT --kill-after=60 "$deadline" "${command[@]}" --runs-per-gpu "$workers" \
            --runs-dir "$out/runs" > "$out/$suite.log" 2>&1 || echo "$suite: stopped ($?); see $out/$suite.log"
    fi
}
if (( ${#dry[@]} )); then
    printed=$(for plan in "${plans[@]}"; do run $plan; done)
    echo "$printed"
    longest=$(grep -o 'from start to end: about [^(]*(\([0-9]*\) s' <<< "$printed" | grep -o '[0-9]* s$' | sort -n |
              tail -1 | tr -dc 0-9)
    workers=0
    for plan in "${plans[@]}"; do read -r _ n _ <<< "$plan"; workers=$((workers + n)); done
    echo "the longest suite: about ${longest:-?} s of a ${deadline} s deadline, the suites side by side: $workers runs" \
         "at once on the GPU (the H200 machine has 16 CPU cores)"
    [[ -n $longest && $longest -le $deadline ]]
    exit
fi
{ date -u +%FT%TZ; git rev-parse HEAD 2>/dev/null || true; nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader || true; "$python" -c 'import torch; print("torch", torch.__version__)'; } > "$out/MACHINE.txt"
for plan in "${plans[@]}"; do run $plan & done
wait
tail -n 3 "$out"/*.log
