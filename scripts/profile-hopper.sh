#!/usr/bin/env bash
# The Hopper kernel's next tuning step, in one device call (logs under $OUT):
#   1. `eval.py sweep --only wr --diagnose`: every weights-in-registers form, each checked
#      against the reference, and the default's timing diagnostics, against grouped_mm;
#   2. ncu on custom_kernel's configuration ($NVFP4_SM90_CONFIG or hopper.SM90_CONFIG),
#      benchmarks ${PROFILE_CASES:-0 3}: one pre-pass and one GEMM launch each, with their
#      durations, speed of light, memory tables (L2, shared-memory bank conflicts), warp
#      stall reasons and launch statistics.
# Usage, from the repository root: OUT=... bash scripts/profile-hopper.sh
set -uo pipefail
OUT=${OUT:-$PWD/profile-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. scripts/cutedsl-env.sh
status=0
echo "=== sweep"
python3 -W ignore eval.py sweep --only wr --diagnose 2>&1 | tee "$OUT/sweep.log" || status=1
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
if [ ! -x "$ncu" ]; then
  echo "=== ncu not found: profiles skipped"
  exit $status
fi
for case in ${PROFILE_CASES:-0 3}; do
  echo "=== ncu, benchmark $case"
  # skip the check's and the first timing calls' launches; then one pre-pass and one GEMM
  "$ncu" --clock-control none -k regex:hopperSm90 --launch-skip 20 --launch-count 2 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --section WarpStateStats \
      --section LaunchStats --section Occupancy \
      python3 -W ignore eval.py benchmarks --case "$case" > "$OUT/ncu-benchmark$case.txt" 2>&1 || status=1
  grep -E "convert_tokens|kernel_cutlass_kernel|Duration|Throughput|Bank|Stall|Registers" \
      "$OUT/ncu-benchmark$case.txt" | head -60
done
exit $status
