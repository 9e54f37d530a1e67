"""scripts/gpu-check.sh reports a failing step in its exit status and last line.

Its steps pipe into tee; a failure recorded inside the pipeline's subshell used
to be lost, so the script passed whatever happened. Checked here on the CPU with
a stand-in nvidia-smi, the one step that needs no GPU to run."""
import os
import subprocess
import sys

from conftest import ROOT


def gpu_check(tmp_path, smi_exit: int) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho stand-in nvidia-smi\nexit {smi_exit}\n")
    smi.chmod(0o755)
    env = dict(os.environ, OUT=str(tmp_path / "out"), GPU_CHECK_STEPS="smi",
               PATH=f"{bin_dir}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
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
