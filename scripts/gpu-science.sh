#!/usr/bin/env bash
# On one GPU, three suites' plans side by side, each continuing the committed records of its converged tier:
# - interdomain: the cube's IA / S4D-only / softmax x 3 seeds to early stopping or 10,000 steps (cube-patient), and
#   their extrapolation measured on the same models (extrapolation-patient), at the rates the CPU's sweep chose;
# - ccq: S-NIAH pass-key trained at 256 tokens and tested to 4x (niah-256), for softmax (the control), GLA, CCQ-GLA;
# - coupled-qk: 7 more paired seeds of softmax and coupled-euler on the language model (lm: 10 in all).
# What that settles: of the converged tiers' headline rows, only coupled-qk's (coupling lowers perplexity vs softmax)
# gains seeds, and its new runs keep the 4,000-step cap at which all 6 runs so far ended, so that row stays marked
# not converged. The rows of cube-patient and niah-256 are not headlines: they ask the headline claims of cube and
# niah again with a longer cap and at 256 tokens, beside those rows, which gain nothing. --dry-run lists every row.
# Each suite writes <out>/<suite>-converged/, with MACHINE.txt naming the device and plan.txt the prediction. Every
# record finished by the deadline is kept; another call continues from the checkpoints. The deadline is sized from
# the plans' prediction on DOCTOR's GPU (scripts/side_by_side.py), at most 480 s, since a device call runs at most
# 10 minutes; the prediction says how many calls the plans need.
# Usage: scripts/gpu-science.sh [--dry-run] [output folder, default runs/gpu-science]
#   --dry-run (on any machine, a CPU too): prints each plan (its jobs, each predicted alone on DOCTOR's GPU, and the
#   claims' rows they carry, headline or not), then all of them side by side: from start to end with what it assumes
#   (compile warm-up and packing, measured or not), the deadline and the device calls needed.
#   PYTHON (default python3) runs attnlab; DOCTOR (default results/doctor/doctor.json) is the GPU's doctor report;
#   DEADLINE (seconds) replaces the sized deadline.
set -euo pipefail
cd "$(dirname "$0")/.."
dry=
if [[ ${1:-} == --dry-run ]]; then dry=1; shift; fi
out=${1:-runs/gpu-science}
python=${PYTHON:-python3}
doctor=${DOCTOR:-results/doctor/doctor.json}
if [[ -n $dry ]]; then
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
else
    NO_FLA=1 source scripts/gpu-site.sh  # fla's first use compiles for minutes; the doctor timed the torch forms
fi
mkdir -p "$out"
# suite, workers (its runs at once on the GPU), then the reproduce options that select its plan
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
planner=("$python" scripts/side_by_side.py --predict-on "$doctor" --out "$out" ${DEADLINE:+--deadline "$DEADLINE"}
         "${plans[@]}")
if [[ -n $dry ]]; then
    exec "${planner[@]}"
fi
"${planner[@]}" > "$out/plan.txt"
deadline=$(sed -n 's/^deadline: \([0-9]*\) s a call.*/\1/p' "$out/plan.txt")
grep -e '^side by side' -e '^deadline: ' "$out/plan.txt"
run() {  # suite workers options...: one suite's plan on the GPU
    local suite=$1 workers=$2
    shift 2
    timeout --signal=INT --kill-after=60 "$deadline" "$python" -m attnlab.cli reproduce "$suite" --tier converged \
        --out "$out" --jobs "$workers" --runs-per-gpu "$workers" --runs-dir "$out/runs" "$@" > "$out/$suite.log" 2>&1 ||
        echo "$suite: stopped ($?); see $out/$suite.log, and call again to continue"
}
{ date -u +%FT%TZ; git rev-parse HEAD 2>/dev/null || true; nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader || true; "$python" -c 'import torch; print("torch", torch.__version__)'; } > "$out/MACHINE.txt"
for plan in "${plans[@]}"; do run $plan & done
wait
tail -n 3 "$out"/*.log
