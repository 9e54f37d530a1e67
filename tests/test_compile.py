"""The B200 kernel compiles for sm_100a on a machine without a GPU.

Each compile runs in a fresh interpreter (`eval.py compile`), because CuTe DSL
takes its target from CUTE_DSL_ARCH. Set NVFP4_EXTRA_CUTLASS_DSL to a folder
holding another nvidia-cutlass-dsl release (as `.ci/run` does for 4.5.2) to
compile under that release too."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BENCHMARK_CASES, ROOT, TEST_CASES

EXTRA_DSL = os.environ.get("NVFP4_EXTRA_CUTLASS_DSL")
DSL_INSTALLS = ["installed"] + (["extra"] if EXTRA_DSL else [])


def env_for(install: str) -> dict:
    env = dict(os.environ, CUTE_DSL_ARCH="sm_100a")
    if install == "extra":
        # Newer wheels keep the packages in dsl_packages, older in python_packages.
        paths = [os.path.join(EXTRA_DSL, "nvidia_cutlass_dsl", sub)
                 for sub in ("python_packages", "dsl_packages")] + [EXTRA_DSL]
        env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return env


def run_python(code: str, install: str = "installed") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT,
                          env=env_for(install), capture_output=True, text=True, timeout=1800)


@pytest.mark.parametrize("install", DSL_INSTALLS)
def test_every_task_shape_compiles_without_spills(install, tmp_path):
    report = tmp_path / "compile.json"
    done = subprocess.run([sys.executable, "-W", "ignore", "eval.py", "compile", "--json", str(report)],
                          cwd=ROOT, env=env_for(install), capture_output=True, text=True, timeout=1800)
    assert not list(ROOT.glob("*.ptx")) and not list(ROOT.glob("*.cubin"))  # nothing left behind
    rows = json.loads(report.read_text()) if report.exists() else []
    if rows and all("PtxasTooOld" in r.get("error", "") for r in rows):
        pytest.skip(f"the PTX is newer than this machine's ptxas: {rows[0]['error']}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    expected = [[list(p) for p in zip(c.args["m"], c.args["n"], c.args["k"], [1] * c.args["g"])]
                for c in TEST_CASES + BENCHMARK_CASES]
    assert [r["problem_sizes"] for r in rows] == expected  # all 14, in order
    if install == "extra":
        assert rows[0]["cutlass_dsl"] != "?"
        print("extra nvidia-cutlass-dsl:", rows[0]["cutlass_dsl"])
    for row in rows:
        assert row["ok"], row
        assert row["spill_store_bytes"] == 0 and row["spill_load_bytes"] == 0
        assert row["tcgen05_mma"]
        assert 0 < row["registers"] <= 255
        assert 0 < row["dynamic_smem_bytes"] <= 232448  # B200: 227 KiB per block


def test_same_group_count_never_shares_a_stale_kernel():
    code = """
import json, submission
first = [(96, 128, 256, 1), (128, 256, 512, 1)]
second = [(256, 512, 256, 1), (72, 384, 256, 1)]
c1, k1 = submission.compile_grouped_gemm(first)
c2, k2 = submission.compile_grouped_gemm(second)
c1_again, _ = submission.compile_grouped_gemm([list(p) for p in first])
print(json.dumps({
    "distinct": c1 is not c2, "cached": c1 is c1_again,
    "k1": k1.problem_sizes, "k2": k2.problem_sizes,
    "ctas": [k1.num_ctas, k2.num_ctas],
    "ptx_differs": c1.artifacts.PTX != c2.artifacts.PTX,
}))
"""
    done = run_python("import os, tempfile; os.environ['CUTE_DSL_KEEP'] = 'ptx'; "
                      "os.environ['CUTE_DSL_DUMP_DIR'] = tempfile.mkdtemp()\n" + code)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["distinct"] and result["cached"]
    assert result["k1"] == [[96, 128, 256, 1], [128, 256, 512, 1]]
    assert result["k2"] == [[256, 512, 256, 1], [72, 384, 256, 1]]
    assert result["ctas"] == [1 * 1 + 1 * 2, 2 * 4 + 1 * 3]
    assert result["ptx_differs"]
