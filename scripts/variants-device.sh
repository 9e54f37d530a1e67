#!/usr/bin/env bash
# Same-run timing of Hopper-path variants, in one device call (logs under $OUT):
# the leaderboard protocol (`eval.py benchmark`) for every variant of VARIANTS, then
# ROUND2 again (absolute times drift), then `scripts/call_timeline.py` (per-kernel
# durations and the gaps between kernels) for TIMELINE on benchmarks 0 and 3.
# Each run writes eval.py's sample trace where its tree has one and prints its samples over 1.5x the median.
# A variant is LABEL=DIR[:SETTING]: a tree (. for this one; older trees made with
# `git archive REV | tar -x -C DIR` here and carried along) and an NVFP4_SM90_CONFIG.
# EXACT=1 first checks each variant against the reference (`scripts/max_error.py`); every run is bounded
# by VARIANT_TIMEOUT seconds (default 240), so that a variant that hangs does not cost the whole call.
# Usage, from the repository root:
#   OUT=... VARIANTS="old=.old new=." ROUND2="old new" TIMELINE="old new" bash scripts/variants-device.sh
set -uo pipefail
OUT=${OUT:-$PWD/variants-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. scripts/cutedsl-env.sh
root=$PWD
declare -A dirs settings
labels=()
for v in $VARIANTS; do
  label=${v%%=*}; rest=${v#*=}
  dirs[$label]=${rest%%:*}
  settings[$label]=$([ "$rest" != "${rest#*:}" ] && echo "${rest#*:}" || echo "")
  labels+=("$label")
done
bench() {  # label round
  # a tree whose eval.py has the sample trace writes it (eval.py's NVFP4_SAMPLE_TRACE)
  # a variant that hangs (an untimed form) costs VARIANT_TIMEOUT seconds, not the call
  (cd "${dirs[$1]}" && NVFP4_SM90_CONFIG=${settings[$1]} NVFP4_SAMPLE_TRACE="$OUT/trace-$1-$2.jsonl" POPCORN_FD=3 \
      timeout "${VARIANT_TIMEOUT:-240}" python3 -W ignore eval.py benchmark "$root/cases/benchmarks.txt" \
      3>"$OUT/$1-$2.txt" >"$OUT/$1-$2.log" 2>&1) || echo "=== $1 round $2: exit $?"
  echo "=== $1 round $2: $(grep -c 'mean' "$OUT/$1-$2.txt") means, $(grep '^check' "$OUT/$1-$2.txt")," \
       "worst us: $(grep 'worst' "$OUT/$1-$2.txt" | awk '{printf "%.1f ", $2 / 1000}')"
  # samples over 1.5x their benchmark's median, if traced
  [ -f "$OUT/trace-$1-$2.jsonl" ] && python3 "$root/scripts/sample_trace.py" "$OUT/trace-$1-$2.jsonl" | grep -v "sample   [01]:"
}
if [ "${EXACT:-0}" = 1 ]; then  # each variant against the reference first (scripts/max_error.py), bounded
  for label in "${labels[@]}"; do
    echo "=== $label exact: $(cd "${dirs[$label]}" && NVFP4_SM90_CONFIG=${settings[$label]} timeout "${VARIANT_TIMEOUT:-240}" \
        python3 -W ignore "$root/scripts/max_error.py" "$root/cases/tests.txt" "$root/cases/benchmarks.txt" 2>&1 \
        | tail -1 | tr -d "\n"; echo " (exit ${PIPESTATUS[0]})")"
  done
fi
for label in "${labels[@]}"; do bench "$label" 1; done
for label in ${ROUND2:-}; do bench "$label" 2; done
python3 - "$OUT" "${labels[@]}" <<'EOF'
import re, sys
from pathlib import Path
out, labels = Path(sys.argv[1]), sys.argv[2:]
means = {}
for path in sorted(out.glob("*-[12].txt")):
    label, round_ = path.stem.rsplit("-", 1)
    for i, ns in re.findall(r"benchmark\.(\d+)\.mean: ([\d.]+)", path.read_text()):
        means.setdefault((label, int(i)), []).append(float(ns) / 1000)
print("mean us per call, rounds in order; ratio to the first variant of the means")
base = labels[0]
for i in range(4):
    row = []
    for label in labels:
        values = means.get((label, i), [])
        ratio = (sum(values) / len(values)) / (sum(means[(base, i)]) / len(means[(base, i)])) \
            if values and means.get((base, i)) else float("nan")
        row.append(f"{label} {'/'.join(f'{v:.2f}' for v in values)} ({ratio:.3f})")
    print(f"benchmark {i}: " + " | ".join(row))
EOF
for label in ${TIMELINE:-}; do
  echo "=== timeline $label"
  (cd "${dirs[$label]}" && NVFP4_SM90_CONFIG=${settings[$label]} python3 -W ignore "$root/scripts/call_timeline.py" \
      "$root/cases/benchmarks.txt" 0 3) 2>&1 | grep -v Warning | tail -20
done
