"""Whether the Hopper kernel's speed is its SMs' own or something they share: custom_kernel on a benchmark with
its persistent grid held to fewer SMs (`submission.sm_count` and `resident_clusters` stood in for; fresh inputs
each time, so the launcher plans anew and drops the last count's plans with their inputs), each time checked
against the reference, timed as the leaderboard times (`peers.time_loop_us`), beside the SM clock and the
board's power draw sampled by nvidia-smi during the timing.

    python scripts/sm_scaling.py [BENCHMARK ...] [--sms 33,66,99,132]     # default: benchmarks 0 1

Read it by "us x SMs": constant where each SM's own work sets the time (half the SMs, twice the time); growing
with the SMs where they wait on something shared (L2 or HBM bandwidth, the power budget and with it the clock,
which the clock column shows). Without a GPU it says so and exits 0."""
import argparse
import statistics
import subprocess
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nvfp4_group_gemm.cli import comma_ints  # noqa: E402


class Sampler:
    """nvidia-smi's SM clock (MHz) and power draw (W) every 50 ms while in use (`with`); means in `clock`, `power`
    (None where nvidia-smi is missing or says nothing)."""

    def __enter__(self):
        self.rows = []
        try:
            self.process = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                                             "--format=csv,noheader,nounits", "-lms", "50"],
                                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.process = None
            return self
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        return self

    def _read(self):
        for line in self.process.stdout:
            self.rows.append(parse_sample(line))

    def __exit__(self, *exc):
        if self.process is not None:
            self.process.terminate()
            self.process.wait()
            self.reader.join(timeout=2)
        samples = [r for r in self.rows if r is not None]
        self.clock = statistics.mean(c for c, _ in samples) if samples else None
        self.power = statistics.mean(p for _, p in samples) if samples else None
        return False


def parse_sample(line: str):
    """"1755, 612.34" -> (1755.0, 612.34); None for anything else."""
    try:
        clock, power = (float(x) for x in line.split(","))
    except ValueError:
        return None
    return clock, power


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmarks", nargs="*", type=int, default=[0, 1])
    parser.add_argument("--sms", type=comma_ints(1), default=[33, 66, 99, 132],
                        help="grid sizes (SMs), comma-separated")
    options = parser.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to time")
        return 0
    from nvfp4_group_gemm import submission as shared
    from nvfp4_group_gemm.casefile import BENCHMARKS_FILE, read_test_file
    from nvfp4_group_gemm.harness import benchmark_inputs, load_submission
    from nvfp4_group_gemm.peers import time_loop_us
    from nvfp4_group_gemm.reference import check_implementation
    submission = load_submission()
    device_sms = shared.sm_count(torch.cuda.current_device())
    counts = sorted({min(n, device_sms) for n in options.sms})
    cases = read_test_file(BENCHMARKS_FILE)
    failed = False
    print(f"{torch.cuda.get_device_name()}: {device_sms} SMs")
    print(f"  {'case':>4} {'SMs':>4} {'us':>9} {'us x SMs / all':>15} {'SM MHz':>7} {'W':>6}")
    for index in options.benchmarks:
        for n in counts:
            shared.sm_count = lambda device_index, n=n: n
            shared.resident_clusters = lambda device_index, size, n=n: max(1, n // size)
            inputs = benchmark_inputs(cases[index].args)
            ok, message = check_implementation(inputs[0], submission.custom_kernel(inputs[0]))
            if not ok:
                failed = True
                print(f"  {index:>4} {n:>4}  WRONG: {message[:200]}", flush=True)
                continue
            with Sampler() as sampled:
                us = time_loop_us(submission.custom_kernel, inputs)
            clock = f"{sampled.clock:7.0f}" if sampled.clock else f"{'-':>7}"
            power = f"{sampled.power:6.0f}" if sampled.power else f"{'-':>6}"
            print(f"  {index:>4} {n:>4} {us:>9.2f} {us * n / device_sms:>15.2f} {clock} {power}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
