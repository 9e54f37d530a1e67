#!/usr/bin/env bash
# The Hopper kernel's profile, in one device call (logs under $OUT):
#   1. with SWEEP=1, `eval.py sweep --only wr --diagnose` first: every weights-in-registers form, each
#      checked against the reference, and the default's timing diagnostics, against grouped_mm;
#   2. ncu (full set, details printed) on custom_kernel's choice ($NVFP4_SM90_CONFIG or hopper_policy.sm90_choice),
#      benchmarks ${PROFILE_CASES:-0 3}: two GEMM launches each (tokens converted inside), past the check's
#      and the first timing calls' launches. Stall reasons: "Warp Stall Sampling" in each kernel's
#      Source Counters section; by instruction: the report's source view (ncu-benchmarkN-sass.csv, summed
#      by opcode by scripts/ncu_source_summary.py).
# Usage, from the repository root: OUT=... bash scripts/profile-hopper.sh       (carry .cutedsl)
set -uo pipefail
OUT=${OUT:-$PWD/profile-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. scripts/cutedsl-env.sh
status=0
if [ "${SWEEP:-0}" = 1 ]; then
  echo "=== sweep"
  python3 -W ignore eval.py sweep --only wr --diagnose 2>&1 | tee "$OUT/sweep.log" || status=1
fi
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
if [ ! -x "$ncu" ]; then
  echo "=== ncu not found: profiles skipped"
  exit $status
fi
for case in ${PROFILE_CASES:-0 3}; do
  echo "=== ncu, benchmark $case"
  # GEMM launches only (the descriptor builder, once per plan, is left out)
  timeout 300 "$ncu" --clock-control none -k "regex:kernel_cutlass_kernel_nvfp4_group_gemmhopper" --launch-skip 20 \
      --launch-count 2 --set full --import-source no -o "/tmp/ncu-benchmark$case" -f \
      python3 -W ignore eval.py benchmarks --case "$case" > "$OUT/ncu-benchmark$case.log" 2>&1 || status=1
  "$ncu" --import "/tmp/ncu-benchmark$case.ncu-rep" --print-details all > "$OUT/ncu-benchmark$case.txt" 2>&1 || status=1
  "$ncu" --import "/tmp/ncu-benchmark$case.ncu-rep" --page source --print-source sass --csv \
      > "$OUT/ncu-benchmark$case-sass.csv" 2>/dev/null && python3 scripts/ncu_source_summary.py \
      "$OUT/ncu-benchmark$case-sass.csv" --top 12
  grep -E "^  kernel|Duration|Compute \(SM\) Throughput|DRAM Throughput|L2 Cache Throughput|L2 Hit Rate|Max Bandwidth|Issue Slots Busy|No Eligible|issue_stalled_(long_scoreboard|wait|dispatch_stall|selected|barrier|math_pipe_throttle|mio_throttle|short_scoreboard) " \
      "$OUT/ncu-benchmark$case.txt" | cut -c1-140 | head -60
done
exit $status
