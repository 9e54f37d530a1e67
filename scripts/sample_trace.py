"""Where one sample of the benchmark loop stalls: a summary of the per-sample
trace that eval.py writes when NVFP4_SAMPLE_TRACE names a file (one JSON line per
timed sample: sizes, index, GPU us per call, host ms of the 15 calls, garbage-
collector pauses, allocator counters that moved). Per benchmark: the median
sample, then the first samples and every sample over 1.5x the median.
Usage: NVFP4_SAMPLE_TRACE=trace.jsonl POPCORN_FD=3 python3 eval.py benchmark cases/benchmarks.txt 3>/dev/null
       python3 scripts/sample_trace.py trace.jsonl"""
import json
import statistics
import sys
from collections import defaultdict

by_sizes = defaultdict(list)
for line in open(sys.argv[1]):
    sample = json.loads(line)
    by_sizes[json.dumps(sample["sizes"])].append(sample)
for sizes, samples in by_sizes.items():
    median = statistics.median(s["us_per_call"] for s in samples)
    print(f"{sizes}: {len(samples)} samples, median {median:.2f} us/call")
    for s in samples:
        if s["sample"] < 2 or s["us_per_call"] > 1.5 * median:
            print(f"  sample {s['sample']:3d}: {s['us_per_call']:10.2f} us/call, host {s['host_ms']:8.3f} ms, "
                  f"gc {s['gc_pauses']}, allocator {s.get('allocator', {})}")
