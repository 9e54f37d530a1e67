#!/usr/bin/env bash
# Same-run A/B of scripts/m_sweep.py (custom_kernel across M per group at the two expert shapes): an older
# tree against this one, alternating, ROUNDS times (default 1), in one device call (absolute times drift
# between runs). Usage, from the repo root:
#   git archive OLD_REV | (mkdir -p .old && tar -x -C .old)   # here; carry .old along
#   M=16,64,128 OUT=... bash scripts/ab-m-sweep.sh .old        # M: m_sweep's --m (default: its own list)
# NVFP4_SM90_CONFIG (hopper_policy.CONFIG_ENV) applies to both trees where it names a form both have.
# Prints per point: old and new us of each round, and new / old of the means (scripts/ab_table.py).
set -uo pipefail
old=$(cd "$1" && pwd)
OUT=${OUT:-$PWD/ab-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. scripts/cutedsl-env.sh
status=0
for round in $(seq "${ROUNDS:-1}"); do
  for side in old new; do
    dir=$PWD; [ "$side" = old ] && dir=$old
    (cd "$dir" && python3 -W ignore scripts/m_sweep.py ${M:+--m "$M"} >"$OUT/$side-$round.txt" 2>&1) || status=1
    echo "=== $side round $round: $(grep -c 'x$' "$OUT/$side-$round.txt") points timed"
  done
done
python3 scripts/ab_table.py --m-sweep "$OUT" || status=1
exit $status
