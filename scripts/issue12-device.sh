set -u
export OUT=${OUT}
. scripts/cutedsl-env.sh >/dev/null 2>&1
( ROUNDS=2 OUT=$OUT/ab bash scripts/ab-benchmarks.sh .old ) > $OUT/ab.txt 2>&1
( cd . && NVFP4_SM90_CONFIG=sm90-128x128-k128-wr-no-pdl POPCORN_FD=3 python3 -W ignore eval.py benchmark cases/benchmarks.txt 3>$OUT/nopdl.txt >$OUT/nopdl.log 2>&1; POPCORN_FD=3 python3 -W ignore eval.py benchmark cases/benchmarks.txt 3>$OUT/pdl.txt >$OUT/pdl.log 2>&1 )
grep -E "mean|check" $OUT/nopdl.txt | head; grep -E "mean|check" $OUT/pdl.txt | head
cat $OUT/ab.txt | tail -15
timeout 330 bash scripts/gpu-check.sh > $OUT/gpucheck.txt 2>&1; echo gpucheck rc $?
grep -E "passed|failed|FAILED|Error|=== protocol|^check|ERROR SUMMARY" $OUT/gpucheck.txt | head -40
