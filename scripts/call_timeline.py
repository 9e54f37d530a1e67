"""Where the GPU time of the leaderboard's timing loop goes, kernel by kernel.

Run from the root of a tree (this one or an older one: the tree's own
custom_kernel is imported from the working directory):
    python3 path/to/call_timeline.py CASES_FILE [INDEX ...]
For each benchmark: its 15 inputs, every one called once (plans built), then
the leaderboard's loop once without and once under torch.profiler (CUDA
activity only): flush the L2, 15 calls back to back. Prints the loop's GPU
time per call (CUDA events, unprofiled), and from the profiled loop each
kernel's mean duration and the mean gap from one kernel's end to the next
one's start (negative where programmatic dependent launch overlaps them).
The profiler may change the overlap it measures; the unprofiled time is the
score's measure."""
import json
import os
import sys
import tempfile
from collections import defaultdict

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402

from nvfp4_group_gemm import harness  # noqa: E402
from nvfp4_group_gemm.casefile import read_test_file  # noqa: E402


def loop(custom_kernel, inputs):
    harness.flush_l2()
    for data in inputs:
        custom_kernel(data)


def kernel_events(trace_path):
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    return sorted(kernels, key=lambda e: e["ts"])


def short_name(name: str) -> str:
    for key in ("convert_tokens", "tensormap_builder", "kernel_cutlass_kernel", "elementwise", "randn", "normal"):
        if key in name:
            return key
    return name[:40]


def main():
    cases = read_test_file(sys.argv[1])
    wanted = [int(i) for i in sys.argv[2:]] or list(range(len(cases)))
    custom_kernel = harness.load_submission().custom_kernel
    for index in wanted:
        inputs = harness.benchmark_inputs(cases[index].args)
        for data in inputs:
            custom_kernel(data)
        loop(custom_kernel, inputs)  # warm
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(5):
            harness.flush_l2()
            start.record()
            for data in inputs:
                custom_kernel(data)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1000 / len(inputs))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            loop(custom_kernel, inputs)
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            kernels = [k for k in kernel_events(path) if short_name(k["name"]) not in ("randn", "normal")]
        durations, gaps = defaultdict(list), defaultdict(list)
        for previous, k in zip([None] + kernels, kernels):
            durations[short_name(k["name"])].append(k["dur"])
            if previous is not None:
                gaps[f"{short_name(previous['name'])} -> {short_name(k['name'])}"].append(
                    k["ts"] - (previous["ts"] + previous["dur"]))
        span = (kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]) / len(inputs) if kernels else 0
        print(f"benchmark {index}: events {min(times):.2f} us/call (min of 5; mean {sum(times) / 5:.2f}); "
              f"profiled span {span:.2f} us/call, {len(kernels)} kernels")
        for name, values in durations.items():
            print(f"  kernel {name:24s} x{len(values):3d} mean {sum(values) / len(values):7.2f} us")
        for name, values in gaps.items():
            print(f"  gap {name:40s} x{len(values):3d} mean {sum(values) / len(values):6.2f} us "
                  f"min {min(values):6.2f} max {max(values):6.2f}")


if __name__ == "__main__":
    main()
