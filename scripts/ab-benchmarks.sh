#!/usr/bin/env bash
# Same-run A/B of benchmark times: an older tree against this one, timed by the
# leaderboard protocol (`eval.py benchmark`), alternating, ROUNDS times (default 2),
# in one device call (absolute times drift between runs). Usage, from the repo root:
#   git archive OLD_REV | (mkdir -p .old && tar -x -C .old)   # here; carry .old along
#   OUT=... bash scripts/ab-benchmarks.sh .old
# Prints per benchmark: old and new mean us of each round, and new / old of the means.
set -uo pipefail
old=$(cd "$1" && pwd)
OUT=${OUT:-$PWD/ab-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. scripts/cutedsl-env.sh
status=0
for round in $(seq "${ROUNDS:-2}"); do
  for side in old new; do
    dir=$PWD; [ "$side" = old ] && dir=$old
    (cd "$dir" && POPCORN_FD=3 python3 -W ignore eval.py benchmark "$PWD/cases/benchmarks.txt" \
        3>"$OUT/$side-$round.txt" >"$OUT/$side-$round.log" 2>&1) || status=1
    echo "=== $side round $round: $(grep -c 'mean' "$OUT/$side-$round.txt") means, $(grep '^check' "$OUT/$side-$round.txt")"
  done
done
python3 scripts/ab_table.py "$OUT" || status=1
exit $status
