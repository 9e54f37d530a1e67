#!/usr/bin/env bash
# Everything this project checks on a CUDA machine, in one go (for a lent GPU:
# one call, logs under $OUT), under every nvidia-cutlass-dsl release pyproject.toml
# accepts (toolchain.CHECKED_DSL_RELEASES): a miscompile of one release fails that
# release's steps. Usage, from the repository root:
#   bash scripts/gpu-check.sh            # OUT defaults to ./gpu-check-out
# Exits 0 only if every step passed; the last line says which steps failed, each
# named STEP@RELEASE (logs STEP-RELEASE.log).
# GPU_CHECK_STEPS picks steps (default: all, in this order): smi pytest eval overhead moe mlp
# memcheck racecheck synccheck protocol -- e.g. two calls on one warm machine when one call's time is short.
# GPU_CHECK_RELEASES picks releases (default: every checked one); each comes from an archive, a folder or the
# installed DSL (scripts/cutedsl-env.sh, use_cutedsl_release), and a release not found fails as dsl@RELEASE.
# racecheck passes when every race it reports is the pattern scripts/racecheck_pattern.py shows it
# cannot see (scripts/racecheck_verdict.py reads the log; kernels compiled with line information).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. scripts/cutedsl-env.sh
steps=" ${GPU_CHECK_STEPS:-smi pytest eval overhead moe mlp memcheck racecheck synccheck protocol} "
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
releases=${GPU_CHECK_RELEASES:-$(python3 -c "from nvfp4_group_gemm.toolchain import CHECKED_DSL_RELEASES as r; print(*r)")}
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for release in $releases; do
  echo; echo "=== nvidia-cutlass-dsl $release"
  if ! use_cutedsl_release "$release"; then failed+=("dsl@$release"); continue; fi
  at=@$release log=-$release.log
  step versions$at versions$log python3 -c "import torch, cutlass; print('torch', torch.__version__, 'cutlass-dsl', cutlass.__version__)"
  # bounded: a hanging kernel (an untimed form) must leave time for the steps after it. PYTEST_ARGS (default
  # tests) narrows it, e.g. to tests/test_gpu.py when little device time is left (CI runs the CPU tests).
  wants pytest && step pytest$at pytest$log timeout "${PYTEST_TIMEOUT:-420}" \
    python3 -m pytest -q -rfEs --durations=12 -p no:cacheprovider ${PYTEST_ARGS:-tests}
  wants eval && step eval$at eval$log python3 eval.py
  wants overhead && step overhead$at overhead$log python3 eval.py overhead
  wants moe && step moe$at moe$log python3 eval.py moe
  wants mlp && step mlp$at mlp$log python3 eval.py mlp
  for tool in memcheck racecheck synccheck; do
    wants $tool || continue
    if [ ! -x "$sanitizer" ]; then
      echo "=== FAILED: compute-sanitizer not found, $tool not run"; failed+=($tool$at); continue
    fi
    case $tool in
      memcheck|synccheck)
        step $tool$at $tool$log "$sanitizer" --tool $tool --report-api-errors no --error-exitcode 9 \
          python3 -W ignore scripts/sanitize_cases.py ${SANITIZE_CASES:-3 3} --moe --quantizer ;;
      racecheck)
        # the pattern alone first, every variant: what racecheck says of it fenced or not, that the verdict places
        # its lines, and that it rejects the negative control (early-read: a load before the wait)
        for variant in plain consumer-fence producer-fence early-read; do
          step racecheck-$variant$at racecheck-$variant$log env CUTE_DSL_LINEINFO=1 "$sanitizer" --tool racecheck \
            python3 -W ignore scripts/racecheck_pattern.py $variant
          expect=0; [ $variant = early-read ] && expect=1
          step racecheck-$variant-verdict$at racecheck-$variant-verdict$log env EXPECT=$expect bash -c \
            'python3 scripts/racecheck_verdict.py --pattern "$0"; rc=$?; echo "verdict exit $rc, expected $EXPECT"; [ $rc -eq $EXPECT ]' \
            "$OUT/racecheck-$variant$log"
        done
        step racecheck$at racecheck$log env CUTE_DSL_LINEINFO=1 "$sanitizer" --tool racecheck \
          python3 -W ignore scripts/sanitize_cases.py ${SANITIZE_CASES:-3 3} --moe --quantizer
        step racecheck-verdict$at racecheck-verdict$log python3 scripts/racecheck_verdict.py "$OUT/racecheck$log" ;;
    esac
  done
  if wants protocol; then
    for mode in test benchmark; do
      file=cases/tests.txt; [ $mode = benchmark ] && file=cases/benchmarks.txt
      result=$OUT/popcorn-$mode-$release.txt
      POPCORN_FD=3 python3 eval.py $mode $file 3>"$result"
      rc=$?
      echo "=== protocol $mode$at: exit $rc"; cat "$result"
      # the leaderboard reads the verdict from the protocol output, not from the exit status
      if [ $rc -ne 0 ] || ! grep -qx 'check: pass' "$result"; then
        echo "=== FAILED: protocol $mode$at"; failed+=("protocol-$mode$at")
      fi
    done
  fi
done
echo
if [ ${#failed[@]} -eq 0 ]; then echo "=== gpu-check: pass (steps:$steps; nvidia-cutlass-dsl $releases)"; exit 0; fi
echo "=== gpu-check: FAILED: ${failed[*]}"
exit 1
