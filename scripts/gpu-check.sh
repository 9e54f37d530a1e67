#!/usr/bin/env bash
# Everything this project checks on a CUDA machine, in one go (for a lent GPU:
# one call, logs under $OUT). Usage, from the repository root:
#   bash scripts/gpu-check.sh            # OUT defaults to ./gpu-check-out
# Exits 0 only if every step passed; the last line says which steps failed.
# GPU_CHECK_STEPS picks steps (default: all, in this order): smi pytest eval overhead moe
# memcheck racecheck synccheck protocol -- e.g. two calls on one warm machine when one call's time is short.
# racecheck passes when every race it reports is the pattern scripts/racecheck_pattern.py shows it
# cannot see (scripts/racecheck_verdict.py reads the log; kernels compiled with line information).
# If .cutedsl/cutedsl-*.tar.xz is present (../shared/tools/pack-cutedsl), it is
# unpacked first for machines without nvidia-cutlass-dsl and without a package index.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. scripts/cutedsl-env.sh
steps=" ${GPU_CHECK_STEPS:-smi pytest eval overhead moe memcheck racecheck synccheck protocol} "
failed=()
# step NAME LOG COMMAND...: runs COMMAND, its output also into $OUT/LOG; a nonzero exit fails NAME.
# (The status is read from PIPESTATUS here: a step piped into tee runs in a subshell, where it
# could not record its own failure.)
step() {
  local name=$1 log=$2; shift 2
  echo; echo "=== $name: $*"
  "$@" 2>&1 | tee "$OUT/$log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then echo "=== FAILED ($rc): $name"; failed+=("$name"); fi
}
wants() { [[ $steps == *" $1 "* ]]; }

wants smi && step smi smi.log nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.max.sm --format=csv
step versions versions.log python3 -c "import torch, cutlass; print('torch', torch.__version__, 'cutlass-dsl', cutlass.__version__)"
# bounded: a hanging kernel (an untimed form) must leave time for the steps after it. PYTEST_ARGS (default
# tests) narrows it, e.g. to tests/test_gpu.py when little device time is left (CI runs the CPU tests).
wants pytest && step pytest pytest.log timeout "${PYTEST_TIMEOUT:-420}" \
  python3 -m pytest -q -rfEs --durations=12 -p no:cacheprovider ${PYTEST_ARGS:-tests}
wants eval && step eval eval.log python3 eval.py
wants overhead && step overhead overhead.log python3 eval.py overhead
wants moe && step moe moe.log python3 eval.py moe
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
  wants $tool || continue
  if [ ! -x "$sanitizer" ]; then
    echo "=== FAILED: compute-sanitizer not found, $tool not run"; failed+=($tool); continue
  fi
  case $tool in
    memcheck|synccheck)
      step $tool $tool.log "$sanitizer" --tool $tool --report-api-errors no --error-exitcode 9 \
        python3 -W ignore scripts/sanitize_cases.py ${SANITIZE_CASES:-3 3} --moe ;;
    racecheck)
      # the pattern alone first: its log shows what racecheck says of it, and that the verdict places its lines
      step racecheck-pattern racecheck-pattern.log env CUTE_DSL_LINEINFO=1 "$sanitizer" --tool racecheck \
        python3 -W ignore scripts/racecheck_pattern.py plain
      step racecheck racecheck.log env CUTE_DSL_LINEINFO=1 "$sanitizer" --tool racecheck \
        python3 -W ignore scripts/sanitize_cases.py ${SANITIZE_CASES:-3 3} --moe
      step racecheck-verdict racecheck-verdict.log python3 scripts/racecheck_verdict.py "$OUT/racecheck.log" ;;
  esac
done
if wants protocol; then
  for mode in test benchmark; do
    file=cases/tests.txt; [ $mode = benchmark ] && file=cases/benchmarks.txt
    POPCORN_FD=3 python3 eval.py $mode $file 3>"$OUT/popcorn-$mode.txt"
    rc=$?
    echo "=== protocol $mode: exit $rc"; cat "$OUT/popcorn-$mode.txt"
    # the leaderboard reads the verdict from the protocol output, not from the exit status
    if [ $rc -ne 0 ] || ! grep -qx 'check: pass' "$OUT/popcorn-$mode.txt"; then
      echo "=== FAILED: protocol $mode"; failed+=("protocol-$mode")
    fi
  done
fi
echo
if [ ${#failed[@]} -eq 0 ]; then echo "=== gpu-check: pass (steps:$steps)"; exit 0; fi
echo "=== gpu-check: FAILED: ${failed[*]}"
exit 1
