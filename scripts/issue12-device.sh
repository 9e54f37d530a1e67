#!/usr/bin/env bash
# Issue 12's same-run measurements in one device call (logs under $OUT): exactness of the old and the new tree
# (scripts/max_error.py on the tests and each benchmark's first input), then the leaderboard protocol's
# benchmark mode for old, new, new without programmatic dependent launch (descriptors built once alone),
# new with the pre-pass's early release and new with the GEMM's first weights after its wait, the old and new again, and both trees' kernel timelines.
# Usage, from the repository root, with the old tree made by `git archive REV | tar -x -C .old`:
#   OUT=... bash scripts/issue12-device.sh        (carry .old and .cutedsl)
set -uo pipefail
OUT=${OUT:-$PWD/issue12-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. scripts/cutedsl-env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
root=$PWD
for side in old new; do
  dir=.; [ $side = old ] && dir=.old
  (cd $dir && python3 -W ignore "$root/scripts/max_error.py" "$root/cases/tests.txt" \
      "$root/cases/benchmarks.txt") > "$OUT/exact-$side.txt" 2>&1
  echo "=== exactness $side: $(tail -1 "$OUT/exact-$side.txt")"
done
VARIANTS="old=.old new=. nopdl=.:sm90-128x128-k128-wr-no-pdl early=.:sm90-128x128-k128-wr-early-release waw=.:sm90-128x128-k128-wr-weights-after-wait" \
  ROUND2="old new" TIMELINE="old new" bash scripts/variants-device.sh
