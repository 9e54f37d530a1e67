"""Run, check, time and compile `submission.py`, here as on the leaderboard.

Leaderboard protocol (what the GPU MODE runner does; docs/contract.md):

    POPCORN_FD=3 python eval.py {test|benchmark|leaderboard|profile} FILE 3>result.txt

People:

    python eval.py                    # tests, then benchmarks, then a table per case
    python eval.py tests [--case I]   # only the task's tests (or case I of them)
    python eval.py benchmarks [--case I]
    python eval.py --shape "m: [64, 200]; n: [256, 512]; k: [512, 256]; g: 2; seed: 7"
    python eval.py compile            # compile the B200 kernel for sm_100a; plan every task shape
    python eval.py model              # the cost model's choice and modeled B200 time (model figures)
    python eval.py overhead           # host microseconds per custom_kernel call
    python eval.py sweep [--only PART] [--diagnose]   # Hopper GPU: hopper.py's configurations vs grouped_mm

`compile` needs no GPU: CuTe DSL compiles for the architecture CUTE_DSL_ARCH
names; the PTX goes through `ptxas -v` for registers and spills (the ptxas of
the nvidia-cuda-nvcc wheel unless PTXAS or PATH names another; toolchain.py),
and the results are cached. A bad command line is one line on stderr and exit
2, before anything is imported or compiled. Installed, the console command
`nvfp4-group-gemm` is this file's `main`.
"""
import argparse
import base64
import contextlib
import dataclasses
import gc
import itertools
import json
import math
import multiprocessing
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Optional

from nvfp4_group_gemm.casefile import (SHAPE_RULES, SPEC_EXAMPLE, BadCase, MalformedTestFile,  # noqa: F401
                                       TestCase, check_case, combine_seeds, parse_shape, parse_test_line,
                                       problem_sizes_of, read_test_file)
from nvfp4_group_gemm import toolchain
from nvfp4_group_gemm.harness import (NUM_INPUTS_PER_BENCHMARK, benchmark_inputs, clone_data, flush_description,
                                      flush_l2, load_submission)

# As on the leaderboard: nothing the DSL compiled is reused from disk (the compile gate's own cache keeps
# ptxas reports, not binaries).
os.environ["CUTE_DSL_DISABLE_FILE_CACHING"] = "1"

ROOT = Path(__file__).resolve().parent
TESTS_FILE = ROOT / "cases" / "tests.txt"
BENCHMARKS_FILE = ROOT / "cases" / "benchmarks.txt"

H100_SM_COUNT = 132  # the smaller of the H100 and H200 (both 132 SMs), for Hopper plans

EXIT_OK, EXIT_BAD_ARGS, EXIT_FAILED = 0, 2, 112

# B200 speed of light as the problem statement computes it: at 1.5 GHz, the
# larger of FP4 tensor-core time and DRAM time. 7.68 TB/s reproduces the
# statement's four figures to 0.02 % (all four are DRAM-bound); the FP4 rate
# assumes 148 SMs x 32768 dense FP4 FLOP per clock.
B200_DRAM_BYTES_PER_S = 7.68e12
B200_FP4_FLOPS = 148 * 32768 * 1.5e9


# =============================================================================
# Statistics and speed of light
# =============================================================================
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


# =============================================================================
# Leaderboard protocol
# =============================================================================
class PopcornOutput:
    def __init__(self, fd: int):
        self.file = os.fdopen(fd, "w")
        os.set_inheritable(fd, False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()

    def log(self, key, value):
        print(f"{key}: {value}", file=self.file, flush=True)


def _init_worker():
    os.environ["CUTE_DSL_DISABLE_FILE_CACHING"] = "1"


def log_stats(logger, prefix: str, stats: Stats):
    for field in dataclasses.fields(Stats):
        logger.log(f"{prefix}.{field.name}", getattr(stats, field.name))


def protocol_test(logger, pool, cases) -> int:
    passed = True
    logger.log("test-count", len(cases))
    for i, case in enumerate(cases):
        logger.log(f"test.{i}.spec", case.spec)
        good, message = pool.apply(run_single_test, (case.args,))
        if good:
            logger.log(f"test.{i}.status", "pass")
            if message:
                logger.log(f"test.{i}.message", message)
        else:
            logger.log(f"test.{i}.status", "fail")
            logger.log(f"test.{i}.error", message)
            passed = False
    logger.log("check", "pass" if passed else "fail")
    return EXIT_OK if passed else EXIT_FAILED


def protocol_benchmark(logger, pool, cases, leaderboard: bool) -> int:
    if not cases:
        logger.log("benchmark-count", 0)
        logger.log("check", "pass")
        return EXIT_OK
    if leaderboard:  # warm up every benchmark, then time each with rechecks
        for case in cases:
            pool.apply(run_single_benchmark, (case.args, False, 50, 5e8))
        recheck, budget_ns = True, 30e9
    else:  # warm up on the first benchmark
        pool.apply(run_single_benchmark, (cases[0].args, False, 100, 1e8))
        recheck, budget_ns = False, 10e9
    passed = True
    logger.log("benchmark-count", len(cases))
    for i, case in enumerate(cases):
        logger.log(f"benchmark.{i}.spec", case.spec)
        result = pool.apply(run_single_benchmark, (case.args, recheck, 100, budget_ns))
        if isinstance(result, Stats):
            log_stats(logger, f"benchmark.{i}", result)
        else:
            passed = False
            logger.log(f"benchmark.{i}.status", "fail")
            logger.log(f"benchmark.{i}.error", result)
            if leaderboard:
                break
    logger.log("check", "pass" if passed else "fail")
    return EXIT_OK if passed else EXIT_FAILED


def protocol_profile(logger, pool, cases) -> int:
    logger.log("benchmark-count", len(cases))
    for i, case in enumerate(cases):
        logger.log(f"benchmark.{i}.spec", case.spec)
        report = pool.apply(run_single_profile, (case.args,))
        logger.log(f"benchmark.{i}.report",
                   base64.b64encode(report.encode("utf-8"), b"+*").decode("utf-8"))
    logger.log("check", "pass")
    return EXIT_OK


PROTOCOL_MODES = ("test", "benchmark", "leaderboard", "profile")


class UsageError(Exception):
    """A command line that cannot run: said in one line, exit EXIT_BAD_ARGS, before anything is compiled."""


def protocol_main(argv: list) -> int:
    mode = argv[0]
    fd = os.getenv("POPCORN_FD")
    if not fd:
        raise UsageError(f"{mode}: POPCORN_FD is not set. '{mode}' is a leaderboard protocol mode "
                         f"(POPCORN_FD=3 python eval.py {mode} cases/tests.txt 3>result.txt); "
                         "for the task's tests on this machine run 'python eval.py tests'")
    if len(argv) != 2:
        raise UsageError(f"{mode}: expected one test file (POPCORN_FD=N python eval.py {mode} FILE), "
                         f"got {len(argv) - 1} arguments")
    path = argv[1]
    seed = os.getenv("POPCORN_SEED")
    os.environ.pop("POPCORN_SEED", None)
    try:
        seed = int(seed) if seed else None
    except ValueError:
        raise UsageError(f"{mode}: POPCORN_SEED={seed!r} is not an integer") from None
    try:
        cases = read_test_file(path, seed, check=True)
    except MalformedTestFile as error:
        raise UsageError(f"{mode}: {error}") from None
    with PopcornOutput(int(fd)) as logger:
        context = multiprocessing.get_context("spawn")
        with context.Pool(1, initializer=_init_worker) as pool:
            if mode == "test":
                return protocol_test(logger, pool, cases)
            if mode == "profile":
                return protocol_profile(logger, pool, cases)
            return protocol_benchmark(logger, pool, cases, leaderboard=(mode == "leaderboard"))


# =============================================================================
# Compile for B200 without a GPU
# =============================================================================
class PtxasTooOld(RuntimeError):
    """The PTX is newer than the ptxas at hand (the DSL's CUDA 13 builds emit newer PTX)."""


PTXAS_TOO_OLD = re.compile(r"Unsupported \.version (\S+); current version is '([^']+)'")
PTXAS_USED = re.compile(r"Used (\d+) registers")
PTXAS_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
PTXAS_SMEM = re.compile(r"(\d+) bytes smem")
# ptxas's "Potential Performance Loss: wgmma.mma_async instructions are serialized" (C7512)
PTXAS_WGMMA_SERIALIZED = re.compile(r"C7512|wgmma\.mma_async instructions are serialized")


def ptxas_report(ptx: str, arch: str, ptxas: str) -> dict:
    """Registers, static shared memory, stack and spill bytes of every kernel in `ptx`."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx.replace("\x00", ""))  # some DSL releases end the PTX with a NUL
        done = subprocess.run([ptxas, f"-arch={arch}", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True)
    if done.returncode != 0:
        too_old = PTXAS_TOO_OLD.search(done.stderr)
        if too_old:
            raise PtxasTooOld(f"{ptxas} reads PTX up to {too_old[2]}, this PTX is {too_old[1]}: "
                              "point PTXAS at a ptxas from a newer CUDA")
        raise RuntimeError(f"ptxas failed: {done.stderr.strip()[-2000:]}")
    text = done.stderr
    used = [int(u[1]) for u in PTXAS_USED.finditer(text)]
    spills = [tuple(map(int, s.groups()[:3])) for s in PTXAS_SPILLS.finditer(text)]
    smem = PTXAS_SMEM.search(text)
    if not used or not spills:
        raise RuntimeError(f"unexpected ptxas output: {text[-2000:]}")
    # where a PTX file holds several kernels: the most registers, all spills
    return {"registers": max(used), "static_smem_bytes": int(smem[1]) if smem else 0,
            "stack_bytes": max(s[0] for s in spills), "spill_store_bytes": sum(s[1] for s in spills),
            "spill_load_bytes": sum(s[2] for s in spills), "kernels": len(used),
            "wgmma_serialized": PTXAS_WGMMA_SERIALIZED.search(text) is not None}


def ptx_text(compiled) -> str:
    """The PTX the DSL kept: its text, or (some releases and settings) the path
    of the file it was dumped to."""
    ptx = compiled.artifacts.PTX or ""
    if ptx and not ptx.lstrip().startswith(("//", ".")):
        path = Path(ptx.strip())
        if not path.is_file():
            raise RuntimeError(f"the DSL names a PTX file that does not exist: {path}")
        ptx = path.read_text()
    return ptx


# What the B200 kernel's PTX must contain (name: pattern). Counts go into the report.
PTX_FEATURES = {
    "block_scaled_fp4_mma": r"tcgen05\.mma\.cta_group::[12]\.kind::mxf4nvf4\.block_scale\.(?:block16|scale_vec::4X)",
    "tma_load": r"cp\.async\.bulk\.tensor\.\dd\.shared::(?:cta|cluster)\.global\.tile\.mbarrier",
    "tma_store": r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta",
    "tensormap_replace": r"tensormap\.replace",
    "tensormap_release": r"tensormap\.cp_fenceproxy\.global\.shared::cta\.tensormap::generic\.release",
    "tensormap_acquire": r"fence\.proxy\.tensormap::generic\.acquire",
    "tensormap_prefetch": r"prefetch\.(?:global\.)?tensormap",
    "pdl_wait": r"griddepcontrol\.wait",
    "pdl_launch_dependents": r"griddepcontrol\.launch_dependents",
    "scale_factor_copy": r"tcgen05\.cp\.cta_group::[12]",
    "tmem_load": r"tcgen05\.ld\.sync",
    "tmem_alloc": r"tcgen05\.alloc\.cta_group::[12]",
    # 2-CTA configurations: the MMA over a pair, 2-SM TMA loads (completing on the leader's barrier, the peer
    # bit of its shared::cluster address cleared: and.b32 with 0xFEFFFFF8), multicast loads, the cluster barrier
    "pair_mma": r"tcgen05\.mma\.cta_group::2\.",
    "pair_tma_load": r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global\.tile\.mbarrier::complete_tx::bytes"
                     r"(?:\.multicast::cluster)?(?:\.L2::cache_hint)?\.cta_group::2",
    "multicast_tma_load": r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global\.tile\.mbarrier::complete_tx::bytes"
                          r"\.multicast::cluster",
    "leader_barrier_address": r"and\.b32\s+%r\d+, %r\d+, -16777224;",
    "cluster_barrier": r"barrier\.cluster\.wait",
    "pair_commit": r"tcgen05\.commit\.cta_group::2\.mbarrier::arrive::one\.shared::cluster\.multicast::cluster",
    "remote_arrive": r"mapa\.shared::cluster",
    "mbarrier_init": r"mbarrier\.init\.shared",
    # the Hopper kernel (hopper.py)
    "wgmma": r"wgmma\.mma_async",
    "e4m3_to_f16x2": r"cvt\.rn\.f16x2\.e4m3x2",
    "bulk_copy_load": r"cp\.async\.bulk\.shared::(?:cta|cluster)\.global",
    "integer_divisions": r"\b(?:div|rem)\.[su]32\b",  # run-time divisions (the tile scheduler's)
}
PTX_THREADS = re.compile(r"\.reqntid (\d+), 1, 1")


def acquires_before_waits(ptx: str) -> list:
    """Per `griddepcontrol.wait`, in text order: the descriptor acquire fences since the entry's start or the
    previous griddepcontrol instruction (those a role issues before it waits for the previous kernel)."""
    counts = []
    for entry in re.split(r"\.entry\s", ptx)[1:]:
        pieces = re.split(r"(griddepcontrol\.\w+)", entry)
        for before, instruction in zip(pieces[0::2], pieces[1::2]):
            if instruction == "griddepcontrol.wait":
                counts.append(len(re.findall(PTX_FEATURES["tensormap_acquire"], before)))
    return counts


def ptx_features(ptx: str) -> dict:
    found = {name: len(re.findall(pattern, ptx)) for name, pattern in PTX_FEATURES.items()}
    found["acquires_before_waits"] = acquires_before_waits(ptx)
    threads = [int(t) for t in PTX_THREADS.findall(ptx)]
    found["threads_per_cta"] = max(threads) if threads else None  # the GEMM kernel's (the largest)
    return found


def file_stem(config_name: str) -> str:
    """A configuration name as a file name ("128x128/contiguous" -> "128x128@contiguous")."""
    return config_name.replace("/", "@")


def compile_one(config_name: str, arch: str, keep_dir: Optional[str]) -> dict:
    """Compile one tile configuration in this process; a result dict.

    Must run in a fresh process: CuTe DSL takes its target from CUTE_DSL_ARCH,
    and some releases (4.3.x) compile once and then stop at cuInit without a GPU,
    leaving only the PTX in the dump folder."""
    import tempfile
    dump_dir = tempfile.mkdtemp(prefix="nvfp4-compile-")
    os.environ.update(CUTE_DSL_ARCH=arch, CUTE_DSL_KEEP="ptx", CUTE_DSL_KEEP_PTX="1",
                      CUTE_DSL_DUMP_DIR=dump_dir)
    import importlib.metadata
    from nvfp4_group_gemm import submission
    row = {"config": config_name, "arch": arch, "ok": False,
           "cutlass_dsl": importlib.metadata.version("nvidia-cutlass-dsl")
           if _has_distribution("nvidia-cutlass-dsl") else "?"}
    start = time.perf_counter()
    ptx, stopped_at = "", None
    hopper = None
    if is_hopper_arch(arch):
        from nvfp4_group_gemm import hopper
    config = config_named(config_name, arch)
    kernel = config.make_kernel()
    try:
        compiled = submission.compile_with_placeholders(kernel)
        ptx = ptx_text(compiled)
        # Whether launches can skip the DSL's per-call argument conversion
        # (submission.HostFunction); checked on the CPU against this release.
        row["direct_host_arguments"] = submission.argument_layout_matches(compiled)
    except Exception as error:  # 4.3.x: PTX written, then cuInit fails without a GPU
        stopped_at = describe_error(error)
    builder_ptx = ""
    if not stopped_at:  # the descriptor builder, the plan's other host function
        try:
            builder_ptx = ptx_text(submission.compile_with_placeholders(kernel.build_tensormaps))
        except Exception as error:
            row["builder_error"] = describe_error(error)
    row["compile_s"] = round(time.perf_counter() - start, 3)
    if not ptx:
        dumped = sorted(Path(dump_dir).glob("*.ptx"))
        ptx = dumped[-1].read_text() if dumped else ""
    if stopped_at:
        row["stopped"] = stopped_at[:300]
    try:
        if not ptx:
            raise RuntimeError(f"no PTX: {stopped_at or 'the DSL kept none'}")
        row.update(stages_ab=kernel.num_ab_stages, stages_acc=getattr(kernel, "num_acc_stages", None),
                   stages_c=getattr(kernel, "num_c_stages", None), dynamic_smem_bytes=kernel.smem_bytes,
                   cluster=list(getattr(kernel, "launch_cluster", (1, 1, 1))))  # the GEMM's launch
        row["ptx_features"] = ptx_features(ptx)
        if keep_dir:
            Path(keep_dir).mkdir(parents=True, exist_ok=True)
            row["ptx_file"] = str(Path(keep_dir) / f"{file_stem(config_name)}.{arch}.ptx")
            Path(row["ptx_file"]).write_text(ptx.replace("\x00", ""))
        found = toolchain.find_ptxas()
        if found is None:
            raise RuntimeError(PTXAS_MISSING)
        ptxas = row["ptxas"] = found.path
        row.update(ptxas_report(ptx, arch, ptxas))
        if builder_ptx:
            row["builder_ptx_features"] = ptx_features(builder_ptx)
            builder = ptxas_report(builder_ptx, arch, ptxas)
            row.update(builder_registers=builder["registers"],
                       builder_spill_bytes=builder["spill_store_bytes"] + builder["spill_load_bytes"])
            if keep_dir:
                row["builder_ptx_file"] = str(Path(keep_dir) / f"{file_stem(config_name)}.{arch}.builder.ptx")
                Path(row["builder_ptx_file"]).write_text(builder_ptx.replace("\x00", ""))
        row["ok"] = (row["spill_store_bytes"] == 0 and row["spill_load_bytes"] == 0
                     and row.get("builder_spill_bytes", 0) == 0)
        if "builder_error" in row:
            row["ok"] = False
            row["error"] = "descriptor builder: " + row["builder_error"]
        elif not row["ok"]:
            row["error"] = "register spills"
        elif row["wgmma_serialized"]:  # ptxas waits for every wgmma: no overlap with the conversion
            row["ok"] = False
            row["error"] = "ptxas serializes the wgmma instructions (C7512: not enough registers)"
        if hopper:
            # a CTA must fit an SM's registers (ptxas caps them by warps per scheduler)
            row.update(tile_k=kernel.config.tile_k, register_budget=hopper.register_budget())
            if row["registers"] > row["register_budget"]:
                row["ok"] = False
                row["error"] = f"{row['registers']} registers: one CTA per SM allows {row['register_budget']}"
    except Exception as error:
        row["error"] = describe_error(error)
    return row


def _has_distribution(name: str) -> bool:
    import importlib.metadata
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def is_hopper_arch(arch: str) -> bool:
    return arch.startswith("sm_90")


def kernel_configs(arch: str) -> list:
    """The configurations compiled for `arch`: every B200 tile configuration,
    or every configuration of the Hopper kernel, each round-robin and with
    contiguous tile ranges (compiled in; the rest of a schedule is host side)."""
    from nvfp4_group_gemm import submission
    if is_hopper_arch(arch):
        from nvfp4_group_gemm import hopper
        candidates = [hopper.with_schedule(c, s) for c in hopper.SM90_CONFIGS.values()
                      for s in (submission.Schedule(), submission.Schedule(contiguous=True))]
    else:  # every configuration CONFIG_POLICY may name: the cost model's and the 2-CTA ones
        candidates = submission.policy_candidates()
    kernels = {}  # one per compiled form (`kernel_name`)
    for c in candidates:
        name = kernel_name(c)
        kernels.setdefault(name, dataclasses.replace(c, name=name, schedule=c.compile_key.schedule))
    return list(kernels.values())


def config_named(name: str, arch: str):
    """A configuration of `arch` by name, "NAME/SCHEDULE" for NAME under a schedule (`submission.Schedule`)."""
    from nvfp4_group_gemm import submission
    base, _, schedule = name.partition("/")
    config = {c.name: c for c in kernel_configs(arch)}[base]  # a tile configuration (round-robin)
    if schedule:
        config = dataclasses.replace(config, name=name, schedule=submission.Schedule.from_name(schedule))
    return config


def hopper_choice():
    """custom_kernel's choice per shape set on sm_90 (hopper.launcher_for_setting without a setting)."""
    from nvfp4_group_gemm import hopper
    return hopper.launcher_for_setting(None).choose


PTXAS_MISSING = ("ptxas not found: install this package's dependencies (pip install -e .; nvidia-cuda-nvcc "
                 "carries ptxas), or name one with PTXAS or put CUDA 13's bin on PATH")
# What a compiled kernel and its report depend on, besides the configuration, the architecture and the tools.
KERNEL_SOURCES = ("submission.py", "hopper.py", "eval.py")


def compile_in_process(name: str, arch: str, keep_dir: Optional[str]) -> dict:
    """`compile_one` in a fresh interpreter (the DSL takes its target at first use)."""
    args = [sys.executable, "-W", "ignore", str(ROOT / "eval.py"), "compile-one", name, "--arch", arch]
    if keep_dir:
        args += ["--keep", os.path.abspath(keep_dir)]
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True)
    try:
        row = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        row = {"config": name, "arch": arch, "ok": False,
               "error": f"compile process failed: {(done.stderr or done.stdout)[-1500:]}"}
    row["process_s"] = round(time.perf_counter() - start, 3)  # the process's start and imports included
    return row


def compile_configs(arch: str, keep_dir: Optional[str], names: Optional[list] = None,
                    cache: Optional[toolchain.ResultCache] = None, report=None) -> list:
    """Compile the configurations `names` (default: all) for `arch`, each in its own process, a few at a time;
    `report(done, total, row)` as each finishes. Results come from `cache` where it has them, and ok ones go
    into it; with `keep_dir`, which needs the PTX, everything compiles and nothing is cached."""
    names = [c.name for c in kernel_configs(arch)] if names is None else list(names)
    cache = cache or toolchain.ResultCache(None)
    ptxas = toolchain.find_ptxas()
    facts = (toolchain.dsl_identity(), toolchain.ptxas_version(ptxas.path) if ptxas else "no ptxas")
    here = Path(__file__).resolve().parent
    sources = [path for path in (here / s for s in KERNEL_SOURCES) if path.is_file()]
    sources += [path for path in (here / "nvfp4_group_gemm" / s for s in KERNEL_SOURCES) if path.is_file()]
    keys = {name: cache.key(name, arch, sources, *facts) for name in names}
    rows, finished = {}, 0

    def finish(name: str, row: dict) -> None:
        nonlocal finished
        rows[name], finished = row, finished + 1
        if report:
            report(finished, len(names), row)
    for name in names:
        cached = None if keep_dir else cache.load(keys[name])
        if cached is not None:
            finish(name, dict(cached, cached=True))
    todo = [name for name in names if name not in rows]
    with ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1, 4))) as pool:
        futures = {pool.submit(compile_in_process, name, arch, keep_dir): name for name in todo}
        for future in as_completed(futures):
            name, row = futures[future], future.result()
            if row.get("ok") and not keep_dir:  # a kept run's rows name its PTX files
                cache.store(keys[name], row)
            finish(name, row)
    return [rows[name] for name in names]


def task_shape_sets(which: str = "all") -> list:
    files = {"tests": [TESTS_FILE], "benchmarks": [BENCHMARKS_FILE],
             "all": [TESTS_FILE, BENCHMARKS_FILE]}[which]
    sets = []
    for path in files:
        for i, case in enumerate(read_test_file(path)):
            sets.append((f"{path.stem}[{i}]", problem_sizes_of(case.args)))
    return sets


def contract_shape_sets(count: int = 24, seed: int = 2024) -> list:
    """A spread of contract-valid shape sets: G 1..64, M 1..1024, N multiples of
    128 up to 8192, K multiples of 256 up to 8192 (fixed seed, with the extremes)."""
    import random
    rng = random.Random(seed)
    sets = [("contract[min]", [(1, 128, 256, 1)]),
            ("contract[max]", [(1024, 8192, 8192, 1)] * 64)]
    for i in range(count - 2):
        g = rng.choice([1, 2, 3, 8, 16, 32, 64]) if i % 3 else rng.randint(1, 64)
        sets.append((f"contract[{i}]", [(rng.randint(1, 1024), 128 * rng.randint(1, 64),
                                         256 * rng.randint(1, 32), 1) for _ in range(g)]))
    return sets


def print_compile_table(rows: list):
    width = max([14] + [len(r["config"]) for r in rows])
    print(f"{'config':<{width}} {'compile s':>9} {'regs':>5} {'smem B':>7} {'stages ab/acc/c':>15} "
          f"{'spill B':>7} {'stack B':>7}  status")
    for r in rows:
        spill = r.get("spill_store_bytes", 0) + r.get("spill_load_bytes", 0)
        stages = ("/".join("-" if r[k] is None else str(r[k]) for k in ("stages_ab", "stages_acc", "stages_c"))
                  if "stages_ab" in r else "-")
        print(f"{r['config']:<{width}} {r.get('compile_s', float('nan')):>9.2f} {r.get('registers', '-'):>5} "
              f"{r.get('dynamic_smem_bytes', '-'):>7} {stages:>15} "
              f"{spill if 'registers' in r else '-':>7} {r.get('stack_bytes', '-'):>7}  "
              f"{'ok' if r['ok'] else 'FAIL: ' + r.get('error', '')}"
              + (f" (then: {r['stopped'][:80]})" if r.get("stopped") else ""))


def kernel_name(config) -> str:
    """The compiled kernel serving a configuration (`kernel_configs`): its tile configuration, contiguous or not
    (the rest of a schedule is host side)."""
    return config.name.split("/")[0] + ("/contiguous" if config.schedule.contiguous else "")


def shape_plans(shape_sets: list, fixed_config=None, num_sms: Optional[int] = None, choose=None) -> list:
    """For each shape set: the configuration (the B200 cost model's pick, or
    `choose`'s, unless one is fixed) and its launch plan."""
    from nvfp4_group_gemm import submission
    plans = []
    for name, sizes in shape_sets:
        # the launcher's own plan (device index -1: no device is asked anything)
        shape = submission.shape_plan(tuple(map(tuple, sizes)), -1, num_sms or submission.SM100_SM_COUNT,
                                      fixed_config, choose or submission.choose_config)
        plans.append({"case": name, "groups": len(sizes), "config": shape.config.name,
                      "kernel": kernel_name(shape.config), "tiles": shape.tiles, "ctas": shape.ctas,
                      "problem_sizes": [list(s) for s in sizes]})
    return plans


def ptxas_problem() -> Optional[str]:
    """Why the compile gate cannot run ptxas here, or None."""
    named = os.environ.get("PTXAS")
    if named and not os.access(named, os.X_OK):
        return f"PTXAS={named} is not an executable file"
    return None if toolchain.find_ptxas() else PTXAS_MISSING


def compile_gate(arch: str, shape_sets: list, only_needed: bool, keep_dir: Optional[str] = None,
                 json_path: Optional[str] = None) -> bool:
    """Plan `shape_sets` for `arch`, compile their kernels (`only_needed`) or every configuration, print
    progress, the ptxas report and each plan's verdict; whether everything compiled without spills."""
    problem = ptxas_problem()
    if problem:
        print(f"Compile gate: {problem}.", flush=True)
        return False
    hopper = is_hopper_arch(arch)
    print(f"Compile gate for {arch}: planning {len(shape_sets)} shape set{'s' if len(shape_sets) != 1 else ''}",
          flush=True)
    plans = shape_plans(shape_sets, None, H100_SM_COUNT if hopper else None, hopper_choice() if hopper else None)
    names = [c.name for c in kernel_configs(arch)]
    if only_needed:
        needed = {p["kernel"] for p in plans}
        names = [n for n in names if n in needed]
    ptxas = toolchain.find_ptxas()
    cache = toolchain.ResultCache.from_environment()
    what = "Hopper kernel (hopper.py)" if hopper else "B200 kernel"
    print(f"Compiling the {what} for {arch}: {len(names)} kernel{'s' if len(names) != 1 else ''}, each in its "
          f"own process ({toolchain.dsl_identity().split(' at ')[0]}; ptxas {ptxas.path}, from {ptxas.source}; "
          "no GPU needed)", flush=True)

    def report(done: int, total: int, row: dict) -> None:
        status = ("ok" if row["ok"] else "FAIL") + (" (cached)" if row.get("cached") else
                                                    f" in {row.get('process_s', float('nan')):.1f} s")
        print(f"  [{done}/{total}] {row['config']}: {status}", flush=True)
    rows = compile_configs(arch, keep_dir, names, cache, report)
    print(f"\nptxas -v per kernel (smem B = dynamic shared memory); one kernel per tile configuration serves "
          "every shape set:")
    print_compile_table(rows)
    compiled = {r["config"] for r in rows if r["ok"]}
    picked = ("the configuration and schedule custom_kernel runs (hopper.sm90_choice)"
              if hopper else "the configuration the cost model picks")
    print(f"\nShape sets ({len(plans)}): {picked}, tiles and CTAs; "
          "each is served by the kernel compiled above:")
    for p in plans:
        status = "ok" if p["kernel"] in compiled else "FAIL: its configuration did not compile"
        print(f"  {p['case']:<15} G={p['groups']:<3} {p['config']:<36} tiles {p['tiles']:>5}  "
              f"CTAs {p['ctas']:>3}  {status}")
    if json_path:
        Path(json_path).write_text(json.dumps({"kernels": rows, "shape_sets": plans}, indent=1))
    failed = [r for r in rows if not r["ok"]] + [p for p in plans if p["kernel"] not in compiled]
    cached = sum(bool(r.get("cached")) for r in rows)
    print(f"{len(rows)} kernels, {len(plans)} shape sets, {len(failed)} failures")
    print(f"({cached} of {len(rows)} kernels from the cache; {cache.describe()})", flush=True)
    return not failed


def command_compile(options) -> int:
    if options.shape:
        shape_sets = [("custom", problem_sizes_of(options.shape_args))]
    else:
        shape_sets = task_shape_sets(options.which)
        if options.which == "all":
            shape_sets += contract_shape_sets()
    passed = compile_gate(options.arch, shape_sets, only_needed=bool(options.shape), keep_dir=options.keep,
                          json_path=options.json)
    return EXIT_OK if passed else 1


def compile_one_main(argv: list) -> int:
    """`eval.py compile-one CONFIG [--arch ARCH] [--keep DIR]`: one configuration, its row as JSON (internal:
    what compile_configs runs in a fresh process)."""
    parser = argparse.ArgumentParser(prog="eval.py compile-one")
    parser.add_argument("config")
    parser.add_argument("--arch", default="sm_100a")
    parser.add_argument("--keep")
    options = parser.parse_args(argv)
    print(json.dumps(compile_one(options.config, options.arch, options.keep)))
    return EXIT_OK


# =============================================================================
# Cost model report (model figures, not measurements)
# =============================================================================
# The public B200 results the cost model is fitted to (self-reported; docs/contract.md), each mapped onto a
# configuration and schedule the model expresses. The mappings are this project's reading of the write-ups:
# - "CuTe DSL kernel" (an example-derived CuTe DSL kernel, its final design; 31.0 / 21.1 / 8.8 / 6.5 us): 256x256
#   tiles on a (2,1) cluster (2-CTA MMA) where K = 7168 (benchmark 0), 128x128 elsewhere; each CTA a contiguous
#   block of tiles; 128 of 148 SMs; ready-made descriptors (built once). Its log's earlier geometric means are
#   the same design less the later steps: 16.5 (128x128 everywhere, round-robin, all SMs, descriptors rewritten
#   on the device), 15.9 (+ contiguous), 15.4 (+ 256x256 2-CTA for K = 7168), 14.5 (+ descriptors built once).
# - "gau-nernst" (C++, 27.9 / 19.4 / 8.48 / 6.43 us): 2-CTA MMA with A and B swapped (256 weight rows over the
#   pair; 128 tokens per tile assumed), groups by descending M, round-robin over all SMs, descriptors built once.
# Not expressed by the model: cache policies, SFA multicast, the dynamic-scheduler entries.
PUBLIC_B200_BENCHMARK_US = {"CuTe DSL kernel": (31.0, 21.1, 8.8, 6.5), "gau-nernst": (27.9, 19.4, 8.48, 6.43)}
PUBLIC_B200_LOG_GEOMEAN_US = (("128x128, round-robin, descriptors rewritten", 16.5), ("+ contiguous", 15.9),
                              ("+ 256x256 2-CTA for K = 7168", 15.4), ("+ descriptors built once", 14.5),
                              ("+ 128 of 148 SMs", 13.8))


def public_designs() -> dict:
    """{label: per benchmark (configuration, SMs used, descriptors rewritten)}: the PUBLIC_B200_* designs."""
    from nvfp4_group_gemm import submission
    from nvfp4_group_gemm.submission import Schedule, TileConfig
    square = TileConfig("128x128", 128, 128)
    pair = submission.PAIR_CONFIGS["2cta-256x256"]
    swapped_pair = dataclasses.replace(submission.PAIR_CONFIGS["2cta-swap-256x128"],
                                       schedule=Schedule(groups_by_m=True))

    def log_step(step: int):
        contiguous = Schedule(contiguous=step >= 1)
        configs = [pair if step >= 2 and i == 0 else square for i in range(4)]
        return [(dataclasses.replace(c, schedule=contiguous), 128 if step >= 4 else submission.SM100_SM_COUNT,
                 step < 3) for c in configs]
    designs = {f"log: {label}": log_step(step) for step, (label, _) in enumerate(PUBLIC_B200_LOG_GEOMEAN_US)}
    designs["CuTe DSL kernel"] = log_step(4)
    designs["gau-nernst"] = [(swapped_pair, submission.SM100_SM_COUNT, False)] * 4
    return designs


def public_points() -> list:
    """(label, benchmark index or None for a geometric mean, published us)."""
    points = [(label, i, us) for label, times in PUBLIC_B200_BENCHMARK_US.items() for i, us in enumerate(times)]
    points += [(f"log: {label}", None, us) for label, us in PUBLIC_B200_LOG_GEOMEAN_US[:-1]]
    return points


def modeled_public_points(constants=None) -> list:
    """(label, benchmark or None, published us, modeled us) for every public point under `constants`."""
    from nvfp4_group_gemm import submission
    constants = constants or submission.MODEL_CONSTANTS
    sizes = [problem_sizes_of(c.args) for c in read_test_file(BENCHMARKS_FILE)]
    designs = public_designs()
    per_benchmark = {label: [submission.model_time_us(s, c, sms, rewrite, constants).time_us
                             for s, (c, sms, rewrite) in zip(sizes, design)] for label, design in designs.items()}
    return [(label, i, us, per_benchmark[label][i] if i is not None else geometric_mean(per_benchmark[label]))
            for label, i, us in public_points()]


def model_floor_us(sizes, constants) -> float:
    """What the model allows any design at best: the unique bytes at the sustained DRAM rate, plus the fixed cost
    per call (no CTA's work, no latency)."""
    from nvfp4_group_gemm import submission
    return submission.model_time_us(sizes, submission.TILE_CONFIGS["128x128"], constants=constants).dram_us \
        + constants.fixed_s * 1e6


FIT_BOUNDS = {"dram_efficiency": (0.3, 1.0), "latency_s": (0.2e-6, 5e-6), "tile_overhead_s": (0.0, 2e-6),
              "fixed_s": (0.2e-6, 10e-6), "descriptor_rewrite_s": (0.0, 3e-6)}


def fit_model_constants(iterations: int = 300):
    """The ModelConstants minimizing the squared log residuals over `public_points` (Nelder-Mead over each
    constant's position in FIT_BOUNDS, from the middle of every range; deterministic)."""
    from nvfp4_group_gemm import submission
    names = submission.ModelConstants._fields
    lows, highs = [FIT_BOUNDS[n][0] for n in names], [FIT_BOUNDS[n][1] for n in names]

    def constants_at(x):
        return submission.ModelConstants(*(lo + (hi - lo) * min(1.0, max(0.0, v))
                                           for v, lo, hi in zip(x, lows, highs)))

    def loss(x):
        return sum(math.log(model / published) ** 2
                   for _, _, published, model in modeled_public_points(constants_at(x)))
    n = len(names)
    simplex = [[0.5] * n] + [[0.5 + (0.25 if i == j else 0.0) for j in range(n)] for i in range(n)]
    scored = sorted((loss(x), x) for x in simplex)
    for _ in range(iterations):
        (best, _), (worst, x_worst) = scored[0], scored[-1]
        centroid = [sum(x[j] for _, x in scored[:-1]) / n for j in range(n)]
        toward = lambda t: [c + t * (w - c) for c, w in zip(centroid, x_worst)]
        reflected = toward(-1.0)
        r = loss(reflected)
        if r < best:
            expanded = toward(-2.0)
            e = loss(expanded)
            scored[-1] = (e, expanded) if e < r else (r, reflected)
        elif r < scored[-2][0]:
            scored[-1] = (r, reflected)
        else:
            contracted = toward(0.5)
            c = loss(contracted)
            if c < worst:
                scored[-1] = (c, contracted)
            else:  # shrink toward the best
                x_best = scored[0][1]
                scored = [scored[0]] + [(loss(y), y) for y in
                                        ([b + 0.5 * (v - b) for b, v in zip(x_best, x)] for _, x in scored[1:])]
        scored.sort()
    return constants_at(scored[0][1]), scored[0][0]


def command_model(options) -> int:
    from nvfp4_group_gemm import submission
    cases = [case for _, case in options.bench_cases]
    constants = submission.MODEL_CONSTANTS
    if options.fit:
        constants, loss = fit_model_constants()
        print(f"fitted (squared log residuals {loss:.4f}); to use them, set submission.MODEL_CONSTANTS to:")
        print("  " + repr(submission.ModelConstants(*(float(f"{v:.3g}") for v in constants))))
    names = list(submission.TILE_CONFIGS)
    print("MODEL FIGURES for a B200, not measurements (submission.py, 'Cost model'; constants fitted to public "
          "B200 results):")
    print("  " + ", ".join(f"{n} {v * 1e6:.3g} us" if n.endswith("_s") else f"{n} {v:.3g}"
                           for n, v in constants._asdict().items()))
    print(f"  {'#':>2} {'chosen configuration/schedule':<36} {'CTAs':>4} {'model us':>9} {'SOL us':>7}  "
          + "  ".join(f"{n + ' us':>16}" for n in names) + "  shape")
    chosen_times, terms = [], []
    for i, case in enumerate(cases):
        sizes = problem_sizes_of(case.args)
        modeled = lambda c: submission.model_time_us(sizes, c, constants=constants).time_us
        config = submission.choose_config(sizes) if constants is submission.MODEL_CONSTANTS else min(
            submission.model_candidates(), key=modeled)
        chosen = submission.model_time_us(sizes, config, constants=constants)
        best_of = {n: min(submission.model_time_us(sizes, c, constants=constants).time_us
                          for c in submission.model_candidates() if c.name.split("/")[0] == n) for n in names}
        sol_us = b200_speed_of_light_ns(sizes) / 1e3
        chosen_times.append(chosen.time_us)
        rewrite = submission.model_time_us(sizes, config, rewrite_descriptors=True, constants=constants)
        no_pdl = submission.model_time_us(sizes, dataclasses.replace(config, pdl=False), constants=constants)
        terms.append((i, chosen, rewrite, no_pdl))
        print(f"  {i:>2} {config.name:<36} {chosen.ctas:>4} {chosen.time_us:>9.2f} {sol_us:>7.3f}  "
              + "  ".join(f"{best_of[n]:>16.2f}" for n in names) + f"  {short_spec(sizes)}")
    geomean = geometric_mean(chosen_times)
    sol = geometric_mean(b200_speed_of_light_ns(problem_sizes_of(c.args)) / 1e3 for c in cases)
    floor = geometric_mean(model_floor_us(problem_sizes_of(c.args), constants) for c in cases)
    print(f"  modeled geometric mean: {geomean:.2f} us (speed of light {sol:.2f} us, ratio {sol / geomean:.2f}); "
          f"the model's floor for any design: {floor:.2f} us (sustained DRAM time plus the fixed cost per call)")
    print("  per-call gap beyond the fixed cost and descriptor waits of the busiest CTA, chosen configuration:")
    print(f"  {'#':>2} {'gap us (PDL)':>12} {'gap us (none)':>13} {'built once us':>13} {'rewritten us':>12}"
          f" {'model us if rewritten':>21}")
    for i, est, rewrite, no_pdl in terms:
        print(f"  {i:>2} {est.gap_us:>12.2f} {no_pdl.gap_us:>13.2f} {est.descriptor_us:>13.2f}"
              f" {rewrite.descriptor_us:>12.2f} {rewrite.time_us:>21.2f}")
    if not options.shape:
        print("  residuals against the public B200 results (PUBLIC_B200_* in eval.py; # = benchmark, "
              "- = geometric mean):")
        print(f"  {'design':<52} {'#':>2} {'published us':>12} {'model us':>9} {'model/published':>15}")
        for label, index, published, modeled in modeled_public_points(constants):
            print(f"  {label:<52} {'-' if index is None else index:>2} {published:>12.2f} {modeled:>9.2f} "
                  f"{modeled / published:>15.2f}")
    return EXIT_OK


# =============================================================================
# Host overhead of custom_kernel (hostbench.py)
# =============================================================================
def command_overhead(options) -> int:
    import torch
    from nvfp4_group_gemm import hostbench
    cases = options.bench_cases
    where = (f"on {torch.cuda.get_device_name()}" if torch.cuda.is_available()
             else "on the CPU (no GPU: preparation only)")
    print(f"Host microseconds per custom_kernel call {where}, median of passes over "
          f"{hostbench.NUM_INPUTS} inputs called back to back:")
    keys = None
    for i, case in cases:
        results = hostbench.measure(case.args, repeats=options.repeats)
        if "kernel" in results:
            print(f"  launches go to the {results.pop('kernel')}")
        keys = keys or list(results)
        print(f"  benchmark {i} ({short_spec(problem_sizes_of(case.args))}):")
        for key in keys:
            print(f"    {key:<40} {results[key]:>8.2f} us")
    return EXIT_OK


# =============================================================================
# People's CLI
# =============================================================================
def environment_line() -> tuple:
    """(one line saying what runs here, whether a GPU is present)."""
    import torch
    if not torch.cuda.is_available():
        return ("No CUDA GPU here: the B200 kernel cannot run. Doing what a CPU can: compiling "
                "the B200 kernel for sm_100a and checking the reference against an independent "
                "dequantization.", False)
    submission = load_submission()
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    major, minor = torch.cuda.get_device_capability(device)
    path = submission.code_path(device)
    if path == submission.PATH_B200:
        return f"{name} (sm_{major}{minor}): running the B200 tcgen05 kernel [{path}].", True
    hopper = sys.modules.get("nvfp4_group_gemm.hopper")  # registered by load_submission where present
    which = ("the Hopper kernel of hopper.py" if hopper is not None and path == hopper.PATH_HOPPER
             else "the portable path of portable.py")
    return (f"{name} (sm_{major}{minor}) cannot run the B200 kernel (tcgen05 needs sm_100); "
            f"running {which} instead [{path}].", True)


def progress_line(text: str, step: bool = True):
    """Progress: on a terminal one line rewritten in place; elsewhere (a pipe, a log) a line per step, and
    nothing for what is not a step (a sample's time) or for the final clearing ("")."""
    if sys.stdout.isatty():
        print("\r" + text[:120].ljust(120), end="", flush=True)
    elif step and text:
        print(text, flush=True)


def human_tests(cases: list) -> list:
    rows = []
    for n, (i, case) in enumerate(cases):
        progress_line(f"test {n + 1}/{len(cases)}: {case.spec}")
        start = time.perf_counter()
        good, message = run_single_test(case.args)
        rows.append({"kind": "test", "index": i, "spec": case.spec, "ok": good,
                     "message": message, "wall_s": time.perf_counter() - start})
    progress_line("")
    return rows


def human_benchmarks(cases: list) -> list:
    rows = []
    for n, (i, case) in enumerate(cases):
        def progress(durations, n=n):
            progress_line(f"benchmark {n + 1}/{len(cases)}: sample {len(durations)}, "
                          f"last {durations[-1] / 1e3:.2f} us", step=False)
        progress_line(f"benchmark {n + 1}/{len(cases)}: checking 15 inputs, then timing")
        result = run_single_benchmark(case.args, False, 100, 10e9, progress)
        row = {"kind": "benchmark", "index": i, "spec": case.spec,
               "sizes": problem_sizes_of(case.args), "ok": isinstance(result, Stats)}
        if row["ok"]:
            row["stats"] = result
        else:
            row["message"] = result
        rows.append(row)
    progress_line("")
    return rows


def short_spec(sizes: list) -> str:
    ms = ",".join(str(m) for m, _, _, _ in sizes)
    ns = sorted({n for _, n, _, _ in sizes})
    ks = sorted({k for _, _, k, _ in sizes})
    return f"G={len(sizes)} M=[{ms}] N={ns} K={ks}"


def print_report(rows: list, path: str):
    tests = [r for r in rows if r["kind"] == "test"]
    benches = [r for r in rows if r["kind"] == "benchmark"]
    if tests:
        print(f"\nTests ({sum(r['ok'] for r in tests)}/{len(tests)} pass), path {path}:")
        for r in tests:
            status = "pass" if r["ok"] else "FAIL"
            print(f"  {r['index']:>2} {status:<4} {r['spec']}")
            if not r["ok"]:
                print(f"       {r['message'][:600]}")
    if benches:
        print(f"\nTiming: the leaderboard's loop, GPU time per call (15 inputs back to back per sample); L2 flush: "
              f"{flush_description()}.")
        print(f"\nBenchmarks, path {path} (% SOL: share of the B200 speed of light; "
              "below 100 % means slower than a B200 could be):")
        print(f"  {'#':>2} {'status':<6} {'mean us':>9} {'best us':>9} {'TFLOP/s':>8} "
              f"{'SOL us':>7} {'% SOL':>6}  shape")
        means = []
        for r in benches:
            sol_us = b200_speed_of_light_ns(r["sizes"]) / 1e3
            if r["ok"]:
                s = r["stats"]
                means.append(s.mean)
                print(f"  {r['index']:>2} {'ok':<6} {s.mean / 1e3:>9.2f} {s.best / 1e3:>9.2f} "
                      f"{flops_of(r['sizes']) / s.mean / 1e3:>8.1f} {sol_us:>7.3f} "
                      f"{100 * sol_us * 1e3 / s.mean:>6.2f}  {short_spec(r['sizes'])}")
            else:
                print(f"  {r['index']:>2} {'FAIL':<6} {'':>9} {'':>9} {'':>8} {sol_us:>7.3f} "
                      f"{'':>6}  {short_spec(r['sizes'])}\n       {r['message'][:600]}")
        if means and len(means) == len(benches):
            geomean = geometric_mean(means)
            print(f"  geometric mean: {geomean / 1e3:.2f} us (B200 speed of light 5.21 us)")


def self_check_reference(cases: list) -> bool:
    """On the CPU, printed as it goes: the reference (bit-level decode, plain scales) against the submission's
    portable dequantization (literal table, blocked scales) on each (index, case); whether all agree."""
    import torch
    from nvfp4_group_gemm.reference import generate_input, ref_kernel
    from nvfp4_group_gemm import portable
    if not cases:
        return True
    print(f"\nReference self-check on the CPU, {len(cases)} case{'s' if len(cases) != 1 else ''}:", flush=True)
    agree = 0
    for i, case in cases:
        data = generate_input(**case.args, device="cpu")
        expected = ref_kernel(data)
        got = portable.run_portable(clone_data(data))
        same = all(torch.equal(e, g) for e, g in zip(expected, got))
        agree += same
        print(f"  {i:>2} {'agree' if same else 'DIFFER':<6} {case.spec}", flush=True)
    print(f"({agree}/{len(cases)} agree)", flush=True)
    return agree == len(cases)


def selected_cases(path: Path, case: Optional[int]) -> list:
    """(index, case) of the file's cases, or of its case `case`; UsageError for a case it does not have."""
    cases = read_test_file(path, check=True)
    if case is None:
        return list(enumerate(cases))
    if not 0 <= case < len(cases):
        raise UsageError(f"--case {case}: {path.name} has cases 0..{len(cases) - 1}")
    return [(case, cases[case])]


def command_run(options) -> int:
    test_cases, bench_cases = options.test_cases, options.bench_cases  # chosen and checked by check_options
    line, have_gpu = environment_line()
    print(line, flush=True)
    import torch
    failed = False
    if not have_gpu:
        narrowed = bool(options.shape) or options.case is not None
        if narrowed:  # only the kernels these cases need
            shape_sets = [(f"{kind}[{i}]", problem_sizes_of(case.args)) for kind, chosen in
                          (("tests", test_cases), ("benchmarks", bench_cases)) for i, case in chosen]
            shape_sets = list({tuple(map(tuple, s)): (n, s) for n, s in shape_sets}.values())  # --shape: once
        else:
            shape_sets = task_shape_sets("all") + contract_shape_sets()
        print()
        failed |= not compile_gate("sm_100a", shape_sets, only_needed=narrowed)
        failed |= not self_check_reference(test_cases)
        if bench_cases:
            print("Benchmarks skipped: timing needs a CUDA GPU.")
    else:
        path = load_submission().code_path(torch.device("cuda"))
        rows = human_tests(test_cases) + human_benchmarks(bench_cases)
        print_report(rows, path)
        failed |= not all(r["ok"] for r in rows)
        if bench_cases and path != "b200-tcgen05":
            print_peers([case for _, case in bench_cases], rows)
    return EXIT_FAILED if failed else EXIT_OK


# =============================================================================
# Peers on a GPU other than a B200: torch's grouped GEMM in the same run
# =============================================================================
PEER_SAMPLES = 30


def time_loop_us(call, inputs: list, samples: int = PEER_SAMPLES) -> float:
    """Mean microseconds per call over `samples` leaderboard-style samples:
    synchronize, flush L2, events around `call` on every input back to back."""
    import torch
    for data in inputs:  # warm-up: compiles, caches, plans
        call(data)
    total_ms = 0.0
    for _ in range(samples):
        torch.cuda.synchronize()
        flush_l2()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for data in inputs:
            call(data)
        end.record()
        torch.cuda.synchronize()
        total_ms += start.elapsed_time(end)
    return total_ms * 1e3 / samples / len(inputs)


def measured_bf16_peak_tflops() -> float:
    """Dense bf16 TFLOP/s of torch.mm at 8192^3 on this GPU, measured now."""
    import torch
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        torch.mm(a, b)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        torch.mm(a, b)
    end.record()
    torch.cuda.synchronize()
    return 2 * 8192 ** 3 * 20 / (start.elapsed_time(end) * 1e-3) / 1e12


def grouped_operands(data):
    """(A of all groups stacked, B as (G, K, N) with K contiguous, M offsets):
    `torch._grouped_mm`'s operands, bf16, from an input with one N and K."""
    import torch
    from nvfp4_group_gemm import portable
    abc, _, sf_reordered, sizes = data
    a = torch.cat([portable.dequantize_bf16(a, sfa, m, k)
                   for (a, _, _), (sfa, _), (m, _, k, _) in zip(abc, sf_reordered, sizes)])
    b = torch.stack([portable.dequantize_bf16(b, sfb, n, k)
                     for (_, b, _), (_, sfb), (_, n, k, _) in zip(abc, sf_reordered, sizes)])
    offsets = torch.tensor(list(itertools.accumulate(m for m, _, _, _ in sizes)),
                           dtype=torch.int32, device=a.device)
    return a, b.transpose(1, 2), offsets


def grouped_mm_on_bf16(inputs: list):
    """torch._grouped_mm on each input's operands dequantized to bf16
    beforehand (outside the timing): a call taking one of `inputs`."""
    import torch
    prepared = {id(d): grouped_operands(d) for d in inputs}

    def pre_dequantized(data):
        a, b, offsets = prepared[id(data)]
        return torch._grouped_mm(a, b, offs=offsets, out_dtype=torch.bfloat16)
    return pre_dequantized


def print_peers(cases: list, rows: list) -> None:
    """Per benchmark: this submission's path, torch._grouped_mm on operands
    already in bf16, dequantize-then-_grouped_mm, and the portable path, all
    timed the same way in this run; TFLOP/s and % of the measured bf16 peak."""
    import torch
    from nvfp4_group_gemm import portable
    submission = load_submission()
    if not hasattr(torch, "_grouped_mm"):
        print("\nPeers skipped: this torch has no torch._grouped_mm.")
        return
    peak = measured_bf16_peak_tflops()
    path = submission.code_path(torch.device("cuda"))
    print(f"\nPeers on {torch.cuda.get_device_name()} (mean us per call, leaderboard loop, "
          f"{PEER_SAMPLES} samples; bf16 dense peak measured now: {peak:.0f} TFLOP/s):")
    print(f"  {'#':>2} {'ours':>9} {'grouped_mm':>11} {'deq+gmm':>9} {'portable':>9} "
          f"{'ours TFLOP/s':>12} {'% peak':>7} {'vs gmm':>7}  shape")
    for case, row in zip(cases, (r for r in rows if r["kind"] == "benchmark")):
        sizes = problem_sizes_of(case.args)
        if len({(n, k) for _, n, k, _ in sizes}) > 1:  # its B is one (G, K, N) tensor
            print(f"  {row['index']:>2} peers skipped: torch._grouped_mm takes one N and one K for all groups"
                  f"  {short_spec(sizes)}")
            continue
        inputs = benchmark_inputs(case.args)
        flops = flops_of(sizes)
        ours = row["stats"].mean / 1e3 if row["ok"] else float("nan")
        pre_dequantized = grouped_mm_on_bf16(inputs)

        def dequantize_then(data):
            a, b, offsets = grouped_operands(data)
            return torch._grouped_mm(a, b, offs=offsets, out_dtype=torch.bfloat16)
        try:
            gmm = time_loop_us(pre_dequantized, inputs)
            deq = time_loop_us(dequantize_then, inputs, samples=5)
        except RuntimeError as error:  # e.g. alignment rules of this torch's grouped GEMM
            print(f"  {row['index']:>2} torch._grouped_mm refused: {str(error)[:200]}")
            continue
        portable_us = time_loop_us(portable.run_portable, inputs, samples=5)
        tflops = flops / (ours * 1e-6) / 1e12
        print(f"  {row['index']:>2} {ours:>9.2f} {gmm:>11.2f} {deq:>9.2f} {portable_us:>9.2f} "
              f"{tflops:>12.1f} {100 * tflops / peak:>6.1f}% {gmm / ours:>6.2f}x  {short_spec(sizes)}  [{path}]")


def sweep_configs(only=None, diagnose: bool = False) -> list:
    """hopper.py's configurations (and with `diagnose` its timing diagnostics)
    whose names contain any of the substrings in `only` (all when None)."""
    from nvfp4_group_gemm import hopper
    configs = list(hopper.SM90_CONFIGS.values()) + (list(hopper.SM90_DIAGNOSTICS) if diagnose else [])
    return [c for c in configs if not only or any(part in c.name for part in only)]


def awkward_shape_sets() -> list:
    """Cases beside the task's tests for a first run on new hardware: one and two groups whose M and N leave
    partial tiles and, for the 2-CTA configurations, a follower CTA wholly or partly out of bounds."""
    return [TestCase(args={"m": (m, m + 64), "n": (n, n), "k": (512, 256), "g": 2, "seed": m + n},
                     spec=f"m: [{m}, {m + 64}]; n: [{n}, {n}]; k: [512, 256]; g: 2; seed: {m + n}")
            for m in (1, 72, 129, 257) for n in (128, 384)]


def sweep_b200(bench_cases: list) -> int:
    """On a B200: every configuration and schedule CONFIG_POLICY may name, checked against the reference on
    the task's tests and `awkward_shape_sets` first; the exact ones timed on the benchmarks (the leaderboard's
    loop); one table to paste into an issue. Exit 1 if any configuration is wrong somewhere."""
    import torch
    from nvfp4_group_gemm import submission
    from nvfp4_group_gemm.reference import check_implementation, generate_input
    checks = [case for _, case in selected_cases(TESTS_FILE, None)] + awkward_shape_sets()
    rows = []
    print(f"sweep on {torch.cuda.get_device_name()}: {len(submission.policy_candidates())} configurations, each "
          f"checked on {len(checks)} cases, then timed on {len(bench_cases)} benchmarks", flush=True)
    for n, config in enumerate(submission.policy_candidates()):
        wrong = []
        for case in checks:
            data = generate_input(**case.args)
            try:
                passed, message = check_implementation(data, submission.run_b200(clone_data(data), config))
            except Exception as error:  # a failed launch is this configuration's verdict
                passed, message = False, describe_error(error)
            if not passed:
                wrong.append(f"{case.spec}: {message[:200]}")
        times = {}
        if not wrong:
            for i, case in bench_cases:
                inputs = benchmark_inputs(case.args)
                times[i] = time_loop_us(lambda data, c=config: submission.run_b200(data, c), inputs)
        modeled = {i: submission.model_time_us(problem_sizes_of(case.args), config).time_us for i, case in bench_cases}
        rows.append({"config": config.name, "exact": f"{len(checks) - len(wrong)}/{len(checks)}", "wrong": wrong,
                     "us": times, "model_us": modeled})
        print(f"  [{n + 1}/{len(submission.policy_candidates())}] {config.name}: "
              f"{'exact' if not wrong else 'WRONG on ' + str(len(wrong)) + ' cases'}", flush=True)
    chosen = {i: submission.choose_config(problem_sizes_of(case.args)).name for i, case in bench_cases}
    print(format_b200_sweep(rows, [i for i, _ in bench_cases], chosen))
    return 1 if any(r["wrong"] for r in rows) else 0


def format_b200_sweep(rows: list, benchmarks: list, chosen: dict) -> str:
    """The sweep's table: per configuration whether it is exact, its mean us per benchmark (* = custom_kernel's
    choice there), their geometric mean, and the cost model's figure for it (a model, not a measurement)."""
    width = max(len(r["config"]) for r in rows) + 1
    lines = [f"{'configuration':<{width}} {'exact':>6} " + " ".join(f"{'#' + str(i) + ' us':>9}" for i in benchmarks)
             + f" {'geomean':>8} {'model':>8}"]
    for r in rows:
        cells = [f"{r['us'][i]:>8.2f}" + ("*" if chosen.get(i) == r["config"] else " ") if i in r["us"]
                 else f"{'-':>9}" for i in benchmarks]
        timed = [r["us"][i] for i in benchmarks if i in r["us"]]
        geomean = f"{geometric_mean(timed):>8.2f}" if timed and len(timed) == len(benchmarks) else f"{'-':>8}"
        model = geometric_mean(r["model_us"][i] for i in benchmarks)
        lines.append(f"{r['config']:<{width}} {r['exact']:>6} " + " ".join(cells) + f" {geomean} {model:>8.2f}")
        lines += [f"    wrong: {w}" for w in r["wrong"][:3]]
    return "\n".join(lines)


def command_sweep(options) -> int:
    """B200: `sweep_b200`. Hopper GPU: every configuration of hopper.py (hopper.SM90_CONFIGS),
    each checked against the reference and timed like the peers, side by side
    with torch._grouped_mm on pre-dequantized bf16, per benchmark."""
    import torch
    from nvfp4_group_gemm import submission
    from nvfp4_group_gemm.reference import check_implementation
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (10, 0):
        return sweep_b200(options.bench_cases)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("sweep: needs a B200 (sm_100) or a Hopper GPU (sm_90)")
        return 2
    from nvfp4_group_gemm import hopper
    from nvfp4_group_gemm.reference import generate_input
    cases = options.bench_cases
    configs = sweep_configs(options.only, options.diagnose)
    if not configs:
        print(f"sweep: no configuration of hopper.py matches {options.only}")
        return 2
    launchers = {c.name: submission.GroupedGemmLauncher(config=c) for c in configs}
    worst = 0
    for config in [c for c in configs if not c.diagnostic]:  # the task's test shapes first
        verdicts = [check_implementation(data, launchers[config.name](clone_data(data)))
                    for data in (generate_input(**case.args) for case in read_test_file(TESTS_FILE))]
        failed = [(i, message) for i, (passed, message) in enumerate(verdicts) if not passed]
        worst |= bool(failed)
        print(f"{config.name}: {len(verdicts) - len(failed)}/{len(verdicts)} test shapes correct"
              + "".join(f"\n  test {i}: {message[:300]}" for i, message in failed))
    print(f"Hopper configurations on {torch.cuda.get_device_name()} (mean us per call, leaderboard loop, "
          f"{PEER_SAMPLES} samples; x = grouped_mm time / ours; * = custom_kernel's):")
    print(f"  {'#':>2} {'grouped_mm':>11} " + " ".join(
        f"{c.name + ('*' if c == hopper.SM90_CONFIG else ''):>24}" for c in configs))
    for index, case in cases:
        inputs = benchmark_inputs(case.args)
        gmm = time_loop_us(grouped_mm_on_bf16(inputs), inputs)
        cells = []
        for config in configs:
            launcher = launchers[config.name]
            passed, message = check_implementation(inputs[0], launcher(clone_data(inputs[0])))
            if not passed and not config.diagnostic:
                worst = 1
                cells.append(f"{'FAIL':>24}")
                print(f"  {config.name}: {message[:300]}")
                continue
            ours = time_loop_us(launcher, inputs)
            cells.append(f"{ours:>15.2f} {gmm / ours:>6.2f}x ")
        print(f"  {index:>2} {gmm:>11.2f} " + " ".join(cells)
              + f"  {short_spec(problem_sizes_of(case.args))}")
    return worst


PEOPLE_COMMANDS = ("all", "tests", "benchmarks", "compile", "model", "overhead", "sweep")
ARCHES = ("sm_100a", "sm_90a")


class Parser(argparse.ArgumentParser):
    """argparse, its complaints raised as UsageError (one line, exit EXIT_BAD_ARGS) instead of usage text."""

    def error(self, message):
        command = self.prog.partition(" ")[2]
        raise UsageError(f"{command + ': ' if command else ''}{message} "
                         f"(see python eval.py {command + ' ' if command else ''}--help)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="eval.py",
        description="Run, check, time and compile the NVFP4 grouped GEMM. Without a GPU: compile the B200 kernel "
                    "(no CUDA toolkit needed) and check the reference. The leaderboard's protocol modes (test, "
                    "benchmark, leaderboard, profile) need POPCORN_FD.",
        epilog=f"A case (--shape) is one test-file line: \"{SPEC_EXAMPLE}\"; {SHAPE_RULES}. "
               f"Compile results are cached (see {toolchain.CACHE_ENV} in docs/developing.md).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    case_help = "only case I (0-based) of the file"
    shape_help = "a case of your own instead of the task's, e.g. \"m: [64]; n: [256]; k: [512]; g: 1; seed: 7\""
    for name, help_text in (("all", "the task's tests, then its benchmarks (the default)"),
                            ("tests", "the task's tests (cases/tests.txt)"),
                            ("benchmarks", "the task's benchmarks (cases/benchmarks.txt)")):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--case", type=int, metavar="I", help=case_help)
        p.add_argument("--shape", metavar="SPEC", help=shape_help)
    p = sub.add_parser("compile", help="compile every kernel configuration and plan the task's shapes (no GPU)")
    p.add_argument("--arch", default="sm_100a", choices=ARCHES,
                   help="sm_100a: the B200 kernel (default); sm_90a: the Hopper kernel")
    p.add_argument("--which", choices=("all", "tests", "benchmarks"), default="all",
                   help="task shape sets to plan ('all' adds a spread of contract-valid ones)")
    p.add_argument("--shape", metavar="SPEC", help="plan this case only, and compile only its kernel")
    p.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    p.add_argument("--keep", metavar="DIR", help="keep each kernel's PTX in DIR (compiles afresh)")
    p = sub.add_parser("model", help="the cost model's choice and modeled B200 time per benchmark "
                       "(model figures, not measurements)")
    p.add_argument("--shape", metavar="SPEC", help="model this case instead of the benchmarks")
    p.add_argument("--fit", action="store_true", help="fit the model's constants to the public B200 results "
                   "first, and model with them")
    p = sub.add_parser("overhead", help="host microseconds per custom_kernel call: warm, cold, "
                       "preparation and launch, against the seed's host path")
    p.add_argument("--case", type=int, metavar="I", help="only benchmark I (0-based)")
    p.add_argument("--repeats", type=int, default=20, metavar="R",
                   help="passes over the 15 inputs per measurement; the median is reported (default 20)")
    p = sub.add_parser("sweep", help="B200: every configuration and schedule checked on the tests and awkward "
                       "shapes, then timed: a table to paste into an issue. Hopper GPU: every hopper.py "
                       "configuration against torch._grouped_mm on pre-dequantized bf16")
    p.add_argument("--case", type=int, metavar="I", help="only benchmark I (0-based)")
    p.add_argument("--diagnose", action="store_true", help="also time variants that leave a part out "
                   "(hopper.SM90_DIAGNOSTICS: conversion, wgmma, ...; wrong results, timing only)")
    p.add_argument("--only", action="append", metavar="PART",
                   help="only configurations whose names contain PART (repeatable), e.g. --only wr")
    for mode, what in (("test", "run FILE's cases once and check them"),
                       ("benchmark", "check, then time FILE's cases"),
                       ("leaderboard", "time FILE's cases with rechecks, as a ranked run"),
                       ("profile", "torch profiler table per case")):
        p = sub.add_parser(mode, help=f"leaderboard protocol (needs POPCORN_FD): {what}",
                           description=f"The leaderboard's protocol: {what}; results go to file descriptor "
                                       "POPCORN_FD as 'key: value' lines. Exit 0 pass, 112 a failure, 2 bad "
                                       f"arguments. Example: POPCORN_FD=3 python eval.py {mode} cases/tests.txt "
                                       "3>result.txt")
        p.add_argument("file", metavar="FILE", help="a test file: one case per line")
    return parser


def unknown_command(word: str) -> str:
    import difflib
    close = (difflib.get_close_matches(word, PEOPLE_COMMANDS, n=1, cutoff=0.6)
             or difflib.get_close_matches(word, PROTOCOL_MODES, n=1, cutoff=0.6))
    hint = f"did you mean '{close[0]}'? " if close else ""
    return (f"unknown command '{word}': {hint}commands are {', '.join(PEOPLE_COMMANDS)}, and the protocol modes "
            f"{', '.join(PROTOCOL_MODES)} (with POPCORN_FD); see python eval.py --help")


def check_options(options) -> None:
    """Everything the command line fixes, judged before anything is imported or compiled: the --shape spec, the
    --case number, the selected cases (options.test_cases, options.bench_cases: (index, TestCase) lists)."""
    shape, case = getattr(options, "shape", None), getattr(options, "case", None)
    if shape is not None and case is not None:
        raise UsageError(f"{options.command}: --case and --shape exclude each other")
    if shape is not None:
        try:
            options.shape_args = parse_shape(shape)
        except BadCase as error:
            raise UsageError(f"--shape: {error}") from None
        custom = [(0, TestCase(args=options.shape_args, spec=shape))]
        options.test_cases = custom if options.command in ("all", "tests") else []
        options.bench_cases = custom if options.command in ("all", "benchmarks", "model") else []
        return
    try:
        options.test_cases = selected_cases(TESTS_FILE, case) if options.command in ("all", "tests") else []
        options.bench_cases = (selected_cases(BENCHMARKS_FILE, case) if options.command in
                               ("all", "benchmarks", "model", "overhead", "sweep") else [])
    except MalformedTestFile as error:
        raise UsageError(str(error)) from None
    if getattr(options, "repeats", 1) < 1:
        raise UsageError(f"{options.command}: --repeats {options.repeats}: must be at least 1")


COMMANDS = {"compile": command_compile, "model": command_model, "overhead": command_overhead,
            "sweep": command_sweep}  # the rest: command_run


def dispatch(argv: list) -> int:
    wants_help = "-h" in argv or "--help" in argv
    if argv and argv[0] in PROTOCOL_MODES and not wants_help:
        return protocol_main(argv)
    if argv and argv[0] == "compile-one":
        return compile_one_main(argv[1:])
    if argv and not argv[0].startswith("-") and argv[0] not in PEOPLE_COMMANDS + PROTOCOL_MODES:
        raise UsageError(unknown_command(argv[0]))
    if argv and argv[0].startswith("-") and not wants_help:
        argv = ["all"] + argv  # `eval.py --shape SPEC` runs that case
    options = build_parser().parse_args(argv or ["all"])
    check_options(options)
    return COMMANDS.get(options.command, command_run)(options)


def main(argv: list) -> int:
    try:
        return dispatch(argv)
    except UsageError as error:
        print(f"eval.py: {error}", file=sys.stderr, flush=True)
        return EXIT_BAD_ARGS


def run() -> None:
    """The console command `nvfp4-group-gemm` (pyproject.toml): `python eval.py` from anywhere."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    run()
