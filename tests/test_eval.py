"""eval.py: the leaderboard protocol (keys, exit codes) and the people's CLI."""
import base64
import json
import os
import re
import subprocess
import sys

import pytest

from nvfp4_group_gemm import eval as evaluation
from nvfp4_group_gemm import casefile
from nvfp4_group_gemm import harness
from nvfp4_group_gemm import measure
from nvfp4_group_gemm import peers
from nvfp4_group_gemm.casefile import check_case, parse_test_line
from conftest import HAS_CUDA, ROOT

SMALL_CASE = "m: [40, 129]; n: [128, 256]; k: [256, 512]; g: 2; seed: 7"


def run_protocol(*args, test_file_text=None, tmp_path=None, env_extra=None, with_fd=True):
    """Run `eval.py ARGS` with POPCORN_FD on a pipe; (exit code, {key: value}, lines)."""
    argv = list(args)
    if test_file_text is not None:
        path = tmp_path / "cases.txt"
        path.write_text(test_file_text)
        argv.append(str(path))
    env = dict(os.environ, **(env_extra or {}))
    env.pop("POPCORN_FD", None)
    read_fd, write_fd = os.pipe()
    if with_fd:
        env["POPCORN_FD"] = str(write_fd)
    done = subprocess.run([sys.executable, "eval.py", *argv], cwd=ROOT, env=env,
                          pass_fds=(write_fd,), capture_output=True, text=True, timeout=1800)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        lines = pipe.read().splitlines()
    keys = dict(line.split(": ", 1) for line in lines)
    return done.returncode, keys, lines


def test_without_popcorn_fd_exits_2(tmp_path):
    code, keys, _ = run_protocol("test", test_file_text=SMALL_CASE, tmp_path=tmp_path, with_fd=False)
    assert code == 2 and keys == {}


def test_missing_test_file_argument_exits_2():
    code, _, _ = run_protocol("test")
    assert code == 2


def test_unreadable_test_file_exits_2(tmp_path):
    code, keys, _ = run_protocol("test", str(tmp_path / "absent.txt"))
    assert code == 2 and keys == {}


@pytest.mark.parametrize("text", ["m: [1, 2; n: 3", "m = 3", "m: 3;; n: 4", "m: 3\n\nn: 4", "m: [1]; seed: 3"])
def test_malformed_test_file_exits_2(text, tmp_path):
    code, keys, _ = run_protocol("benchmark", test_file_text=text, tmp_path=tmp_path)
    assert code == 2 and keys == {}


def test_test_mode_keys_and_exit_code(tmp_path):
    code, keys, lines = run_protocol("test", test_file_text=SMALL_CASE, tmp_path=tmp_path)
    assert lines[0] == "test-count: 1"
    assert keys["test.0.spec"] == SMALL_CASE
    assert lines[-1] in ("check: pass", "check: fail")
    if HAS_CUDA:
        assert (code, keys["test.0.status"], keys["check"]) == (0, "pass", "pass")
    else:  # the failure path: the kernel needs CUDA tensors
        assert (code, keys["test.0.status"], keys["check"]) == (112, "fail", "fail")
        assert "expected a CUDA device" in keys["test.0.error"]


def test_benchmark_mode_keys_and_exit_code(tmp_path):
    code, keys, lines = run_protocol("benchmark", test_file_text=SMALL_CASE, tmp_path=tmp_path)
    assert lines[0] == "benchmark-count: 1"
    assert keys["benchmark.0.spec"] == SMALL_CASE
    if HAS_CUDA:
        assert code == 0 and keys["check"] == "pass"
        stats = {f: float(keys[f"benchmark.0.{f}"]) for f in ("runs", "mean", "std", "err", "best", "worst")}
        assert stats["runs"] >= 3 and 0 < stats["best"] <= stats["mean"] <= stats["worst"]
    else:
        assert code == 112 and keys["check"] == "fail" and keys["benchmark.0.status"] == "fail"
        assert keys["benchmark.0.error"]


def test_profile_mode_reports_base64(tmp_path):
    code, keys, _ = run_protocol("profile", test_file_text=SMALL_CASE, tmp_path=tmp_path)
    assert code == 0 and keys["check"] == "pass"
    report = base64.b64decode(keys["benchmark.0.report"], b"+*").decode()
    assert report.strip()


# ---- parsing, seeds, statistics, speed of light --------------------------------
def test_parse_test_line_values():
    case = casefile.parse_test_line("m: [1, 2]; n: (3, 4); g: 2; seed: -5; name: fast; e: []")
    assert case == {"m": (1, 2), "n": (3, 4), "g": 2, "seed": -5, "name": "fast", "e": ()}


def test_popcorn_seed_is_mixed_into_every_seed(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("m: [1]; seed: 10\nm: [2]; seed: 11\nm: [3]")
    plain = evaluation.read_test_file(path)
    mixed = evaluation.read_test_file(path, seed=1000)
    assert [c.args.get("seed") for c in plain] == [10, 11, None]
    assert [c.args.get("seed") for c in mixed] == [
        10 + (1010 * 1011) // 2, 11 + (1011 * 1012) // 2, None]


def test_stats():
    s = measure.calculate_stats([1.0, 2.0, 3.0, 6.0])
    assert (s.runs, s.mean, s.best, s.worst) == (4, 3.0, 1.0, 6.0)
    assert s.std == pytest.approx(2.160246899) and s.err == pytest.approx(s.std / 2)


@pytest.mark.parametrize("index,sol_us", [(0, 18.833), (1, 10.667), (2, 2.406), (3, 1.525)])
def test_speed_of_light_reproduces_the_problem_statement(index, sol_us):
    from conftest import BENCHMARK_CASES
    sizes = casefile.problem_sizes_of(BENCHMARK_CASES[index].args)
    assert measure.b200_speed_of_light_ns(sizes) / 1e3 == pytest.approx(sol_us, rel=5e-4)


def test_benchmark_inputs_use_the_leaderboards_seeds(monkeypatch):
    seen = []
    from nvfp4_group_gemm import reference
    monkeypatch.setattr(reference, "generate_input", lambda **kw: seen.append(kw["seed"]))
    harness.benchmark_inputs({"m": (1,), "n": (128,), "k": (256,), "g": 1, "seed": 1111})
    assert seen == [1111 + 42 * i for i in range(1, 16)]


# ---- the people's CLI ------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(HAS_CUDA, reason="checks what a CPU-only machine reports")
def test_cli_on_a_cpu_says_so_compiles_and_self_checks():
    done = subprocess.run([sys.executable, "-W", "ignore", "eval.py", "--shape", SMALL_CASE],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert out.splitlines()[0].startswith("No CUDA GPU here: the B200 kernel cannot run.")
    assert "1 kernels, 1 shape sets, 0 failures" in out  # only the kernel the shape needs
    assert "\n  --shape " in out and "benchmarks[0]" not in out  # the case is labelled as what it is
    assert "(1/1 agree)" in out and "Benchmarks skipped: timing needs a CUDA GPU." in out


@pytest.mark.slow
@pytest.mark.skipif(HAS_CUDA, reason="checks what a CPU-only machine reports")
def test_cli_benchmarks_on_a_cpu_plans_the_benchmarks_alone():
    done = subprocess.run([sys.executable, "-W", "ignore", "eval.py", "benchmarks"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "planning 4 shape sets" in done.stdout and re.search(r"\d+ kernels, 4 shape sets, 0 failures", done.stdout)
    assert "contract[" not in done.stdout and "tests[" not in done.stdout


def test_cli_rejects_an_unknown_case_number():
    done = subprocess.run([sys.executable, "eval.py", "tests", "--case", "99"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "has cases 0..9" in done.stderr


def test_overhead_reports_the_host_preparation_per_call():
    done = subprocess.run([sys.executable, "-W", "ignore", "eval.py", "overhead", "--case", "3",
                           "--repeats", "2"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "benchmark 3 (G=2 M=[128,384]" in done.stdout
    for key in ("prep.key (warm)", "prep.check+gather (cold, host part)"):
        value = re.search(re.escape(key) + r"\s+([\d.]+) us", done.stdout)
        assert value and float(value[1]) > 0
    if HAS_CUDA:
        assert all(what in done.stdout for what in ("warm.total", "seed.total", "cuLaunchKernel", "cold.check+gather"))


@pytest.mark.skipif(HAS_CUDA, reason="checks what a CPU-only machine reports")
def test_sweep_needs_a_hopper_gpu():
    done = subprocess.run([sys.executable, "-W", "ignore", "eval.py", "sweep", "--case", "3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "sweep: needs a B200 (sm_100) or a Hopper GPU (sm_90)" in done.stdout


def test_the_b200_sweep_checks_valid_awkward_cases_and_prints_a_table():
    """What `eval.py sweep` prints on a B200 (it has not run on one): the cases it checks first are valid ones,
    and its table gives each configuration's verdict, times, geometric mean and model figure."""
    cases = peers.awkward_shape_sets()
    for case in cases:
        check_case(case.args)
        assert parse_test_line(case.spec) == case.args
    assert {(case.args["m"][0], case.args["n"][0]) for case in cases} == {
        (m, n) for m in (1, 72, 129, 257) for n in (128, 384)}
    rows = [{"config": "128x128/round-robin", "exact": "18/18", "wrong": [], "us": {0: 30.0, 1: 20.0},
             "model_us": {0: 31.0, 1: 21.0}},
            {"config": "swap-128x256/contiguous", "exact": "17/18", "wrong": ["m: [1, 65]; ...: mismatch"], "us": {},
             "model_us": {0: 28.0, 1: 22.0}}]
    table = peers.format_b200_sweep(rows, [0, 1], {0: "128x128/round-robin"}).splitlines()
    assert table[0].split() == ["configuration", "exact", "#0", "us", "#1", "us", "geomean", "model"]
    assert table[1].split() == ["128x128/round-robin", "18/18", "30.00*", "20.00", "24.49", "25.51"]
    assert table[2].split() == ["swap-128x256/contiguous", "17/18", "-", "-", "-", "24.82"]
    assert table[3] == "    wrong: m: [1, 65]; ...: mismatch"


def test_the_sample_trace_records_gc_pauses_inside_a_sample_only_when_asked(tmp_path, monkeypatch):
    import gc
    args = {"m": [64], "n": [128], "k": [256], "g": 1, "seed": 1}
    monkeypatch.delenv(measure.SAMPLE_TRACE_ENV, raising=False)
    quiet = measure.SampleTrace.from_environment(args)
    with quiet.sample():
        gc.collect()
    quiet.record(0, 1234.0)  # no file named: nothing written, nothing raised
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(measure.SAMPLE_TRACE_ENV, str(path))
    trace = measure.SampleTrace.from_environment(args)
    for index in range(2):
        with trace.sample():
            if index == 1:
                gc.collect()
        trace.record(index, 21500.0)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["sample"] for line in lines] == [0, 1]
    assert lines[0]["gc_pauses"] == [] and lines[1]["gc_pauses"][-1][0] == 2  # gc.collect() is generation 2
    assert lines[1]["us_per_call"] == 21.5 and lines[1]["sizes"] == [[64], [128], [256]]
    assert all(line["host_ms"] >= 0 for line in lines)
    assert all(line["allocator"] == {} for line in lines)  # no CUDA here: no allocator call moved
    assert gc.callbacks.count(trace._on_gc) == 0  # removed after each sample
    # scripts/sample_trace.py reads it: the median, the first samples, the stalls
    done = subprocess.run([sys.executable, "scripts/sample_trace.py", str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "2 samples, median 21.50 us/call" in done.stdout and "sample   1:      21.50 us/call" in done.stdout


def test_the_b200_sweep_runs_end_to_end_with_stand_ins(monkeypatch, capsys):
    """`sweep_b200` itself on the CPU: two configurations (one exact, through the reference; one wrong on the
    awkward cases with M=1), the checks on every test and awkward case, then a stand-in timer on the benchmarks
    for the exact one only, and the table. (On a B200 the kernel and the leaderboard's timing loop stand here.)"""
    import torch
    from nvfp4_group_gemm import submission
    from nvfp4_group_gemm.reference import ref_kernel
    good = submission.TILE_CONFIGS["128x128"].with_schedule(submission.Schedule(contiguous=True))
    bad = submission.TILE_CONFIGS["swap-128x256"]

    def run(data, config):
        out = ref_kernel(data)
        if config is bad and data[3][0][0] == 1:
            out[0].add_(1)
        return out
    timed = []
    monkeypatch.setattr(submission, "policy_candidates", lambda: [good, bad])
    monkeypatch.setattr(peers, "run_b200", run)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "stand-in B200")
    monkeypatch.setattr(peers, "benchmark_inputs", lambda args: [args])
    monkeypatch.setattr(peers, "time_loop_us", lambda fn, inputs: timed.append(inputs[0]["m"][0]) or 10.0 * len(timed))
    bench = list(enumerate(casefile.read_test_file(casefile.BENCHMARKS_FILE)))[:2]
    assert peers.sweep_b200(bench) == 1  # a wrong configuration fails the sweep
    out = capsys.readouterr().out
    checks = len(casefile.read_test_file(casefile.TESTS_FILE)) + len(peers.awkward_shape_sets())
    assert f"2 configurations, each checked on {checks} cases, then timed on 2 benchmarks" in out
    assert "[1/2] 128x128/contiguous: exact" in out and "[2/2] swap-128x256/round-robin: WRONG on 2 cases" in out
    assert timed == [bench[0][1].args["m"][0], bench[1][1].args["m"][0]]  # only the exact one is timed
    rows = {line.split()[0]: line.split() for line in out.splitlines() if "-128x" in line or "128x128/" in line}
    assert rows["128x128/contiguous"][1:5] == [f"{checks}/{checks}", "10.00", "20.00", "14.14"]
    assert rows["swap-128x256/round-robin"][1:5] == [f"{checks - 2}/{checks}", "-", "-", "-"]


def test_moe_checks_the_op_on_the_tasks_uniform_shape_sets():
    """`eval.py moe`: every test and benchmark of one N and K (on a CPU those of N x K at most 4096^2) as
    stacked inputs, each checked, the path that ran named (the kernel on sm_90/sm_100, else portable)."""
    done = subprocess.run([sys.executable, "-W", "ignore", "eval.py", "moe"], cwd=ROOT, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("  benchmark")]
    assert [r[1] for r in rows] == (["0", "1", "2", "3"] if HAS_CUDA else ["1", "2", "3"])
    assert all(r[3] == "ok" and r[2] in ("kernel", "portable") for r in rows), done.stdout
    if not HAS_CUDA:
        assert all(r[2] == "portable" for r in rows)
        assert "(benchmark 0 left out: N x K over 16,777,216, minutes on a CPU)" in done.stdout  # said, not silent


def test_mlp_checks_the_expert_mlp_and_its_replays_under_new_routings():
    """`eval.py mlp`: the MLP against the bf16 MLP at two row counts (error printed, under 0.25), then three
    routings through the same buffers (a CUDA graph's replays on a GPU), each equal to an eager call."""
    done = subprocess.run([sys.executable, "-W", "ignore", "eval.py", "mlp"], cwd=ROOT, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    errors = [float(line.split("bf16 MLP ")[1].split()[0]) for line in done.stdout.splitlines() if "error vs" in line]
    assert len(errors) == 2 and all(0 < e < 0.25 for e in errors), done.stdout
    assert done.stdout.count("equal to an eager call") == 3, done.stdout


def test_the_benchmark_table_gives_each_shapes_share_of_the_cards_floor(capsys, monkeypatch):
    """On a Hopper card each benchmark's floor: the longer of its FLOPs at the fp16 dense rate and its bytes at
    the HBM bandwidth (benchmark 0 on an H100: 60.1 GFLOP at 989 TFLOP/s, 60.8 us; decode's M = 16 per group:
    the weights' bytes at 3.35 TB/s)."""
    from nvfp4_group_gemm import cli, measure
    h100 = measure.card_of("NVIDIA H100 80GB HBM3")
    assert h100.name == "H100" and measure.card_of("NVIDIA H200").name == "H200"
    assert measure.card_of("NVIDIA B200").name == "B200" and measure.card_of("NVIDIA A100-SXM4-80GB") is None
    bench0 = [(m, 4096, 7168, 1) for m in (80, 176, 128, 72, 64, 248, 96, 160)]
    assert measure.floor_us(bench0, h100) == pytest.approx(2 * 1024 * 4096 * 7168 / 989e12 * 1e6)
    decode = [(16, 4096, 7168, 1)] * 8
    weights = 8 * (4096 * 7168 // 2 + 4096 * 7168 // 16)
    assert measure.floor_us(decode, h100) == pytest.approx(1e6 * (weights + 8 * (16 * 7168 * 9 // 16 + 2 * 16 * 4096))
                                                           / 3.35e12)
    assert 39 < measure.floor_us(decode, h100) < 40  # the weights' 132 MB dominate
    floor = measure.floor_us(bench0, h100)
    stats = measure.Stats(runs=10, mean=2 * floor * 1e3, std=0.0, err=0.0, best=floor * 1e3, worst=floor * 1e3)
    rows = [{"kind": "benchmark", "index": 0, "spec": "", "sizes": bench0, "ok": True, "stats": stats}]
    monkeypatch.setattr(cli, "flush_description", lambda: "a stand-in flush")  # the CPU has no GPU memory to ask
    cli.print_report(rows, "sm90-wgmma", h100)
    out = capsys.readouterr().out
    assert "% floor" in out and "H100's floor" in out
    (line,) = [l for l in out.splitlines() if l.strip().startswith("0 ok")]
    assert f"{floor:.2f}" in line and " 50.0%" in line
    cli.print_report(rows, "b200-tcgen05", measure.card_of("NVIDIA B200"))  # the B200: % SOL alone
    assert "% floor" not in capsys.readouterr().out


def test_the_peers_table_gives_each_benchmarks_share_of_its_floor():
    """eval.py benchmarks' peer line on a Hopper GPU: our time's share of the shape set's floor on the card, here
    benchmark 0 on an H100, where the floor is its FLOPs (2 x 1,024 x 4,096 x 7,168) at 989 TFLOP/s (its bytes
    take less at 3.35 TB/s); a card with no floor known gets a dash."""
    from nvfp4_group_gemm import measure
    sizes = [(m, 4096, 7168, 1) for m in (80, 176, 128, 72, 64, 248, 96, 160)]
    flops_floor_us = 2 * 1024 * 4096 * 7168 / 989e12 * 1e6
    assert measure.dram_bytes_of(sizes) / 3.35e12 * 1e6 < flops_floor_us
    line = peers.peers_row(0, (126.29, 216.36, 400.0, 9000.0), sizes, 794.0, measure.card_of("NVIDIA H100 80GB HBM3"),
                           "hopper-sm90")
    assert line.split() == ["0", "126.29", "216.36", "400.00", "9000.00",
                            f"{2 * 1024 * 4096 * 7168 / 126.29e-6 / 1e12:.1f}",
                            f"{100 * 2 * 1024 * 4096 * 7168 / 126.29e-6 / 794e12:.1f}%",
                            f"{100 * flops_floor_us / 126.29:.1f}%", "1.71x", *line.split()[9:]]
    assert f"{100 * flops_floor_us / 126.29:.1f}" == "48.1"
    share = f"{100 * flops_floor_us / 126.29:.1f}%"  # under its header's column
    assert peers.PEERS_HEADER.index("% floor") + len("% floor") == line.index(share) + len(share)
    assert peers.peers_row(0, (126.29, 216.36, 400.0, 9000.0), sizes, 794.0, None, "x").split()[7] == "-"
