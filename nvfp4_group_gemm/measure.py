"""Running, checking and timing one case as the leaderboard does, and the figures derived from a run.

`run_single_test` and `run_single_benchmark` are what the leaderboard's protocol runs in its worker process
(eval.py) and what the people's commands run in process (cli.py): generate, run, check; time 15 inputs back to
back per sample after the leaderboard's L2 flush. `b200_speed_of_light_ns` is the problem statement's figure.
"""
import contextlib
import dataclasses
import gc
import json
import math
import os
import time
from typing import NamedTuple, Optional

from nvfp4_group_gemm.harness import NUM_INPUTS_PER_BENCHMARK, benchmark_inputs, clone_data, flush_l2, load_submission


# B200 speed of light as the problem statement computes it: at 1.5 GHz, the
# larger of FP4 tensor-core time and DRAM time. 7.68 TB/s reproduces the
# statement's four figures to 0.02 % (all four are DRAM-bound); the FP4 rate
# assumes 148 SMs x 32768 dense FP4 FLOP per clock.
B200_DRAM_BYTES_PER_S = 7.68e12


B200_FP4_FLOPS = 148 * 32768 * 1.5e9


@dataclasses.dataclass
class Stats:
    runs: int
    mean: float
    std: float
    err: float
    best: float
    worst: float


def calculate_stats(durations: list) -> Stats:
    runs = len(durations)
    mean = sum(durations) / runs
    std = math.sqrt(sum((x - mean) ** 2 for x in durations) / (runs - 1)) if runs > 1 else 0.0
    return Stats(runs=runs, mean=mean, std=std, err=std / math.sqrt(runs),
                 best=float(min(durations)), worst=float(max(durations)))


def flops_of(sizes) -> int:
    return sum(2 * m * n * k * l for m, n, k, l in sizes)


def dram_bytes_of(sizes) -> int:
    """Each input read once, C written once: A and B at 1/2 byte, scales at 1/16, C at 2."""
    return sum(l * (m * k // 2 + n * k // 2 + m * k // 16 + n * k // 16 + 2 * m * n)
               for m, n, k, l in sizes)


def geometric_mean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def b200_speed_of_light_ns(sizes) -> float:
    return 1e9 * max(flops_of(sizes) / B200_FP4_FLOPS, dram_bytes_of(sizes) / B200_DRAM_BYTES_PER_S)


class Card(NamedTuple):
    """A GPU's floor rates for this task: the dense multiply rate its kernel runs at (Hopper: fp16 wgmma, the
    FP4 operands converted; the B200: FP4) and its HBM bandwidth, both from NVIDIA's data sheets."""
    name: str
    flops_per_s: float
    bytes_per_s: float


CARDS = (Card("B200", B200_FP4_FLOPS, B200_DRAM_BYTES_PER_S),
         Card("H200", 989e12, 4.8e12),  # SXM: fp16 dense 989 TFLOP/s, 4.8 TB/s
         Card("H100", 989e12, 3.35e12))  # SXM (HBM3): fp16 dense 989 TFLOP/s, 3.35 TB/s


def card_of(device_name: str) -> Optional[Card]:
    """The card a device name (torch.cuda.get_device_name) names, or None (no floor known)."""
    return next((card for card in CARDS if card.name in device_name), None)


def floor_us(sizes, card: Card) -> float:
    """The shape set's floor on `card`: its real FLOPs at the card's multiply rate, or its operand and output
    bytes (`dram_bytes_of`) at its HBM bandwidth, whichever takes longer."""
    return 1e6 * max(flops_of(sizes) / card.flops_per_s, dram_bytes_of(sizes) / card.bytes_per_s)


# =============================================================================
# Work done in the worker process (or in-process for the people's CLI)
# =============================================================================
def describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def run_single_test(args: dict):
    """(passed, message) for one test case: generate, run once, check."""
    import torch
    from nvfp4_group_gemm.reference import check_implementation, generate_input
    try:
        custom_kernel = load_submission().custom_kernel
        data = generate_input(**args)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        output = custom_kernel(clone_data(data))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return check_implementation(data, output)
    except Exception as error:  # reported as this case's failure, the run goes on
        return False, describe_error(error)


class SampleTrace:
    """With SAMPLE_TRACE_ENV naming a file: one JSON line per timed sample of `run_single_benchmark` (the
    benchmark's sizes, sample index, GPU us per call, host ms of the timed window (start event, 15 calls,
    end event), Python garbage-collector pauses inside it as [generation, ms], and the CUDA caching
    allocator's counters that moved during it: cudaMalloc / cudaFree calls, out-of-memory retries), to find
    what makes one sample stall. Otherwise nothing."""

    def __init__(self, path, args):
        self.path, self.sizes, self.pauses, self.host_ms = path, [args.get(k) for k in ("m", "n", "k")], [], 0.0
        self._gc_start, self.allocator = None, {}

    @classmethod
    def from_environment(cls, args):
        return cls(os.environ.get(SAMPLE_TRACE_ENV) or None, args)

    def _on_gc(self, phase, info):
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._gc_start is not None:
            self.pauses.append([info["generation"], round((time.perf_counter() - self._gc_start) * 1e3, 3)])

    @contextlib.contextmanager
    def sample(self):
        if self.path is None:
            yield
            return
        self.pauses, before, began = [], allocator_counters(), time.perf_counter()
        gc.callbacks.append(self._on_gc)
        try:
            yield
        finally:
            gc.callbacks.remove(self._on_gc)
            self.host_ms = (time.perf_counter() - began) * 1e3
            after = allocator_counters()
            self.allocator = {k: after[k] - before[k] for k in after if after[k] != before[k]}

    def record(self, index: int, us_per_call: float) -> None:
        if self.path is None:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"sizes": self.sizes, "sample": index, "us_per_call": round(us_per_call / 1000, 3),
                                "host_ms": round(self.host_ms, 3), "gc_pauses": self.pauses,
                                "allocator": self.allocator}) + "\n")


SAMPLE_TRACE_ENV = "NVFP4_SAMPLE_TRACE"


ALLOCATOR_COUNTERS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")


def allocator_counters() -> dict:
    """The CUDA caching allocator's call counters (zeros without CUDA)."""
    import torch
    stats = torch.cuda.memory_stats() if torch.cuda.is_available() else {}
    return {k: stats.get(k, 0) for k in ALLOCATOR_COUNTERS}


def run_single_benchmark(args: dict, recheck: bool, max_repeats: int, max_time_ns: float,
                         progress=None):
    """Stats of one benchmark, timed as the leaderboard does, or an error string.

    One sample: synchronize, flush L2, event, custom_kernel on the 15 inputs back
    to back, event, synchronize; duration / 15. Stops after 3+ samples and 100 ms
    once the standard error is under 0.1 % of the mean, the time budget
    (mean x runs > max_time_ns) is used, or 120 s have passed."""
    import torch
    from nvfp4_group_gemm.reference import check_implementation
    try:
        custom_kernel = load_submission().custom_kernel
        inputs = benchmark_inputs(args)
        check_copy = clone_data(inputs)
        outputs = [custom_kernel(clone_data(data)) for data in inputs]
        for data, output in zip(check_copy, outputs):
            good, message = check_implementation(data, output)
            if not good:
                return message
        if not torch.cuda.is_available():
            return "no CUDA device: benchmarks need a GPU"

        durations = []
        trace = SampleTrace.from_environment(args)
        start_ns = time.perf_counter_ns()
        for i in range(max_repeats):
            torch.cuda.synchronize()
            flush_l2()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with trace.sample():  # the timed window: what delays the host here delays the end event
                start.record()
                outputs = [custom_kernel(data) for data in inputs]
                end.record()
            torch.cuda.synchronize()
            durations.append(start.elapsed_time(end) / NUM_INPUTS_PER_BENCHMARK * 1e6)
            trace.record(i, durations[-1])
            if recheck:
                for data, output in zip(check_copy, outputs):
                    good, message = check_implementation(data, output)
                    if not good:
                        return message
            elapsed = time.perf_counter_ns() - start_ns
            if progress is not None:
                progress(durations)
            if i > 1 and elapsed > 1e8:
                stats = calculate_stats(durations)
                if (stats.err / stats.mean < 0.001 or stats.mean * stats.runs > max_time_ns
                        or elapsed > 120e9):
                    break
        return calculate_stats(durations)
    except Exception as error:
        return describe_error(error)


def run_single_profile(args: dict) -> str:
    """The torch profiler's table for one call, or the error that stopped it."""
    try:
        return _profile_table(args)
    except Exception as error:
        return f"profiling failed: {describe_error(error)}"


def _profile_table(args: dict) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from nvfp4_group_gemm.reference import generate_input
    custom_kernel = load_submission().custom_kernel
    data = generate_input(**args)
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        custom_kernel(clone_data(data))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    sort_by = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=sort_by, row_limit=20)


def short_spec(sizes: list) -> str:
    ms = ",".join(str(m) for m, _, _, _ in sizes)
    ns = sorted({n for _, n, _, _ in sizes})
    ks = sorted({k for _, _, k, _ in sizes})
    return f"G={len(sizes)} M=[{ms}] N={ns} K={ks}"
