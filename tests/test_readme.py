"""The README is for users: about 1,000 words, its status first, and every command in it run by a test or by
CI. A command nobody runs goes stale unnoticed, so each one is accounted for here: run by this file, found in
the CI script that runs it, or (two kinds that cannot run here) checked for what can be checked."""
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, needs_cuda
from nvfp4_group_gemm import eval as evaluation
from nvfp4_group_gemm import cli

README = (ROOT / "README.md").read_text()
CI = (ROOT / ".ci" / "run").read_text()
FRESH_MACHINE = (ROOT / "scripts" / "fresh-machine-check.sh").read_text()


def blocks(language: str) -> list:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def commands() -> list:
    """Every command of the README's bash blocks, `a && b` split in two."""
    found = []
    for block in blocks("bash"):
        for line in block.splitlines():
            found += [part.strip() for part in line.split("&&") if part.strip()]
    return found


def in_ci(command: str) -> bool:
    """CI runs `command` (its `pip` lines with -q), here or through scripts/fresh-machine-check.sh."""
    quiet = re.sub(r"^pip install ", "pip install -q ", command)
    lines = [line.strip() for line in (CI + FRESH_MACHINE).splitlines() if not line.strip().startswith("#")]
    runs = [re.compile(rf"(^|\s){re.escape(form)}\s*($|[>|;&])") for form in (command, quiet)]
    return any(run.search(line) for run in runs for line in lines)


# Run by the tests below: cheap enough to run on every CI run.
RUN_HERE = ("python eval.py tests --case 3",
            'python eval.py --shape "m: [64, 200]; n: [256, 512]; k: [512, 256]; g: 2; seed: 7"',
            "python eval.py --help",
            'python -m pytest -m "not gpu"')
# PyTorch's own index is out of this project's machines' reach (they reach PyPI alone); CI installs the same
# CPU build of torch from a file (`pip install torch==2.13.0` in .ci/run).
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def test_about_a_thousand_words_and_the_status_first():
    words = len(README.split())
    assert 900 <= words <= 1250, words
    first = README.split("\n\n")[1]
    assert "never run" in first and "B200" in first and "H200" in first and "torch._grouped_mm" in first
    assert "../" not in README  # nothing outside the repository


def test_every_command_is_run_by_a_test_or_by_ci():
    unaccounted = [c for c in commands() if not (c in RUN_HERE or in_ci(c) or c == CPU_TORCH
                                                 or c.startswith("popcorn-cli "))]
    assert not unaccounted, f"README commands that nothing runs: {unaccounted}"
    assert set(RUN_HERE) <= set(commands())  # the list above stays the README's
    assert "pip install -q torch==2.13.0" in CI and CPU_TORCH in commands()


def test_the_leaderboard_commands_name_this_leaderboard_the_artifact_and_its_modes():
    """popcorn-cli talks to GPU MODE's servers, which no test can reach: its arguments are checked instead."""
    lines = [c for c in commands() if c.startswith("popcorn-cli ")]
    assert len(lines) == 3
    for line in lines:
        words = shlex.split(line)
        options = dict(zip(words[2:-1:2], words[3:-1:2]))
        assert words[:2] == ["popcorn-cli", "submit"] and words[-1] == "submission.py"
        assert (ROOT / words[-1]).is_file()
        assert options["--gpu"] == "B200" and options["--leaderboard"] == "nvfp4_group_gemm"
        assert options["--mode"] in evaluation.PROTOCOL_MODES


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in RUN_HERE if c.startswith("python eval.py")])
def test_the_readmes_eval_commands_exit_0(command, tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "readme-cache"  # shared: each kernel compiles once here
    env = dict(os.environ, NVFP4_GROUP_GEMM_CACHE=str(cache))
    done = subprocess.run([sys.executable, "-W", "ignore", *shlex.split(command)[1:]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_the_readmes_cpu_suite_selects_every_test_that_needs_no_gpu():
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "not gpu", "--collect-only", "-q",
                           "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert len(collected) > 100 and not [line for line in collected if "test_gpu.py" in line]


@needs_cuda
def test_the_readmes_python_runs():
    """The library and CUDA-graph examples, in order, in one namespace."""
    namespace = {}
    for block in blocks("python"):
        exec(compile(block, "README.md", "exec"), namespace)
    import torch
    torch.cuda.synchronize()
    assert namespace["check_implementation"](namespace["data"], namespace["outputs"])[0]


def test_every_inline_eval_command_is_one_the_cli_takes():
    """`python eval.py ...` in the README's prose (not run here: `sweep` needs a B200) parses as the CLI parses
    it: a renamed command or option shows up here."""
    inline = re.findall(r"`(python eval\.py[^`]*)`", README)
    assert "python eval.py sweep" in inline
    for command in inline:
        argv = shlex.split(command)[2:]
        options = cli.build_parser().parse_args(argv or ["all"])
        cli.check_options(options)


def test_the_readmes_moe_example_runs_and_computes_the_layer():
    """The MoE example, alone (on the CPU here): every token's output is its own expert's product, up to NVFP4's
    quantization (cosine similarity with the bf16-free float product)."""
    block = next(b for b in blocks("python") if "grouped_mm_nvfp4" in b)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    import torch
    x, w, expert, y = (namespace[name] for name in ("x", "w", "expert", "y"))
    exact = torch.einsum("tk,tnk->tn", x, w[expert])
    cosine = torch.nn.functional.cosine_similarity(y.float(), exact, dim=1)
    assert y.shape == exact.shape and cosine.min() > 0.97, cosine.min()
    h, offs, order = namespace["h"], namespace["offs"], namespace["order"]  # the expert MLP after it
    assert h.shape == x.shape and h.dtype == torch.bfloat16 and torch.isfinite(h[:int(offs[-1])]).all()
