#!/usr/bin/env bash
# What a new user meets on a machine with no CUDA toolkit (run it under scripts/without-cuda.sh), from the
# repository root with the README's set-up done and its virtual environment active:
#  1. `python eval.py` twice, the compile cache empty at first: both exit 0 and print progress; the second
#     takes under half the first one's time (both times printed).
#  2. `pip install .` into a new virtual environment (torch from FRESH_TORCH, default torch==2.13.0), then
#     from another folder: `import nvfp4_group_gemm` works, `import eval` (task, reference, harness, ...)
#     fails, and the console command `nvfp4-group-gemm tests` compiles and self-checks.
# Exit 0 when all holds; the last line says which check failed otherwise.
#
#   bash scripts/without-cuda.sh bash scripts/fresh-machine-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "=== fresh-machine-check: FAILED: $*"; exit 1; }
export NVFP4_GROUP_GEMM_CACHE="$work/cache"

echo "=== 1. python eval.py, twice (compile cache: $NVFP4_GROUP_GEMM_CACHE)"
for run in 1 2; do
    start=$EPOCHREALTIME
    python eval.py >"$work/eval$run.log" 2>&1 || { tail -40 "$work/eval$run.log"; fail "python eval.py (run $run)"; }
    seconds[$run]=$(python -c "print(round($EPOCHREALTIME - $start, 1))")
    echo "run $run: exit 0 in ${seconds[$run]} s"
done
# the first run's progress lines count the kernels ("  [1/N] ..."); the second run takes all N from the cache
kernels=$(sed -n 's|^  \[1/\([0-9][0-9]*\)\] .*|\1|p' "$work/eval1.log" | head -1)
[ -n "$kernels" ] || fail "no progress lines in the first run"
grep -q "($kernels of $kernels kernels from the cache" "$work/eval2.log" || fail "the second run did not use the cache"
python -c "import sys; sys.exit(not 2 * ${seconds[2]} < ${seconds[1]})" || fail "the second run took ${seconds[2]} s, not under half of ${seconds[1]} s"

echo "=== 2. pip install . into a new virtual environment"
python -m venv "$work/venv"
"$work/venv/bin/pip" install -q "${FRESH_TORCH:-torch==2.13.0}"
"$work/venv/bin/pip" install -q .
cd "$work"
"$work/venv/bin/python" -c "import nvfp4_group_gemm, sys; print('imports as', nvfp4_group_gemm.__name__)" \
    || fail "import nvfp4_group_gemm"
for name in eval task reference harness submission hopper hopper_policy portable hostbench; do
    if "$work/venv/bin/python" -c "import $name" 2>/dev/null; then fail "'import $name' works: a top-level module"; fi
done
echo "no top-level eval, task, reference, harness, submission, hopper, hopper_policy, portable, hostbench"
"$work/venv/bin/nvfp4-group-gemm" tests >"$work/tests.log" 2>&1 || {
    grep -E "FAIL|rror" "$work/tests.log" | head -20; tail -20 "$work/tests.log"; fail "nvfp4-group-gemm tests"; }
# the tests' shape sets alone, and the kernels they need
grep -Eq '^[0-9]+ kernels, 10 shape sets, 0 failures' "$work/tests.log" || fail "nvfp4-group-gemm tests: the compile gate"
grep -q '(10/10 agree)' "$work/tests.log" || fail "nvfp4-group-gemm tests: the reference self-check"
echo "nvfp4-group-gemm tests: exit 0, the tests' 10 shape sets planned and their kernels compiled, 10/10 agree"
echo "=== fresh-machine-check: pass"
