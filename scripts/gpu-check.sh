#!/usr/bin/env bash
# Everything this project checks on a CUDA machine, in one go (for a lent GPU:
# one call, logs under $OUT). Usage, from the repository root:
#   bash scripts/gpu-check.sh            # OUT defaults to ./gpu-check-out
# If .cutedsl/cutedsl-*.tar.xz is present (../shared/tools/pack-cutedsl), it is
# unpacked first for machines without nvidia-cutlass-dsl and without a package index.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. scripts/cutedsl-env.sh
status=0
step() { echo; echo "=== $*"; "$@" || { echo "=== FAILED ($?): $*"; status=1; }; }
step nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.max.sm --format=csv
step python3 -c "import torch, cutlass; print('torch', torch.__version__, 'cutlass-dsl', cutlass.__version__)"
# bounded: a hanging kernel (an untimed form) must leave time for the steps after it. PYTEST_ARGS (default
# tests) narrows it, e.g. to tests/test_gpu.py when little device time is left (CI runs the CPU tests).
step timeout "${PYTEST_TIMEOUT:-420}" python3 -m pytest -q -rA --durations=12 -p no:cacheprovider ${PYTEST_ARGS:-tests} 2>&1 | tee "$OUT/pytest.log"
step python3 eval.py 2>&1 | tee "$OUT/eval.log"
step python3 eval.py overhead 2>&1 | tee "$OUT/overhead.log"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$sanitizer" ]; then
  step "$sanitizer" --tool memcheck --report-api-errors no --error-exitcode 9 python3 -W ignore scripts/sanitize_cases.py ${SANITIZE_CASES:-3 3} 2>&1 | tee "$OUT/memcheck.log"
else
  echo "=== compute-sanitizer not found: memcheck skipped"
fi
for mode in test benchmark; do
  file=cases/tests.txt; [ $mode = benchmark ] && file=cases/benchmarks.txt
  POPCORN_FD=3 python3 eval.py $mode $file 3>"$OUT/popcorn-$mode.txt"
  echo "=== protocol $mode: exit $?"; cat "$OUT/popcorn-$mode.txt"
done
exit $status
