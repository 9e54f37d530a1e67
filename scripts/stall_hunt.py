"""Rare stalled samples of the leaderboard's loop: how often, and where on the GPU.

Run from the root of a tree (this one or an older one: the tree's own
custom_kernel is imported from the working directory):
    python3 path/to/stall_hunt.py CASES_FILE SAMPLES INDEX [INDEX ...]
Per benchmark: its 15 inputs called once (plans built) and one warm loop; then
SAMPLES samples of the loop (synchronize, flush L2, event, 15 calls, event,
synchronize) timed by events, listing every sample over 3x the median; then
SAMPLES more under torch.profiler (CUDA activity), listing every kernel of ours
longer than 1 ms and every gap over 1 ms between two kernels of one sample (a
stalled kernel, or a GPU idle while the host was not blocked)."""
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402

from nvfp4_group_gemm import harness  # noqa: E402
from nvfp4_group_gemm.casefile import read_test_file  # noqa: E402

FLUSH_KERNELS = ("elementwise", "randn", "normal", "distribution")


def sample(custom_kernel, inputs):
    torch.cuda.synchronize()
    harness.flush_l2()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    began = time.perf_counter()
    for data in inputs:
        custom_kernel(data)
    host_ms = (time.perf_counter() - began) * 1e3
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / len(inputs), host_ms


def report_samples(label, results):
    times = [t for t, _ in results]
    median = statistics.median(times)
    slow = [(i, t, h) for i, (t, h) in enumerate(results) if t > 3 * median]
    print(f"  {label}: {len(times)} samples, median {median:.2f} us/call, mean {statistics.mean(times):.2f}, "
          f"{len(slow)} over 3x the median" + "".join(f"\n    sample {i}: {t:.1f} us/call, host {h:.2f} ms"
                                                        for i, t, h in slow))


def main():
    cases = read_test_file(sys.argv[1])
    samples = int(sys.argv[2])
    custom_kernel = harness.load_submission().custom_kernel
    for index in [int(i) for i in sys.argv[3:]]:
        print(f"benchmark {index}")
        inputs = harness.benchmark_inputs(cases[index].args)
        for data in inputs:
            custom_kernel(data)
        sample(custom_kernel, inputs)
        report_samples("events", [sample(custom_kernel, inputs) for _ in range(samples)])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            profiled = [sample(custom_kernel, inputs) for _ in range(samples)]
        report_samples("profiled", profiled)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                kernels = sorted((e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"),
                                 key=lambda e: e["ts"])
        ours = lambda k: not any(name in k["name"] for name in FLUSH_KERNELS)
        long_kernels = [k for k in kernels if ours(k) and k["dur"] > 1000]
        gaps = [(a, b) for a, b in zip(kernels, kernels[1:])
                if ours(a) and ours(b) and b["ts"] - (a["ts"] + a["dur"]) > 1000]
        print(f"  profiled kernels: {len(kernels)}, of ours over 1 ms: {len(long_kernels)}, gaps over 1 ms "
              f"between two of ours: {len(gaps)}")
        for k in long_kernels[:10]:
            print(f"    long kernel {k['name'][:60]} {k['dur']:.0f} us")
        for a, b in gaps[:10]:
            print(f"    gap {b['ts'] - a['ts'] - a['dur']:.0f} us after {a['name'][:40]} before {b['name'][:40]}")


if __name__ == "__main__":
    main()
