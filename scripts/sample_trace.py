"""Per-sample times of eval.py's benchmark loop (in this process, benchmarks in
order as eval.py's worker runs them) with the CUDA caching allocator's counters
after each of the first samples: where one sample stalls, whether the
allocator called cudaMalloc / freed its cache then.
Usage, from the repository root: python3 scripts/sample_trace.py CASES_FILE [INDEX ...]"""
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

import eval as ev  # noqa: E402

cases = ev.read_test_file(sys.argv[1])
keys = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")
for index in [int(i) for i in sys.argv[2:]] or range(len(cases)):
    seen = []

    def progress(durations):
        stats = torch.cuda.memory_stats()
        if len(durations) <= 4 or durations[-1] > 3 * min(durations):
            seen.append(f"  sample {len(durations) - 1}: {durations[-1] / 1000:9.2f} us/call  "
                        + " ".join(f"{k[4:]}={stats.get(k, 0)}" for k in keys))
    result = ev.run_single_benchmark(cases[index].args, False, 100, 1e10, progress=progress)
    print(f"benchmark {index}: mean {result.mean / 1000:.2f} best {result.best / 1000:.2f} "
          f"worst {result.worst / 1000:.2f} us, {result.runs} runs" if hasattr(result, "mean") else result)
    print("\n".join(seen[:12]))
