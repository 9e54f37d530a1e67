"""Where a warm call's host time goes: custom_kernel on the leaderboard's input, and the MoE op
(`moe.grouped_mm_nvfp4`) on the same data stacked, each called CALLS times on the same input (the plan
found, nothing compiled), under cProfile; prints host microseconds per call (wall clock around the calls,
before the final synchronize) and the functions with the most own time per call.

    python scripts/host_profile.py [BENCHMARK ...] [--calls N] [--top N]     # default: benchmarks 0 1

On a CPU the kernels cannot launch: it says so and exits 0 (nothing to profile)."""
import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def profile(label: str, call, calls: int, top: int) -> None:
    import torch
    call()  # warm: compiled, planned
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    torch.cuda.synchronize()
    print(f"\n{label}: {host:.1f} us of host time per warm call ({calls} calls)")
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:top]  # by own time
    for (path, line, name), (_, ncalls, own, cumulative, _) in rows:
        print(f"  {own / calls * 1e6:7.2f} us own {cumulative / calls * 1e6:7.2f} us cum "
              f"{ncalls / calls:5.1f}/call  {Path(path).name}:{line} {name}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmarks", nargs="*", type=int, default=[0, 1])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--top", type=int, default=15)
    options = parser.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to profile (the kernels launch only on a GPU)")
        return 0
    from nvfp4_group_gemm import moe
    from nvfp4_group_gemm.casefile import BENCHMARKS_FILE, read_test_file
    from nvfp4_group_gemm.harness import load_submission
    from nvfp4_group_gemm.moe_report import stacked_inputs
    from nvfp4_group_gemm.reference import generate_input
    submission = load_submission()
    cases = read_test_file(BENCHMARKS_FILE)
    for index in options.benchmarks:
        data = generate_input(**cases[index].args)
        stacked = stacked_inputs(data)
        profile(f"benchmark {index}: custom_kernel", lambda: submission.custom_kernel(data), options.calls,
                options.top)
        profile(f"benchmark {index}: grouped_mm_nvfp4", lambda: moe.grouped_mm_nvfp4(*stacked,
                                                                                    out_dtype=torch.float16),
                options.calls, options.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
