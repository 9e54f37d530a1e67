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
    python eval.py moe                # the MoE op on stacked inputs: checked; on a GPU timed vs custom_kernel

This file is the leaderboard's protocol and the entry point. The people's
commands live in the package, in modules named for what they do: cli (the
parser, the checks of a command line, running the task's cases), measure
(run, check and time one case), compile_gate (`compile`: no GPU needed; ptxas
from toolchain), model_report (`model`), peers (torch's grouped GEMM in the
same run, `sweep`), hostbench (`overhead`). A bad command line is one line on
stderr and exit 2, before anything is imported or compiled. Installed, the
console command `nvfp4-group-gemm` is this file's `run`.
"""


import base64
import dataclasses
import multiprocessing
import os
import sys

from nvfp4_group_gemm.casefile import MalformedTestFile, read_test_file
from nvfp4_group_gemm import cli
from nvfp4_group_gemm.cli import EXIT_BAD_ARGS, EXIT_FAILED, EXIT_OK, PROTOCOL_MODES, UsageError, dispatch
from nvfp4_group_gemm.measure import Stats, run_single_benchmark, run_single_profile, run_single_test

# As on the leaderboard: nothing the DSL compiled is reused from disk (the compile gate's own cache keeps
# ptxas reports, not binaries).
os.environ["CUTE_DSL_DISABLE_FILE_CACHING"] = "1"


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


def protocol_main(argv: list) -> int:
    mode = argv[0]
    fd = os.getenv("POPCORN_FD")
    if not fd:
        people = "benchmarks" if mode in ("benchmark", "leaderboard") else "tests"
        raise UsageError(f"{mode}: POPCORN_FD is not set. '{mode}' is a leaderboard protocol mode "
                         f"(POPCORN_FD=3 python eval.py {mode} cases/{people}.txt 3>result.txt); "
                         f"for the task's {people} on this machine run 'python eval.py {people}'")
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


def main(argv: list) -> int:
    """The protocol modes here; every other command line is the people's (cli.dispatch)."""
    try:
        if argv and argv[0] in PROTOCOL_MODES and not {"-h", "--help"} & set(argv):
            return protocol_main(argv)
        return dispatch(argv)
    except UsageError as error:
        print(f"{cli.COMMAND.split()[-1]}: {error}", file=sys.stderr, flush=True)
        return EXIT_BAD_ARGS


def run() -> None:
    """The console command `nvfp4-group-gemm` (pyproject.toml): `python eval.py` from anywhere."""
    cli.COMMAND = "nvfp4-group-gemm"
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
