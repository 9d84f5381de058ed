# Sourced by the GPU scripts: attnlab from this working tree on the machine's own PyTorch, plus the wheels
# scripts/gpu-wheels.sh prepared in .whl/ (installed aside, nothing of the system changed). NO_FLA=1 leaves fla's
# wheel out: every mixer then runs its torch form (fla's first use compiles and tunes its Triton kernels, which took
# more than 7 minutes on an H200 with Triton 3.6).
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
