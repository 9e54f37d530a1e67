"""The people's commands of `python eval.py` (and of the console command `nvfp4-group-gemm`): the parser, the
checks that judge a command line before anything is imported or compiled, and the commands that run the task's
cases (on a GPU: run, check, time, compare; on a CPU: the compile gate and the reference's self-check). The
leaderboard's protocol modes are eval.py's; the other commands live in modules named for what they do
(compile_gate, model_report, peers, hostbench).
"""
import argparse
import sys
import time
from pathlib import Path
from typing import Optional

from nvfp4_group_gemm import toolchain
from nvfp4_group_gemm.casefile import (BENCHMARKS_FILE, SHAPE_RULES, SPEC_EXAMPLE, TESTS_FILE, BadCase,
                                       MalformedTestFile, TestCase, parse_shape, problem_sizes_of, read_test_file)
from nvfp4_group_gemm.compile_gate import compile_gate, compile_one_main, contract_shape_sets, task_shape_sets
from nvfp4_group_gemm.harness import clone_data, code_path, flush_description, load_submission
from nvfp4_group_gemm.measure import (Card, Stats, b200_speed_of_light_ns, card_of, floor_us, flops_of,
                                      geometric_mean, run_single_benchmark, run_single_test, short_spec)

EXIT_OK, EXIT_BAD_ARGS, EXIT_FAILED = 0, 2, 112
# How the user typed the command: "python eval.py" in a checkout, "nvfp4-group-gemm" installed (eval.run sets it).
COMMAND = "python eval.py"
PROTOCOL_MODES = ("test", "benchmark", "leaderboard", "profile")


class UsageError(Exception):
    """A command line that cannot run: said in one line, exit EXIT_BAD_ARGS, before anything is compiled."""


# =============================================================================
# Host overhead of custom_kernel (hostbench.py)
# =============================================================================
def command_overhead(options) -> int:
    import torch
    from nvfp4_group_gemm import hostbench
    cases = options.bench_cases
    where = (f"on {torch.cuda.get_device_name()}" if torch.cuda.is_available()
             else "on the CPU (no GPU: preparation only)")
    print(f"Host microseconds per custom_kernel call {where}, median of passes over {hostbench.NUM_INPUTS} "
          "inputs called back to back (on a Hopper or B200 GPU also the MoE op's, the same data stacked):")
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
    path = code_path(device)
    if path == submission.PATH_B200:
        return f"{name} (sm_{major}{minor}): running the B200 tcgen05 kernel [{path}].", True
    hopper_policy = sys.modules.get("nvfp4_group_gemm.hopper_policy")  # registered by load_submission
    which = ("the Hopper kernel of hopper.py" if hopper_policy is not None and path == hopper_policy.PATH_HOPPER
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


def print_report(rows: list, path: str, card: Optional[Card] = None):
    """Tests and benchmarks as `human_tests` and `human_benchmarks` found them; with `card` (not a B200), each
    benchmark's floor on it and the share of it reached (`measure.floor_us`)."""
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
        local = card if card and card.name != "B200" else None
        print(f"\nBenchmarks, path {path} (% SOL: share of the B200 speed of light; "
              "below 100 % means slower than a B200 could be" + (
                  f"; % floor: share of the {local.name}'s floor, the longer of the FLOPs at "
                  f"{local.flops_per_s / 1e12:.0f} TFLOP/s and the bytes at {local.bytes_per_s / 1e12:.2f} TB/s"
                  if local else "") + "):")
        print(f"  {'#':>2} {'status':<6} {'mean us':>9} {'best us':>9} {'TFLOP/s':>8} "
              f"{'SOL us':>7} {'% SOL':>6}" + (f" {'floor us':>8} {'% floor':>7}" if local else "") + "  shape")
        means = []
        for r in benches:
            sol_us = b200_speed_of_light_ns(r["sizes"]) / 1e3
            if r["ok"]:
                s = r["stats"]
                means.append(s.mean)
                floor = floor_us(r["sizes"], local) if local else None
                print(f"  {r['index']:>2} {'ok':<6} {s.mean / 1e3:>9.2f} {s.best / 1e3:>9.2f} "
                      f"{flops_of(r['sizes']) / s.mean / 1e3:>8.1f} {sol_us:>7.3f} "
                      f"{100 * sol_us * 1e3 / s.mean:>6.2f}"
                      + (f" {floor:>8.2f} {100 * floor * 1e3 / s.mean:>6.1f}%" if local else "")
                      + f"  {short_spec(r['sizes'])}")
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
        # `all`: every shape set and every kernel (the compile gate); else the chosen cases' and their kernels
        narrowed = options.command != "all" or bool(options.shape) or options.case is not None
        if options.shape:
            shape_sets = [("--shape", problem_sizes_of(options.shape_args))]
        elif narrowed:
            shape_sets = [(f"{kind}[{i}]", problem_sizes_of(case.args)) for kind, chosen in
                          (("tests", test_cases), ("benchmarks", bench_cases)) for i, case in chosen]
        else:
            shape_sets = task_shape_sets("all") + contract_shape_sets()
        print()
        failed |= not compile_gate("sm_100a", shape_sets, only_needed=narrowed)
        failed |= not self_check_reference(test_cases)
        if bench_cases:
            print("Benchmarks skipped: timing needs a CUDA GPU.")
    else:
        path = code_path(torch.device("cuda"))
        rows = human_tests(test_cases) + human_benchmarks(bench_cases)
        print_report(rows, path, card_of(torch.cuda.get_device_name()))
        failed |= not all(r["ok"] for r in rows)
        if bench_cases and path != "b200-tcgen05":
            from nvfp4_group_gemm.peers import print_peers
            print_peers([case for _, case in bench_cases], rows)
    return EXIT_FAILED if failed else EXIT_OK


PEOPLE_COMMANDS = ("all", "tests", "benchmarks", "compile", "model", "overhead", "sweep", "moe", "mlp")


ARCHES = ("sm_100a", "sm_90a")


class Parser(argparse.ArgumentParser):
    """argparse, its complaints raised as UsageError (one line, exit EXIT_BAD_ARGS) instead of usage text."""

    def error(self, message):
        command = self.prog.partition(" ")[2]
        raise UsageError(f"{command + ': ' if command else ''}{message} "
                         f"(see {COMMAND} {command + ' ' if command else ''}--help)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=COMMAND.split()[-1],
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
    p.add_argument("--shape", metavar="SPEC", help="time this case instead of the benchmarks (Hopper)")
    p.add_argument("--diagnose", action="store_true", help="also time variants of each selected form that "
                   "leave a part out (hopper.Diagnostic: conversion, wgmma, ...; wrong results, timing only)")
    p.add_argument("--only", action="append", metavar="PART",
                   help="only configurations whose names contain PART (repeatable), e.g. --only wr")
    p.add_argument("--candidates", action="store_true", help="also the Hopper forms not yet timed "
                   "(hopper.SM90_CANDIDATES; custom_kernel's choice never takes one)")
    sub.add_parser("moe", help="the MoE op (grouped_mm_nvfp4) on the task's shape sets of one N and K as "
                   "stacked inputs: checked against the reference; on a GPU timed beside custom_kernel and "
                   "torch._grouped_mm")
    sub.add_parser("mlp", help="the expert MLP (moe_mlp_nvfp4) on top-2 routings against the bf16 MLP: its "
                   "error, CUDA graph replays under new routings; on a GPU timed (eager and replayed) at E 8, "
                   "hidden 7,168, intermediate 2,048, 512 and 4,096 rows, and each GEMM alone against "
                   "torch._grouped_mm")
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


def comma_ints(minimum: int):
    """An argparse type for a comma-separated list of integers of at least `minimum` ("4,6" -> [4, 6]; "" -> []):
    a bad value is refused by argparse, the option named, before anything runs."""
    def parse(text: str) -> list:
        try:
            values = [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            values = None
        if values is None or any(v < minimum for v in values):
            raise argparse.ArgumentTypeError(f"{text!r}: expected integers of at least {minimum} separated by "
                                             f"commas, e.g. {minimum},{minimum + 2}")
        return values
    return parse


def int_between(low: int, high: int):
    """An argparse type for one integer from `low` to `high`: anything else refused by argparse, the option named."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer from {low} to {high}")
        return value
    return parse


def edit_distance(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and swaps of neighbours ("tsets" is one from "tests")."""
    rows = [list(range(len(b) + 1))] + [[i] + [0] * len(b) for i in range(1, len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            rows[i][j] = min(rows[i - 1][j] + 1, rows[i][j - 1] + 1, rows[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                rows[i][j] = min(rows[i][j], rows[i - 2][j - 2] + 1)
    return rows[-1][-1]


def unknown_command(word: str) -> str:
    """The error for a command that is none: the nearest command as a hint (the protocol modes only where
    POPCORN_FD is set, without which they do not run), then the list."""
    import os
    candidates = PEOPLE_COMMANDS + (PROTOCOL_MODES if os.getenv("POPCORN_FD") else ())
    distance, nearest = min((edit_distance(word.lower(), c), c) for c in candidates)
    close = distance <= max(1 if len(word) < 4 else 2, len(word) // 3)
    starting = [c for c in candidates if c.startswith(word.lower())]
    if not close and len(starting) == 1:  # "bench"
        close, nearest = True, starting[0]
    hint = f"did you mean '{nearest}'? " if close else ""
    return (f"unknown command '{word}': {hint}commands are {', '.join(PEOPLE_COMMANDS)}, and the protocol modes "
            f"{', '.join(PROTOCOL_MODES)} (with POPCORN_FD); see {COMMAND} --help")


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
        options.bench_cases = custom if options.command in ("all", "benchmarks", "model", "sweep") else []
        return
    try:
        options.test_cases = selected_cases(TESTS_FILE, case) if options.command in ("all", "tests") else []
        options.bench_cases = (selected_cases(BENCHMARKS_FILE, case) if options.command in
                               ("all", "benchmarks", "model", "overhead", "sweep") else [])
    except MalformedTestFile as error:
        raise UsageError(str(error)) from None
    if getattr(options, "repeats", 1) < 1:
        raise UsageError(f"{options.command}: --repeats {options.repeats}: must be at least 1")


def command_compile(options) -> int:
    from nvfp4_group_gemm import compile_gate as gate
    return gate.command_compile(options)


def command_model(options) -> int:
    from nvfp4_group_gemm import model_report
    return model_report.command_model(options)


def command_sweep(options) -> int:
    from nvfp4_group_gemm import peers
    return peers.command_sweep(options)


def command_moe(options) -> int:
    from nvfp4_group_gemm import moe_report
    return moe_report.command_moe(options)


def command_mlp(options) -> int:
    from nvfp4_group_gemm import mlp_report
    return mlp_report.command_mlp(options)


COMMANDS = {"compile": command_compile, "model": command_model, "overhead": command_overhead,
            "sweep": command_sweep, "moe": command_moe, "mlp": command_mlp}  # the rest: command_run


def dispatch(argv: list) -> int:
    """A people's command line (eval.py takes the protocol modes first); UsageError for a bad one."""
    wants_help = "-h" in argv or "--help" in argv
    if argv and argv[0] == "compile-one":
        return compile_one_main(argv[1:])
    if argv and not argv[0].startswith("-") and argv[0] not in PEOPLE_COMMANDS + PROTOCOL_MODES:
        raise UsageError(unknown_command(argv[0]))
    if argv and argv[0].startswith("-") and not wants_help:
        argv = ["all"] + argv  # `eval.py --shape SPEC` runs that case
    options = build_parser().parse_args(argv or ["all"])
    check_options(options)
    try:
        return COMMANDS.get(options.command, command_run)(options)
    except (MemoryError, RuntimeError) as error:  # torch's OutOfMemoryError is a RuntimeError
        text = str(error)
        if not isinstance(error, MemoryError) and "out of memory" not in text and "allocate" not in text:
            raise
        what = f"--shape {options.shape!r}" if getattr(options, "shape", None) else "the chosen cases"
        print(f"\n{COMMAND.split()[-1]}: {options.command}: {what} needs more memory than this machine gave: "
              f"{text.strip().splitlines()[-1][:300]}", file=sys.stderr, flush=True)
        return EXIT_FAILED
