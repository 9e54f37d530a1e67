"""What the compile gate compiles with, and its cache of results.

`find_ptxas`: the ptxas that reads the DSL's PTX. PTXAS names one, else the
one the nvidia-cuda-nvcc wheel installs beside this package (a dependency of
it, pinned, so no CUDA toolkit is needed), else the first on PATH. The wheel
comes before PATH because a machine's toolkit is often older than the DSL's
PTX (CUDA 12.x's ptxas stops at PTX 9.0 where DSL 4.8 writes 9.4).

`ResultCache`: one JSON file per compiled kernel, keyed on everything that
changes the binary or its report: the kernel sources (submission.py,
hopper.py) and the gate's own (compile_gate.py), the configuration, the architecture,
the DSL's release and location, ptxas's version and Python's. CuTe DSL's own
file cache keeps compiled functions but not the PTX or ptxas's report, and a
hit would still start a process that imports torch and the DSL; this cache
answers before any process starts. NVFP4_GROUP_GEMM_CACHE names its folder
(default ~/.cache/nvfp4-group-gemm, or under XDG_CACHE_HOME), or turns it off
with "off".
"""
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterable, NamedTuple, Optional

# The nvidia-cutlass-dsl releases every check runs under (the compile tests in CI, scripts/gpu-check.sh on a GPU):
# the lowest pyproject.toml accepts (the leaderboard runner's) and the newest below its upper bound.
CHECKED_DSL_RELEASES = ("4.5.2", "4.8.1")

CACHE_ENV = "NVFP4_GROUP_GEMM_CACHE"
CACHE_OFF = ("off", "0", "no", "false")
WHEEL_PTXAS = Path("cu13") / "bin" / "ptxas"  # inside the nvidia namespace package (nvidia-cuda-nvcc)


class Ptxas(NamedTuple):
    path: str
    source: str  # "PTXAS", "PATH" or "nvidia-cuda-nvcc"


def wheel_ptxas() -> Optional[str]:
    """The ptxas of the nvidia-cuda-nvcc wheel in this environment, if installed."""
    spec = importlib.util.find_spec("nvidia")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / WHEEL_PTXAS
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def find_ptxas() -> Optional[Ptxas]:
    """PTXAS if set (it must name an executable), else the wheel's, else ptxas on PATH; None if none."""
    named = os.environ.get("PTXAS")
    if named:
        return Ptxas(named, "PTXAS") if os.access(named, os.X_OK) else None
    wheel = wheel_ptxas()
    if wheel:
        return Ptxas(wheel, "nvidia-cuda-nvcc")
    on_path = shutil.which("ptxas")
    return Ptxas(on_path, "PATH") if on_path else None


def ptxas_version(path: str) -> str:
    """ptxas's last --version line ("Build cuda_13.0.r13.0/compiler.36424714_0"), or "?"."""
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except OSError:
        return "?"
    lines = done.stdout.strip().splitlines()
    return lines[-1] if done.returncode == 0 and lines else "?"


def dsl_identity() -> str:
    """The DSL the compiling processes import (found, not imported): its release and where it is."""
    spec = importlib.util.find_spec("cutlass")
    try:
        version = importlib.metadata.version("nvidia-cutlass-dsl")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return f"nvidia-cutlass-dsl {version} at {spec.origin if spec else '?'}"


def default_cache_folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nvfp4-group-gemm"


class ResultCache:
    """Compile results (JSON rows) by key, in `folder`/compile; `folder` None: off (nothing read or written)."""

    def __init__(self, folder: Optional[Path]):
        self.folder = folder / "compile" if folder is not None else None

    @classmethod
    def from_environment(cls) -> "ResultCache":
        setting = os.environ.get(CACHE_ENV, "")
        if setting.lower() in CACHE_OFF:
            return cls(None)
        return cls(Path(setting).expanduser() if setting else default_cache_folder())

    @staticmethod
    def key(config: str, arch: str, sources: Iterable[Path], *facts: str) -> str:
        digest = hashlib.sha256()
        for part in (config, arch, f"python {sys.version_info[0]}.{sys.version_info[1]}", *facts):
            digest.update(part.encode() + b"\0")
        for source in sources:
            digest.update(Path(source).read_bytes() + b"\0")
        return digest.hexdigest()[:32]

    def load(self, key: str) -> Optional[dict]:
        if self.folder is None:
            return None
        try:
            return json.loads((self.folder / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None

    def store(self, key: str, row: dict) -> None:
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{key}.json"
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(row))
        partial.replace(path)  # whole or absent, also with two gates at once

    def describe(self) -> str:
        if self.folder is None:
            return f"the compile cache is off ({CACHE_ENV}=off)"
        return (f"compile results are cached in {self.folder}: delete that folder, or set {CACHE_ENV}=off, "
                "to compile everything afresh")
