"""scripts/gpu-check.sh reports a failing step in its exit status and last line.

Its steps pipe into tee; a failure recorded inside the pipeline's subshell used
to be lost, so the script passed whatever happened. Checked here on the CPU with
a stand-in nvidia-smi, the one step that needs no GPU to run."""
import argparse
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT


def installed_dsl() -> str:
    return subprocess.run([sys.executable, "-c", "import cutlass; print(cutlass.__version__)"],
                          capture_output=True, text=True, timeout=120).stdout.strip()


def gpu_check(tmp_path, smi_exit: int, releases: str = None, **env) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho stand-in nvidia-smi\nexit {smi_exit}\n")
    smi.chmod(0o755)
    env = dict(os.environ, OUT=str(tmp_path / "out"), GPU_CHECK_STEPS="smi",
               GPU_CHECK_RELEASES=releases or installed_dsl(),
               PATH=f"{bin_dir}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}", **env)
    return subprocess.run(["bash", "scripts/gpu-check.sh"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_gpu_check_fails_when_a_step_fails(tmp_path):
    done = gpu_check(tmp_path, smi_exit=3)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "=== gpu-check: FAILED: smi"
    assert "stand-in nvidia-smi" in (tmp_path / "out" / "smi.log").read_text()


def test_gpu_check_passes_when_its_steps_pass(tmp_path):
    done = gpu_check(tmp_path, smi_exit=0)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("=== gpu-check: pass")
    assert f"cutlass-dsl {installed_dsl()}" in (tmp_path / "out" / f"versions-{installed_dsl()}.log").read_text()


def test_gpu_check_fails_a_release_it_cannot_find(tmp_path):
    """A release with no archive, folder or install is a failed step that says what to do, not a skipped one."""
    done = gpu_check(tmp_path, smi_exit=0, releases=f"{installed_dsl()} 0.0.1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "=== gpu-check: FAILED: dsl@0.0.1"
    assert "nvidia-cutlass-dsl 0.0.1 not found" in done.stderr and "pack-cutedsl 0.0.1" in done.stderr


@pytest.mark.skipif(not os.environ.get("NVFP4_EXTRA_CUTLASS_DSL"), reason="needs NVFP4_EXTRA_CUTLASS_DSL (CI sets it)")
def test_gpu_check_runs_its_steps_under_each_release(tmp_path):
    """Each release's steps import that release (CI's second release from NVFP4_EXTRA_CUTLASS_DSL)."""
    from nvfp4_group_gemm import toolchain
    done = gpu_check(tmp_path, smi_exit=0, releases=" ".join(toolchain.CHECKED_DSL_RELEASES))
    assert done.returncode == 0, done.stdout + done.stderr
    for release in toolchain.CHECKED_DSL_RELEASES:
        assert f"cutlass-dsl {release}\n" in (tmp_path / "out" / f"versions-{release}.log").read_text()


# ---- every other script: it parses; those that run on a CPU, run ----------------------------------------
SCRIPTS = sorted(p.name for p in (ROOT / "scripts").iterdir() if p.suffix in (".sh", ".py"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_parses_and_is_documented(name):
    path = ROOT / "scripts" / name
    if path.suffix == ".sh":
        done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    else:
        compile(path.read_text(), str(path), "exec")
    assert f"`{name}" in (ROOT / "docs" / "developing.md").read_text() or f"{name}`" in (
        ROOT / "docs" / "developing.md").read_text(), f"{name} is not in docs/developing.md's table"


def test_ptx_counts_finds_equal_and_differing_instruction_counts(tmp_path):
    before, after = tmp_path / "before", tmp_path / "after"
    for folder in (before, after):
        folder.mkdir()
    kernel = "\tmbarrier.init.shared.b64 [%r1], 1;\n\tgriddepcontrol.wait;\n\twgmma.mma_async.sync.aligned;\n"
    (before / "k.ptx").write_text(kernel)
    (after / "k.ptx").write_text(kernel + "\t// wgmma.mma_async in a comment does not count\n")
    same = subprocess.run([sys.executable, "scripts/ptx_counts.py", str(before), str(after)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert same.returncode == 0 and "differs" not in same.stdout, same.stdout + same.stderr
    (after / "k.ptx").write_text(kernel + "\tgriddepcontrol.launch_dependents;\n")
    changed = subprocess.run([sys.executable, "scripts/ptx_counts.py", str(before), str(after)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert changed.returncode == 1 and re.search(r"griddepcontrol\s+1\s+2\s+<- differs", changed.stdout)


def test_moe_forms_models_each_form_and_names_moe_choices_pick_without_a_gpu():
    """Without an sm_90 GPU: each form's and the op's modeled figure per routing, their means, moe_choice's
    pick and the forms the op launches; sizes that are not E experts of T rows are refused."""
    from nvfp4_group_gemm import hopper_policy
    run = lambda *extra: subprocess.run([sys.executable, "scripts/moe_forms.py", "512", "2", "4096", "1536", *extra],
                                        cwd=ROOT, capture_output=True, text=True, timeout=300,
                                        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    done = run("--routings", "2", "--sizes", "128,384")
    assert done.returncode == 0, done.stderr
    assert "model only" in done.stdout and "named: rows 128..384" in done.stdout
    # each form and the op as launched: two samples, the named, the means
    forms = len(hopper_policy.SM90_TILE_COST_NS)
    assert len(re.findall(r"model +[0-9.]+ us", done.stdout)) == (forms + 1) * (2 + 1 + 1)
    assert f"moe_choice: {hopper_policy.moe_choice(512, 2, 4096, 1536, 132).name}" in done.stdout
    launched = hopper_policy.moe_forms(512, 2, 4096, 1536, 132)
    assert "moe_forms: " + " then ".join(f.name for f in launched) in done.stdout
    # the named routing (rows multiples of 128) fits the default form's one wave: the op is modeled as it
    named = done.stdout.split("named:")[1].split("mean over")[0]
    figure = lambda name: re.search(re.escape(name) + r" +model +([0-9.]+) us", named).group(1)
    assert figure("the op (moe_forms)") == figure("sm90-128x128-k128-wr-n16-64-offs")
    refused = run("--sizes", "128,383")
    assert refused.returncode == 2 and "--sizes: 2 experts of 511 rows, expected 2 of 512" in refused.stderr


def test_ab_table_prints_the_rounds_and_the_ratio(tmp_path):
    for side, means in (("old", (20000.0, 10000.0)), ("new", (19000.0, 10500.0))):
        for round_ in (1, 2):
            (tmp_path / f"{side}-{round_}.txt").write_text(
                "".join(f"benchmark.{i}.mean: {m}\n" for i, m in enumerate(means)))
    done = subprocess.run([sys.executable, "scripts/ab_table.py", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert rows == [["0", "20.00", "20.00", "19.00", "19.00", "0.950"],
                    ["1", "10.00", "10.00", "10.50", "10.50", "1.050"]]


SWEEP_HEAD = "      N     K     M  floor us   ours us  % floor bf16 floor    gmm us  % floor  vs gmm\n"


def test_ab_table_of_two_m_sweeps_pairs_their_points(tmp_path):
    """scripts/ab-benchmarks.sh's table with SWEEP_M: each timed point of m_sweep.py's output by (N, K, M),
    new / old; a point without a time (a CPU's floors-only row) is no point."""
    rows = {"old": ("   4096  7168    16     39.91     86.24    46.3%     141.09    179.34    78.7%   2.08x\n"
                    "   7168  2048    16     20.31     67.91    29.9%      70.82     99.99    70.8%   1.47x\n"),
            "new": ("   4096  7168    16     39.91     43.12    92.6%     141.09    179.34    78.7%   4.16x\n"
                    "   7168  2048    16     20.31                           70.82\n")}
    for side, text in rows.items():
        (tmp_path / f"{side}-1.txt").write_text(SWEEP_HEAD + text)
    done = subprocess.run([sys.executable, "scripts/ab_table.py", "--m-sweep", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    table = [line.split() for line in done.stdout.splitlines()[1:]]
    assert table == [["4096", "7168", "16", "86.24", "43.12", "0.500"], ["7168", "2048", "16", "67.91", "nan"]]


def test_ab_m_sweep_runs_both_trees_and_finds_no_time_without_a_gpu(tmp_path):
    """The A/B script's m_sweep mode on a CPU: m_sweep.py runs in both trees (floors only), so no point is
    timed: it says so and exits 1 rather than printing an empty comparison."""
    done = subprocess.run(["bash", "scripts/ab-benchmarks.sh", "."], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES="", SWEEP_M="16", ROUNDS="1",
                                                OUT=str(tmp_path)))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "=== old round 1: 0 points timed" in done.stdout and "=== new round 1: 0 points timed" in done.stdout
    assert "no m_sweep times found" in done.stdout
    assert "no GPU: floors only" in (tmp_path / "old-1.txt").read_text()


def test_without_cuda_hides_every_ptxas_and_needs_a_command(tmp_path):
    fake = tmp_path / "cuda" / "bin"
    fake.mkdir(parents=True)
    (fake / "ptxas").write_text("#!/bin/sh\n")
    (fake / "ptxas").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", PTXAS=str(fake / "ptxas"))
    done = subprocess.run(["bash", "scripts/without-cuda.sh", "bash", "-c", "echo ${PTXAS:-unset}; command -v ptxas"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout.strip() == "unset", done.stdout + done.stderr  # no ptxas found
    usage = subprocess.run(["bash", "scripts/without-cuda.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "usage:" in usage.stderr


# ---- racecheck: the verdict on logs of the tool's own format, the pattern's PTX --------------------------
RACECHECK_LOG = ROOT / "tests" / "data" / "racecheck-hopper-h100-nolineinfo.log"  # the H100's racecheck output


def run_verdict(tmp_path, text: str) -> subprocess.CompletedProcess:
    log = tmp_path / "racecheck.log"
    log.write_text(text)
    return subprocess.run([sys.executable, "scripts/racecheck_verdict.py", str(log)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


GEMM_SYMBOL = re.search(r"at (kernel_cutlass_\w+)\+", RACECHECK_LOG.read_text()).group(1)  # the Hopper GEMM's


def with_lines(text: str, write_at: str, read_at: str, kernel: str = GEMM_SYMBOL) -> str:
    """The log as racecheck writes it with line information: ` in FILE:LINE:KERNEL` after each access."""
    text = re.sub(r"(Write access at \S+)", rf"\1 in /somewhere/{write_at}:{kernel}", text)
    return re.sub(r"(Read access at \S+)", rf"\1 in /somewhere/{read_at}:{kernel}", text)


def hazard_log(direction: str, write_at: str, read_at: str, kernel: str = GEMM_SYMBOL) -> str:
    """One report in racecheck's hazard form (`--racecheck-report hazard`), which names the direction."""
    return (f"========= Error: Potential {direction} hazard detected at __shared__ 0x40 in block (3, 0, 0) :\n"
            f"=========     Write Thread (256, 0, 0) at {kernel}+0x2ad0 in /somewhere/{write_at}:{kernel}\n"
            f"=========     Read Thread (5, 0, 0) at {kernel}+0x6b20 in /somewhere/{read_at}:{kernel}\n"
            "=========     Current Value : 0, Incoming Value : 0\n"
            "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n")


def line_of(path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


HOPPER_SOURCE = ROOT / "nvfp4_group_gemm" / "hopper.py"


def hopper_line(needle: str) -> str:
    return f"nvfp4_group_gemm/hopper.py:{line_of(HOPPER_SOURCE, needle)}"


def proven_pattern_lines() -> tuple:
    """Where the Hopper kernel's proven pattern is: its SFB bulk copy (the write) and its scale-word load."""
    return hopper_line("cute.copy(bulk, src, sSFB"), hopper_line("scales = scale_words[")


def test_racecheck_verdict_passes_only_the_proven_pattern(tmp_path):
    """The exact write and read statements in the Hopper GEMM pass; the same report anywhere else fails: the
    scale words' view rather than their load, the packed B load (another buffer), another kernel (the
    descriptor builder), the write elsewhere, no line information at all."""
    text = RACECHECK_LOG.read_text()
    write, read = proven_pattern_lines()
    done = run_verdict(tmp_path, with_lines(text, write, read))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "917504 hazards, all of the proven pattern" in done.stdout
    builder = GEMM_SYMBOL.replace("Sm90GroupedGemmKernel", "Sm90TensormapBuilder")
    producer = hopper_line("def producer(")
    for text_ in (with_lines(text, write, hopper_line("scale_words = cute.recast_tensor")),
                  with_lines(text, write, hopper_line("packed = blocks[r,")),
                  with_lines(text, write, read, kernel=builder), with_lines(text, producer, read), text):
        done = run_verdict(tmp_path, text_)
        assert done.returncode == 1 and "outside the proven pattern" in done.stdout, done.stdout
    assert run_verdict(tmp_path, "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
                       ).returncode == 0
    assert run_verdict(tmp_path, "no summary: the tool stopped\n").returncode == 1


def test_racecheck_verdict_reads_the_hazard_form_and_passes_only_write_after_read(tmp_path):
    """In racecheck's hazard form the direction is given: the proven pattern is a write after reads; a read
    after the write on the same statements (a consumer reading a stage before its wait) fails, as does WAW."""
    write, read = proven_pattern_lines()
    done = run_verdict(tmp_path, hazard_log("WAR", write, read))
    assert done.returncode == 0, done.stdout + done.stderr
    for direction in ("RAW", "WAW"):
        done = run_verdict(tmp_path, hazard_log(direction, write, read))
        assert done.returncode == 1 and direction in done.stdout, done.stdout


def test_racecheck_verdict_fails_reports_it_cannot_read_and_the_pattern_outside_its_own_log(tmp_path):
    """Reports in a form it does not know, or more reports than the verdict read, fail it (they passed as
    "clean"); the pattern kernel's lines pass only the pattern's own log (--pattern), and there its negative
    control (racecheck_pattern.py early-read: a load before the wait) fails."""
    summary = "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n"
    for other_form in ("========= ERROR: Potential hazard of some new kind at __shared__ 0x10 :\n",
                       "========= Note: a race reported in words this verdict has never seen\n"):
        done = run_verdict(tmp_path, other_form + summary)
        assert done.returncode == 1 and "does not read" in done.stdout, done.stdout
    for known_form in ("========= ERROR: Potential RAW hazard detected at __shared__ 0x10 in block (0,0,0) :\n",
                       "========= WARN: Race reported between Write access at k+0x10 and Read access at k+0x20\n"):
        done = run_verdict(tmp_path, known_form + summary)  # read now (they passed as "clean"), and not the pattern
        assert done.returncode == 1 and "outside the proven pattern" in done.stdout, done.stdout
    text = RACECHECK_LOG.read_text()
    pattern = ROOT / "scripts" / "racecheck_pattern.py"
    write_at = f"scripts/racecheck_pattern.py:{line_of(pattern, 'cute.copy(bulk, src[(None, r)]')}"
    read_at = f"scripts/racecheck_pattern.py:{line_of(pattern, 'total = total + words[')}"
    early_at = f"scripts/racecheck_pattern.py:{line_of(pattern, 'total = words[')}"
    ring = "kernel_cutlass_ring_0"
    in_ring = with_lines(text, write_at, read_at, kernel=ring)
    done = run_verdict(tmp_path, in_ring)
    assert done.returncode == 1 and "outside the proven pattern" in done.stdout, done.stdout

    def pattern_verdict(text_):
        log = tmp_path / "pattern.log"
        log.write_text(text_)
        return subprocess.run([sys.executable, "scripts/racecheck_verdict.py", "--pattern", str(log)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    done = pattern_verdict(in_ring)
    assert done.returncode == 0, done.stdout + done.stderr
    done = pattern_verdict(with_lines(text, write_at, early_at, kernel=ring))
    assert done.returncode == 1 and "outside the proven pattern" in done.stdout, done.stdout
    two = with_lines(text, *proven_pattern_lines()).replace("1 hazard displayed (1 error",
                                                            "2 hazards displayed (2 errors")
    done = run_verdict(tmp_path, two)
    assert done.returncode == 1 and "the summary counts 2 reports, 1 were read" in done.stdout, done.stdout


# racecheck's own logs of racecheck_pattern.py on an H100 (DSL 4.8.1, CUTE_DSL_LINEINFO=1, `GPU_CHECK_STEPS=racecheck
# scripts/gpu-check.sh`): the plain ring and the negative control (early-read: a stage read before its wait)
PATTERN_LOGS = {variant: ROOT / "tests" / "data" / f"racecheck-pattern-{variant}-h100.log"
                for variant in ("plain", "early-read")}


def test_racecheck_verdict_on_the_patterns_real_logs_passes_the_ring_and_rejects_the_negative_control():
    """The verdict on racecheck's real output (lines as the tool writes them: file name and line alone): the
    plain ring's report (the bulk copy after the stage's reads) passes; the negative control's (the same copy
    against a read before the wait) fails. The logs name lines of racecheck_pattern.py: they must still be
    those statements (else rerun the racecheck step and save its logs here)."""
    pattern = ROOT / "scripts" / "racecheck_pattern.py"
    plain, early = (PATTERN_LOGS[v].read_text() for v in ("plain", "early-read"))
    write = f"racecheck_pattern.py:{line_of(pattern, 'cute.copy(bulk, src[(None, r)]')}"
    assert write in plain and write in early
    assert f"racecheck_pattern.py:{line_of(pattern, 'total = total + words[')}" in plain
    assert f"racecheck_pattern.py:{line_of(pattern, 'total = words[')}" in early
    assert "WRONG" in early and "exact" in plain  # the control reads stale words; the ring does not

    def verdict(path):
        return subprocess.run([sys.executable, "scripts/racecheck_verdict.py", "--pattern", str(path)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    done = verdict(PATTERN_LOGS["plain"])
    assert done.returncode == 0 and "all of the proven pattern" in done.stdout, done.stdout + done.stderr
    done = verdict(PATTERN_LOGS["early-read"])
    assert done.returncode == 1 and "outside the proven pattern" in done.stdout, done.stdout + done.stderr
    # outside --pattern, the pattern file's lines are not the production kernel's: both fail
    assert subprocess.run([sys.executable, "scripts/racecheck_verdict.py", str(PATTERN_LOGS["plain"])], cwd=ROOT,
                          capture_output=True, text=True, timeout=120).returncode == 1


# racecheck's log of the Hopper GEMM under DSL 4.5.2 (H100, CUTE_DSL_LINEINFO=1, GPU_CHECK_STEPS=racecheck
# scripts/gpu-check.sh): one read against four writes a report, each write another copy of the SFB bulk copy;
# taken when that copy was hopper.py line 1328 and the scale-word load line 1350
HOPPER_LOG_452 = ROOT / "tests" / "data" / "racecheck-hopper-4.5.2-h100.log"


def test_racecheck_verdict_on_a_real_hopper_log_passes_several_copies_of_the_write(tmp_path):
    """A report listing one read against several instructions of the bulk copy statement passes (4.5.2's
    form); the same report with one of its writes or its read on another statement fails."""
    write, read = (where.split("/")[-1] for where in proven_pattern_lines())
    text = HOPPER_LOG_452.read_text().replace("hopper.py:1328", write).replace("hopper.py:1350", read)
    done = run_verdict(tmp_path, text)
    assert done.returncode == 0 and "4 race report(s), 917504 hazards" in done.stdout, done.stdout + done.stderr
    producer = hopper_line("def producer(").split("/")[-1]
    first_write = text.index(f"in {write}")
    for other in (text[:first_write] + f"in {producer}" + text[first_write + 3 + len(write):],
                  text.replace(read, hopper_line("packed = blocks[r,").split("/")[-1])):
        done = run_verdict(tmp_path, other)
        assert done.returncode == 1 and "outside the proven pattern" in done.stdout, done.stdout


@pytest.mark.slow
def test_racecheck_pattern_is_the_hopper_kernels_pattern_and_each_variant_adds_its_fence():
    """The pattern kernel issues the Hopper kernel's SFB forms (bulk copy completing on an mbarrier, 32-bit
    shared loads, PipelineTmaAsync's arrive and wait); a variant adds one fence.proxy.async, the plain one none."""
    ptx = {}
    for variant in ("plain", "consumer-fence", "producer-fence", "early-read"):
        done = subprocess.run([sys.executable, "scripts/racecheck_pattern.py", "--ptx", variant], cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        ptx[variant] = done.stdout
    for variant, text in ptx.items():
        assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in text, variant
        assert re.search(r"ld\.shared\.(?:b|u)32", text) and "mbarrier.arrive.expect_tx" in text, variant
        fenced = variant in ("consumer-fence", "producer-fence")
        assert len(re.findall(r"fence\.proxy\.async\.shared::cta", text)) == fenced, variant
    assert not list(ROOT.glob("*.ptx"))  # nothing left behind


def test_m_sweep_prints_each_points_floor_without_a_gpu():
    """Without a GPU: the floors on the H100 (decode at M = 16: the FP4 weights' bytes, 39.9 us at N 4,096 /
    K 7,168; prefill at M = 1,024: the FLOPs at the fp16 rate, 486.4 us), no timing; an unknown card is refused."""
    run = lambda *extra: subprocess.run([sys.executable, "scripts/m_sweep.py", *extra], cwd=ROOT,
                                        capture_output=True, text=True, timeout=300,
                                        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    done = run("--m", "16,1024")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[:1] in (["4096"], ["7168"])]
    assert [r[:4] for r in rows] == [["4096", "7168", "16", "39.91"], ["4096", "7168", "1024", "486.39"],
                                     ["7168", "2048", "16", "20.31"], ["7168", "2048", "1024", "243.19"]]
    assert "no GPU: floors only" in done.stdout
    refused = run("--card", "A100")
    assert refused.returncode == 2 and "no floor known" in refused.stderr


def test_quantizer_bench_says_what_it_moves_and_times_nothing_without_a_gpu():
    """scripts/quantizer_bench.py on a CPU: the bytes a call reads and writes at the default T 4,096 x K 7,168
    (x in bf16, the codes, the worst-case scale buffer for 8 experts: 75.6 MB), then that nothing is timed, exit
    0; its routing covers every token with one expert empty."""
    done = subprocess.run([sys.executable, "scripts/quantizer_bench.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "75.6 MB read and written a call" in done.stdout and "nothing timed" in done.stdout
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import quantizer_bench
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    import torch
    from nvfp4_group_gemm import moe
    assert quantizer_bench.moved_bytes(4096, 7168, 8) == (4096 * 7168 * 5 // 2
                                                          + moe.worst_case_scale_rows(4096, 8) * 7168 // 16)
    # --swiglu: h's gate and up read, (T, 2K), the same written
    assert quantizer_bench.moved_bytes(4096, 2048, 8, swiglu=True) == (4096 * 2048 * 9 // 2
                                                                      + moe.worst_case_scale_rows(4096, 8) * 128)
    # what the options time: the table's kernels, lean or not, on their own CTAs an SM and on those asked for
    settings = quantizer_bench.timed_settings(quantizer_bench.parse(["--table", "--lean", "--table-ctas", "4,5"]))
    from nvfp4_group_gemm import token_quantizer as tq
    assert [s[0] for s in settings] == [
        "value by value", "paired", "paired, lean loop", f"paired, threshold table, {tq.TABLE_CTAS_PER_SM} CTAs an SM",
        "paired, threshold table, 5 CTAs an SM", f"paired, threshold table, lean loop, {tq.LEAN_TABLE_CTAS_PER_SM} "
        "CTAs an SM", "paired, threshold table, lean loop, 4 CTAs an SM"]
    assert [s[1:] for s in settings[-4:]] == [(tq.PAIRED_CTAS_PER_SM, True, False, None),
                                              (tq.PAIRED_CTAS_PER_SM, True, False, 5),
                                              (tq.PAIRED_CTAS_PER_SM, True, True, None),
                                              (tq.PAIRED_CTAS_PER_SM, True, True, 4)]
    assert len(quantizer_bench.timed_settings(quantizer_bench.parse(["--table-ctas", "4"]))) == 2  # needs --table
    offs = quantizer_bench.routing(1000, 8, torch.Generator().manual_seed(1))
    counts = torch.diff(offs, prepend=torch.zeros(1, dtype=offs.dtype))
    assert int(offs[-1]) == 1000 and int(counts[4]) == 0 and bool((counts >= 0).all())
    # its lists of settings: positive integers, a bad one refused before anything runs (exit 2, named)
    for option, bad in (("--paired-ctas", "x"), ("--paired-ctas", "0")):
        refused = subprocess.run([sys.executable, "scripts/quantizer_bench.py", option, bad], cwd=ROOT,
                                 capture_output=True, text=True, timeout=300)
        assert refused.returncode == 2 and f"argument {option}: {bad!r}: expected integers of at least 1" in (
            refused.stderr), refused.stderr
        assert "MB read and written" not in refused.stdout
    for bad in ("0", "65", "x"):  # --graph-calls: one integer, 1 to 64
        refused = subprocess.run([sys.executable, "scripts/quantizer_bench.py", "--graph-calls", bad], cwd=ROOT,
                                 capture_output=True, text=True, timeout=300)
        assert refused.returncode == 2 and f"argument --graph-calls: {bad!r}: expected an integer from 1 to 64" in (
            refused.stderr), refused.stderr


def test_int_between_reads_one_integer_in_its_range_and_refuses_the_rest():
    from nvfp4_group_gemm.cli import int_between
    assert int_between(1, 64)("1") == 1 and int_between(1, 64)("64") == 64
    for bad in ("0", "65", "2.5", "", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected an integer from 1 to 64"):
            int_between(1, 64)(bad)


def test_comma_ints_reads_a_list_and_refuses_what_is_not_one():
    from nvfp4_group_gemm.cli import comma_ints
    assert comma_ints(1)("4,6") == [4, 6] and comma_ints(1)("") == [] and comma_ints(0)("0, 3,") == [0, 3]
    for minimum, bad in ((1, "0"), (0, "-1"), (1, "4,x"), (1, "1.5")):
        with pytest.raises(argparse.ArgumentTypeError, match=f"expected integers of at least {minimum}"):
            comma_ints(minimum)(bad)


@pytest.mark.parametrize("script, option, bad", [("m_sweep.py", "--m", "16,x"), ("sm_scaling.py", "--sms", "0"),
                                                 ("moe_forms.py", "--sizes", "128,-1"),
                                                 ("quantizer_bench.py", "--paired-ctas", "2.5")])
def test_each_scripts_list_option_refuses_a_bad_value_before_anything_runs(script, option, bad):
    """The scripts' comma-separated options go through cli.comma_ints: a bad value is argparse's one-line error
    naming the option (exit 2), with nothing printed before it, not a traceback after the GPU work began."""
    positional = ["512", "2", "4096", "1536"] if script == "moe_forms.py" else []
    refused = subprocess.run([sys.executable, f"scripts/{script}", *positional, option, bad], cwd=ROOT,
                             capture_output=True, text=True, timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert refused.returncode == 2 and f"argument {option}: {bad!r}: expected integers" in refused.stderr, (
        refused.stderr)
    assert refused.stdout == "" and "Traceback" not in refused.stderr


def test_m_sweep_names_each_point_slower_than_a_larger_m_of_its_shape():
    """m_sweep.slower_than_larger: a point slower than a larger M of the same (N, K) is named with that M (the
    largest such), other shapes' points never compared."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import m_sweep
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    times = {(4096, 7168, 16): 63.4, (4096, 7168, 64): 70.2, (7168, 2048, 16): 68.0, (7168, 2048, 64): 55.8,
             (7168, 2048, 128): 57.7, (7168, 2048, 256): 96.9, (4096, 7168, 128): 10.0}
    assert m_sweep.slower_than_larger(times) == [(4096, 7168, 16, 128, 10.0), (4096, 7168, 64, 128, 10.0),
                                                 (7168, 2048, 16, 128, 57.7)]
    assert m_sweep.slower_than_larger({(1, 2, 16): 1.0, (1, 2, 64): 2.0, (3, 4, 8): 9.0}) == []


def test_random_cases_file_is_the_generators_output_and_every_case_is_valid():
    """cases/random20.txt is what scripts/random_cases.py draws by default (so it can be made again), and each
    line is a case the task's rules allow, within the drawn bounds."""
    from nvfp4_group_gemm.casefile import check_case, parse_test_line
    done = subprocess.run([sys.executable, "scripts/random_cases.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (ROOT / "cases" / "random20.txt").read_text()
    lines = done.stdout.splitlines()
    assert len(lines) == 20 and len(set(lines)) == 20
    for line in lines:
        case = parse_test_line(line)
        assert check_case(case) is None, line
        assert 1 <= case["g"] <= 8 and all(1 <= m <= 1024 for m in case["m"]), line
        assert max(case["n"]) <= 7168 and max(case["k"]) <= 7168, line


def test_ncu_source_summary_sums_the_sampled_stalls_by_opcode(tmp_path):
    """scripts/ncu_source_summary.py on a source view as ncu writes it (a line naming the kernel, the columns,
    one row a SASS instruction): the samples summed by opcode with predicates dropped, their share, the
    instructions executed, and the instruction with the most samples with its main stall reason first."""
    rows = [("0x10", "LOP3.LUT R1, R2, 0xf, RZ, 0xc0, !PT", "30", "1,000", "0", "30"),
            ("0x20", "@!P0  BRA 0x40", "50", "10", "50", "0"),
            ("0x30", "@P1 LOP3.LUT R3, R1, R2, RZ, 0xfc, !PT", "10", "1,000", "5", "5"),
            ("0x40", "HMUL2 R4, R3, R5", "0", "500", "0", "0")]
    lines = ['"Kernel Name","kernel_x",',
             '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_long_sb",'
             '"stall_wait"']
    lines += [",".join(f'"{v}"' for v in row) for row in rows]
    path = tmp_path / "source.csv"
    path.write_text("\n".join(lines) + "\n")
    done = subprocess.run([sys.executable, "scripts/ncu_source_summary.py", str(path), "--top", "3"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0] == "4 instructions, 90 samples"
    assert re.match(r"\s+BRA\s+50\s+55\.6 %\s+executed 10$", out[2]), out
    assert re.match(r"\s+LOP3\.LUT\s+40\s+44\.4 %\s+executed 2000$", out[3]), out
    assert "BRA 0x40" in out[6] and re.search(r"long_sb=50$", out[6]), out


def test_sm_scaling_times_nothing_without_a_gpu_and_reads_nvidia_smis_samples():
    """scripts/sm_scaling.py on a CPU: says there is nothing to time, exit 0; its reading of nvidia-smi's
    "clock, power" lines (anything else is no sample)."""
    done = subprocess.run([sys.executable, "scripts/sm_scaling.py", "0", "--sms", "66,132"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 0 and "nothing to time" in done.stdout, done.stdout + done.stderr
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import sm_scaling
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert sm_scaling.parse_sample("1755, 612.34\n") == (1755.0, 612.34)
    assert sm_scaling.parse_sample("[N/A], [N/A]") is None and sm_scaling.parse_sample("") is None
