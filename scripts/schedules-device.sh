#!/usr/bin/env bash
# The scheduling policies (submission.Schedule) timed with the Hopper kernel on the 4 benchmarks, in one device
# call: the leaderboard protocol's benchmark mode for each schedule of the default form (hopper.CONFIG_ENV
# "/SCHEDULE"), round-robin and contiguous again (absolute times drift), exactness of each schedule first.
# Usage, from the repository root:   OUT=... bash scripts/schedules-device.sh      (carry .cutedsl)
set -uo pipefail
OUT=${OUT:-$PWD/schedules-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. scripts/cutedsl-env.sh
for schedule in round-robin contiguous balanced contiguous+balanced contiguous+balanced+by-m; do
  NVFP4_SM90_CONFIG=/$schedule python3 -W ignore scripts/max_error.py cases/tests.txt cases/benchmarks.txt \
    > "$OUT/exact-$schedule.txt" 2>&1
  echo "=== exactness $schedule: $(tail -1 "$OUT/exact-$schedule.txt")"
done
OUT=$OUT VARIANTS="rr=.:/round-robin contig=.:/contiguous bal=.:/balanced cbal=.:/contiguous+balanced bym=.:/contiguous+balanced+by-m" \
  ROUND2="rr contig" bash scripts/variants-device.sh
