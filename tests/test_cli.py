"""eval.py's command line as a person meets it: a bad command line is one line on stderr and exit 2, fast and
before anything is compiled; --help lists every command with help for every option; the compile gate reports
progress, compiles only what --shape needs and caches what it compiled."""
import argparse
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT
from nvfp4_group_gemm import eval as evaluation
from nvfp4_group_gemm import cli

GOOD = "m: [64]; n: [256]; k: [512]; g: 1; seed: 7"
BAD_TEST_FILE = f"{GOOD}\nthis is not a case\n"


def run_eval(*argv, env_extra=None, pass_fds=(), timeout=600):
    env = dict(os.environ, **(env_extra or {}))
    if "POPCORN_FD" not in (env_extra or {}):
        env.pop("POPCORN_FD", None)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "eval.py", *argv], cwd=ROOT, env=env, pass_fds=pass_fds,
                          capture_output=True, text=True, timeout=timeout)
    return done, time.perf_counter() - start


# (argv, what the one line must say)
BAD_COMMAND_LINES = [
    (["test"], "POPCORN_FD is not set"),  # the protocol mode, typed for `tests`
    (["bench"], "unknown command 'bench': did you mean 'benchmarks'?"),
    (["tsets"], "unknown command 'tsets': did you mean 'tests'?"),  # not the protocol mode, which needs POPCORN_FD
    (["benchmark"], "for the task's benchmarks on this machine run 'python eval.py benchmarks'"),
    (["--shape", "garbage"], "'garbage' is not 'key: value'"),
    (["--shape", "m: [64]; n: [256]; k: [512]"], "missing g, seed"),
    (["--shape", "m: [64]; n: [256]; k: [100]; g: 1; seed: 7"], "group 0: K=100 is not a positive multiple of 256"),
    (["--shape", "m: [0]; n: [128]; k: [256]; g: 1; seed: 7"], "group 0: M=0, must be at least 1"),
    (["--shape", "m: [64]; n: [200]; k: [256]; g: 1; seed: 7"], "group 0: N=200 is not a positive multiple of 128"),
    (["--shape", "m: 64; n: [256]; k: [512]; g: 1; seed: 7"], "write m: [64]"),
    (["--shape", "m: [64, 1]; n: [256]; k: [512]; g: 1; seed: 7"], "m has 2 values, g is 1"),
    (["--shape", f"{GOOD}; x: 3"], "unknown key x"),
    (["tests", "--case", "99"], "--case 99: tests.txt has cases 0..9"),
    (["tests", "--case", "x"], "invalid int value: 'x'"),
    (["tests", "--case", "1", "--shape", GOOD], "--case and --shape exclude each other"),
    (["compile", "--arch", "sm_80"], "invalid choice: 'sm_80'"),
    (["compile", "--shape", "m: [64]"], "missing n, k, g, seed"),
    (["model", "--shape", "m: [1]; n: [1]; k: [1]; g: 1; seed: 1"], "N=1 is not a positive multiple of 128"),
    (["overhead", "--repeats", "0"], "--repeats 0: must be at least 1"),
    (["tests", "--frobnicate"], "unrecognized arguments: --frobnicate"),
]


@pytest.mark.parametrize("argv, says", BAD_COMMAND_LINES, ids=[" ".join(a)[:40] for a, _ in BAD_COMMAND_LINES])
def test_a_bad_command_line_is_one_line_and_exit_2_within_2_s(argv, says):
    done, seconds = run_eval(*argv)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("eval.py: "), done.stderr
    assert says in lines[0]
    assert done.stdout == ""  # nothing started, nothing compiled
    assert seconds < 2.0, f"{seconds:.2f} s"


@pytest.mark.parametrize("text, says", [
    (BAD_TEST_FILE, ":2: 'this is not a case' is not 'key: value'"),
    (f"{GOOD}\n{GOOD}\nm: [64]; n: [256]; k: [512]; g: 1", ":3: missing seed"),
    ("m: [64]; n: [256]; k: [384]; g: 1; seed: 7", ":1: group 0: K=384 is not a positive multiple of 256"),
])
def test_a_bad_test_file_names_its_line(tmp_path, text, says):
    path = tmp_path / "cases.txt"
    path.write_text(text)
    read_fd, write_fd = os.pipe()
    try:
        done, seconds = run_eval("test", str(path), env_extra={"POPCORN_FD": str(write_fd)}, pass_fds=(write_fd,))
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        assert pipe.read() == ""  # not a key written
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert f"{path}{says}" in lines[0]
    assert seconds < 2.0, f"{seconds:.2f} s"


def test_an_unreadable_test_file_is_one_line_and_exit_2(tmp_path):
    read_fd, write_fd = os.pipe()
    try:
        done, _ = run_eval("benchmark", str(tmp_path / "absent.txt"), env_extra={"POPCORN_FD": str(write_fd)},
                           pass_fds=(write_fd,))
    finally:
        os.close(write_fd)
        os.close(read_fd)
    assert done.returncode == 2 and "cannot read the test file" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def subparsers(parser: argparse.ArgumentParser) -> dict:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_help_lists_every_command_and_every_option_has_help():
    done, _ = run_eval("--help")
    assert done.returncode == 0
    assert "==SUPPRESS==" not in done.stdout and "compile-one" not in done.stdout
    commands = subparsers(cli.build_parser())
    assert set(commands) == set(cli.PEOPLE_COMMANDS) | set(evaluation.PROTOCOL_MODES)
    for name in commands:
        assert re.search(rf"^\s+{name}\b", done.stdout, re.M), f"{name} missing from --help"
    for name, parser in commands.items():
        for action in parser._actions:
            assert action.help and action.help != argparse.SUPPRESS, f"{name} {action.option_strings}: no help"


def test_protocol_mode_help_needs_no_popcorn_fd():
    done, _ = run_eval("leaderboard", "--help")
    assert done.returncode == 0 and "POPCORN_FD" in done.stdout


def test_shape_spec_and_rules_agree_with_generate_input_and_the_kernel():
    """The CLI's light checks (casefile, no torch) say what the real ones say."""
    import inspect
    from nvfp4_group_gemm import casefile, submission
    from nvfp4_group_gemm.reference import generate_input
    assert set(inspect.signature(generate_input).parameters) - {"device"} == set(casefile.CASE_KEYS)
    assert (casefile.N_MULTIPLE, casefile.K_MULTIPLE) == (submission.N_MULTIPLE, submission.K_MULTIPLE)
    for m in (-1, 0, 1, 1024):
        for n in (0, 64, 128, 200, 256, 7168):
            for k in (0, 128, 256, 384, 512, 7168):
                light = casefile.problem_size_error(3, m, n, k)
                try:
                    submission.check_problem_size(3, (m, n, k, 1))
                    real = None
                except ValueError as error:
                    real = str(error)
                assert light == real, (m, n, k)


def test_a_malformed_line_names_its_part():
    from nvfp4_group_gemm.casefile import MalformedTestFile, parse_test_line
    with pytest.raises(MalformedTestFile, match="'n = 3' is not 'key: value'"):
        parse_test_line("m: [1]; n = 3")


def test_the_console_command_speaks_its_own_name(tmp_path):
    """Installed, `nvfp4-group-gemm` runs from any folder and names itself in its usage and errors."""
    command = os.path.join(os.path.dirname(sys.executable), "nvfp4-group-gemm")
    if not os.path.exists(command):
        pytest.skip("the package is not installed here (pip install -e . makes the console command)")
    done = subprocess.run([command, "bench"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == ("nvfp4-group-gemm: unknown command 'bench': did you mean 'benchmarks'? commands "
                                   "are all, tests, benchmarks, compile, model, overhead, sweep, moe, mlp, and the "
                                   "protocol modes test, benchmark, leaderboard, profile (with POPCORN_FD); see "
                                   "nvfp4-group-gemm --help")
    usage = subprocess.run([command, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: nvfp4-group-gemm ")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's allocation failure")
def test_a_shape_too_large_for_the_machine_is_one_line_not_a_traceback():
    # 32 TB of A: refused at once by any allocator (a few tiles: planned at once)
    done, _ = run_eval("--shape", "m: [65536]; n: [128]; k: [1073741824]; g: 1; seed: 1", timeout=1800)
    assert done.returncode == 112, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs more memory than this machine gave" in lines[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr


def test_sweep_times_a_case_of_ones_own():
    """`eval.py sweep --shape SPEC` (a decode shape, say, with --diagnose) times that case instead of the
    benchmarks; --case and --shape exclude each other there as elsewhere."""
    spec = "m: [16, 16]; n: [4096, 4096]; k: [7168, 7168]; g: 2; seed: 1"
    options = cli.build_parser().parse_args(["sweep", "--only", "32x128", "--diagnose", "--shape", spec])
    cli.check_options(options)
    ((index, case),) = options.bench_cases
    assert index == 0 and tuple(case.args["m"]) == (16, 16) and case.spec == spec
    options = cli.build_parser().parse_args(["sweep", "--case", "1", "--shape", spec])
    with pytest.raises(cli.UsageError, match="exclude"):
        cli.check_options(options)
