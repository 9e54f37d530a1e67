#!/usr/bin/env bash
# Same-run A/B: an older tree against this one, alternating, ROUNDS times (default 2), in one device call
# (absolute times drift between runs). Usage, from the repo root:
#   git archive OLD_REV | (mkdir -p .old && tar -x -C .old)   # here; carry .old along
#   OUT=... bash scripts/ab-benchmarks.sh .old
# By default it times the benchmarks by the leaderboard protocol (`eval.py benchmark`), or with CASES=FILE that
# file's cases (cases/random20.txt: scripts/random_cases.py's shape sets); with SWEEP_M=16,64,...
# it runs scripts/m_sweep.py --m SWEEP_M instead (custom_kernel across M per group at the two expert shapes;
# settings such as NVFP4_SM90_CONFIG apply to both trees).
# Prints per benchmark (or per m_sweep point: N, K, M): old and new us of each round, and new / old of the
# means (scripts/ab_table.py).
set -uo pipefail
old=$(cd "$1" && pwd)
OUT=${OUT:-$PWD/ab-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. scripts/cutedsl-env.sh
status=0
cases=$(cd "$(dirname "${CASES:-cases/benchmarks.txt}")" && pwd)/$(basename "${CASES:-cases/benchmarks.txt}")
for round in $(seq "${ROUNDS:-2}"); do
  for side in old new; do
    dir=$PWD; [ "$side" = old ] && dir=$old
    if [ -n "${SWEEP_M:-}" ]; then
      (cd "$dir" && python3 -W ignore scripts/m_sweep.py --m "$SWEEP_M" >"$OUT/$side-$round.txt" 2>&1) || status=1
      echo "=== $side round $round: $(grep -c 'x$' "$OUT/$side-$round.txt") points timed"
    else
      (cd "$dir" && POPCORN_FD=3 python3 -W ignore eval.py benchmark "$cases" \
          3>"$OUT/$side-$round.txt" >"$OUT/$side-$round.log" 2>&1) || status=1
      means=$(grep -c 'mean' "$OUT/$side-$round.txt")
      echo "=== $side round $round: $means means, $(grep '^check' "$OUT/$side-$round.txt")"
    fi
  done
done
python3 scripts/ab_table.py ${SWEEP_M:+--m-sweep} "$OUT" || status=1
exit $status
