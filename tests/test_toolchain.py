"""The compile gate needs no CUDA toolkit (ptxas comes with the nvidia-cuda-nvcc wheel; PTXAS overrides it,
PATH stands in where it is missing) and reuses what it compiled (a cache keyed on everything that changes the
result)."""
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from nvfp4_group_gemm import toolchain

GOOD = "m: [64]; n: [256]; k: [512]; g: 1; seed: 7"


def path_without_ptxas() -> str:
    """PATH with every folder that holds a ptxas left out (the system's CUDA toolkit), the venv's bin kept."""
    folders = [os.path.dirname(sys.executable)] + os.environ.get("PATH", "").split(os.pathsep)
    kept = [f for f in dict.fromkeys(folders) if f and not (Path(f) / "ptxas").exists()]
    return os.pathsep.join(kept)


def wheel_installed_or_skip():
    """The nvidia-cuda-nvcc wheel is a dependency of the installed package; a checkout used without installing
    it (a lent GPU machine's own Python) has none, and says so."""
    try:
        importlib.metadata.version("nvidia-cuda-nvcc")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("nvidia-cuda-nvcc is not installed here (`pip install -e .` installs it)")


def stand_in_ptxas(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ptxas"
    path.write_text("#!/bin/sh\necho 'Build stand-in'\n")
    path.chmod(0o755)
    return path


def test_ptxas_comes_from_the_wheel_when_nothing_overrides_it(monkeypatch):
    wheel_installed_or_skip()
    monkeypatch.delenv("PTXAS", raising=False)
    monkeypatch.setenv("PATH", path_without_ptxas())
    assert shutil.which("ptxas") is None
    found = toolchain.find_ptxas()
    assert found is not None, "no ptxas: nvidia-cuda-nvcc, a dependency of this package, is not installed"
    assert found.source == "nvidia-cuda-nvcc" and found.path == toolchain.wheel_ptxas()
    assert "cuda_13" in toolchain.ptxas_version(found.path)


def test_the_wheel_comes_before_path(tmp_path, monkeypatch):
    """A toolkit on PATH is often older than the DSL's PTX: the pinned wheel's ptxas wins over it."""
    wheel_installed_or_skip()
    on_path = stand_in_ptxas(tmp_path / "bin")
    monkeypatch.delenv("PTXAS", raising=False)
    monkeypatch.setenv("PATH", f"{on_path.parent}{os.pathsep}{path_without_ptxas()}")
    assert toolchain.find_ptxas() == (toolchain.wheel_ptxas(), "nvidia-cuda-nvcc")


def test_ptxas_overrides_and_path_stands_in_for_a_missing_wheel(tmp_path, monkeypatch):
    on_path = stand_in_ptxas(tmp_path / "bin")
    monkeypatch.delenv("PTXAS", raising=False)
    monkeypatch.setenv("PATH", f"{on_path.parent}{os.pathsep}{path_without_ptxas()}")
    monkeypatch.setattr(toolchain, "wheel_ptxas", lambda: None)
    assert toolchain.find_ptxas() == (str(on_path), "PATH")
    named = stand_in_ptxas(tmp_path / "named")
    monkeypatch.setenv("PTXAS", str(named))
    assert toolchain.find_ptxas() == (str(named), "PTXAS")
    assert toolchain.ptxas_version(str(named)) == "Build stand-in"
    monkeypatch.setenv("PTXAS", str(tmp_path / "absent"))
    assert toolchain.find_ptxas() is None  # a wrong PTXAS is an error, not a reason to look elsewhere


def test_the_cache_key_follows_sources_and_facts(tmp_path):
    source = tmp_path / "submission.py"
    source.write_text("A = 1\n")
    key = toolchain.ResultCache.key("128x128", "sm_100a", [source], "dsl 4.8.1", "ptxas 13.0")
    assert key == toolchain.ResultCache.key("128x128", "sm_100a", [source], "dsl 4.8.1", "ptxas 13.0")
    others = [toolchain.ResultCache.key("128x128/contiguous", "sm_100a", [source], "dsl 4.8.1", "ptxas 13.0"),
              toolchain.ResultCache.key("128x128", "sm_90a", [source], "dsl 4.8.1", "ptxas 13.0"),
              toolchain.ResultCache.key("128x128", "sm_100a", [source], "dsl 4.5.2", "ptxas 13.0"),
              toolchain.ResultCache.key("128x128", "sm_100a", [source], "dsl 4.8.1", "ptxas 13.1")]
    source.write_text("A = 2\n")
    others.append(toolchain.ResultCache.key("128x128", "sm_100a", [source], "dsl 4.8.1", "ptxas 13.0"))
    assert key not in others and len(set(others)) == len(others)


def test_the_cache_stores_loads_and_turns_off(tmp_path, monkeypatch):
    monkeypatch.setenv(toolchain.CACHE_ENV, str(tmp_path / "c"))
    cache = toolchain.ResultCache.from_environment()
    assert cache.load("k") is None
    cache.store("k", {"ok": True})
    assert cache.load("k") == {"ok": True} and str(tmp_path / "c") in cache.describe()
    monkeypatch.setenv(toolchain.CACHE_ENV, "off")
    off = toolchain.ResultCache.from_environment()
    off.store("k", {"ok": True})
    assert off.load("k") is None and "off" in off.describe()


@pytest.mark.slow
def test_compile_needs_no_toolkit_compiles_only_what_a_shape_needs_and_reuses_it(tmp_path):
    """`eval.py compile --shape` with no ptxas on PATH: the wheel's ptxas, one kernel, progress lines; the
    second run takes it from the cache, with the same report."""
    wheel_installed_or_skip()
    env = dict(os.environ, PATH=path_without_ptxas(), NVFP4_GROUP_GEMM_CACHE=str(tmp_path / "cache"))
    env.pop("PTXAS", None)
    runs = []
    for i in range(2):
        out = tmp_path / f"r{i}.json"
        done = subprocess.run([sys.executable, "-W", "ignore", "eval.py", "compile", "--shape", GOOD,
                               "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        runs.append((done.stdout, json.loads(out.read_text())))
    (first, report), (second, again) = runs
    assert "from nvidia-cuda-nvcc" in first and "1 kernels, 1 shape sets, 0 failures" in first
    assert "[1/1] " in first and "(0 of 1 kernels from the cache;" in first
    assert "ok (cached)" in second and "(1 of 1 kernels from the cache;" in second
    assert str(tmp_path / "cache") in second
    volatile = {"cached", "compile_s", "process_s"}
    assert [{k: v for k, v in row.items() if k not in volatile} for row in report["kernels"]] == \
           [{k: v for k, v in row.items() if k not in volatile} for row in again["kernels"]]
    assert report["kernels"][0]["ptxas"] == toolchain.wheel_ptxas()


def test_the_checked_dsl_releases_span_what_pyproject_accepts():
    """Every check runs under toolchain.CHECKED_DSL_RELEASES (CI's compile tests: the installed release and
    NVFP4_EXTRA_CUTLASS_DSL; scripts/gpu-check.sh: each in turn): the lowest is pyproject.toml's lower bound,
    each is accepted, and CI installs the lowest beside the installed one."""
    import re
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
    text = (ROOT / "pyproject.toml").read_text()
    (spec,) = re.findall(r'"nvidia-cutlass-dsl([^"]+)"', text)
    accepted = SpecifierSet(spec)
    releases = toolchain.CHECKED_DSL_RELEASES
    assert list(releases) == sorted(releases, key=Version) and len(releases) >= 2
    assert all(release in accepted for release in releases), (spec, releases)
    (lowest,) = [s.version for s in accepted if s.operator == ">="]
    assert releases[0] == lowest
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"nvidia-cutlass-dsl=={releases[0]} nvidia-cutlass-dsl-libs-base=={releases[0]}" in ci
