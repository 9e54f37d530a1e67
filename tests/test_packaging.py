"""The installed package: one import name, nvfp4_group_gemm, and nothing else at the top level.

The leaderboard's files (submission.py, task.py, reference.py, eval.py) stay at
the repository root, where the leaderboard and people expect them; the package
holds links to them, which a wheel stores as the files themselves. A link that
breaks, or a module the product imports that the wheel lacks, goes unnoticed in
the checkout and breaks an installed copy: these tests build the wheel."""
import ast
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT

PACKAGE = "nvfp4_group_gemm"
LEADERBOARD_FILES = ("submission", "task", "reference", "eval")


def package_modules() -> set:
    return {path.stem for path in (ROOT / PACKAGE).glob("*.py")} - {"__init__"}


def imported_modules(name: str) -> set:
    """The package's modules that module `name` imports (inside functions too), in any of the spellings
    `from . import x`, `from .x import y`, `from nvfp4_group_gemm import x`, `import nvfp4_group_gemm.x`, and
    the plain `import x` / `from x import y` of the leaderboard's files."""
    ours, found = package_modules(), set()
    for node in ast.walk(ast.parse((ROOT / PACKAGE / f"{name}.py").read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1 or module == PACKAGE:
                found |= {module} if module and node.level else {alias.name for alias in node.names}
            elif module.startswith(PACKAGE + "."):
                found.add(module.split(".")[1])
            elif node.level == 0 and module in ours:
                found.add(module)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == PACKAGE and len(parts) > 1:
                    found.add(parts[1])
                elif parts[0] in ours:
                    found.add(parts[0])
    return found & ours - {name}


def test_the_links_to_the_leaderboard_files_resolve():
    for name in LEADERBOARD_FILES:
        link = ROOT / PACKAGE / f"{name}.py"
        assert link.is_symlink() and link.resolve() == (ROOT / f"{name}.py").resolve(), name
    assert (ROOT / PACKAGE / "cases").resolve() == (ROOT / "cases").resolve()


def build_wheel(tmp_path) -> zipfile.ZipFile:
    """A wheel built from a copy of the checkout without what git ignores.

    Not built in place: setuptools writes build/ and *.egg-info into the source
    tree, and a module left in build/lib by an earlier build lands in the wheel."""
    ignored = [line.strip().strip("/") for line in (ROOT / ".gitignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(".git", *ignored))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(tmp_path / "wheel"), str(source)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, ("pip wheel failed (needs setuptools>=70.1, the dev extra's):\n"
                                  + done.stdout[-3000:] + done.stderr[-3000:])
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    return zipfile.ZipFile(wheel)


@pytest.mark.slow
def test_the_wheel_has_one_top_level_name_and_everything_it_imports(tmp_path):
    wheel = build_wheel(tmp_path)
    names = wheel.namelist()
    top = {name.split("/")[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {PACKAGE}, sorted(top)
    shipped = {name.split("/")[1][:-3] for name in names if name.startswith(PACKAGE + "/") and name.endswith(".py")
               and name.count("/") == 1}
    assert package_modules() | {"__init__"} <= shipped
    assert {f"{PACKAGE}/cases/tests.txt", f"{PACKAGE}/cases/benchmarks.txt"} <= set(names)
    assert any(name.endswith(".dist-info/licenses/LICENSE") or name.endswith(".dist-info/LICENSE")
               for name in names)
    assert not [name for name in names if "tests/" in name or name.endswith(".sh")]
    (entry_points,) = [name for name in names if name.endswith("entry_points.txt")]
    assert f"nvfp4-group-gemm = {PACKAGE}.eval:run" in wheel.read(entry_points).decode()
    # the links were followed: the files themselves, not link text
    for name in LEADERBOARD_FILES:
        assert wheel.read(f"{PACKAGE}/{name}.py") == (ROOT / f"{name}.py").read_bytes()


def test_no_import_cycles_and_the_artifact_imports_only_task():
    """The package's modules import each other without a cycle (imports inside functions count too), and
    submission.py, which the leaderboard copies alone, imports no module of ours but task."""
    graph = {name: imported_modules(name) for name in package_modules()}
    assert graph["submission"] == {"task"}
    assert graph["reference"] <= {"task"}
    assert "submission" in graph["hopper"] and "submission" in graph["portable"]  # they register with it
    reached, todo = set(), ["eval"]  # eval.py's commands reach every module of the package
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += sorted(graph[name])
    assert reached == set(graph), set(graph) - reached
    done, active = set(), []

    def visit(name):
        assert name not in active, "import cycle: " + " -> ".join(active[active.index(name):] + [name])
        if name in done:
            return
        active.append(name)
        for target in sorted(graph[name]):
            visit(target)
        active.pop()
        done.add(name)
    for name in sorted(graph):
        visit(name)


def test_the_artifact_imports_task_as_the_leaderboard_has_it(tmp_path):
    """submission.py copied alone beside a task.py (as the leaderboard runs it) finds task without a package."""
    for name in ("submission", "task"):
        shutil.copy(ROOT / f"{name}.py", tmp_path / f"{name}.py")
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", "import submission; print(submission.input_t)"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "input_t" in done.stdout, done.stderr[-3000:]


def package_names_in(path) -> set:
    """(module, attribute) for every `m.attr` in a test file where m is a package module it imports (`from
    nvfp4_group_gemm import m`, `m = importlib.import_module("nvfp4_group_gemm.m")`, or that call itself)."""
    tree, bound = ast.parse(path.read_text()), {}

    def imported(node):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args
                and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith(PACKAGE + ".")):
            return node.args[0].value.split(".", 1)[1]
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
            bound.update((alias.asname or alias.name, alias.name) for alias in node.names)
        elif isinstance(node, ast.Assign) and imported(node.value) and isinstance(node.targets[0], ast.Name):
            bound[node.targets[0].id] = imported(node.value)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            module = bound.get(node.value.id) if isinstance(node.value, ast.Name) else imported(node.value)
            if module is not None:
                names.add((module, node.attr))
    return names


def test_every_package_name_the_gpu_tests_use_exists():
    """The GPU tests run only where a GPU is; a name they read that a refactoring moved fails them there and
    nowhere else. Every package attribute they name must exist (imported here, on the CPU)."""
    import importlib
    names = package_names_in(ROOT / "tests" / "test_gpu.py")
    assert ("submission", "custom_kernel") in names and ("hopper_policy", "PATH_HOPPER") in names
    modules = {}
    for module in {m for m, _ in names}:
        try:
            modules[module] = importlib.import_module(f"{PACKAGE}.{module}")
        except ImportError as error:  # a module that needs the DSL, where it is not installed
            pytest.importorskip("cutlass", reason=str(error))
            raise
    missing = sorted(f"{m}.{a}" for m, a in names if not hasattr(modules[m], a))
    assert not missing, f"tests/test_gpu.py names what the package lacks: {missing}"
