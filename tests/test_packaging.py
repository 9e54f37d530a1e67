"""pyproject.toml: a non-editable install ships every module the product imports.

py-modules is a hand-written list; a module missing from it goes unnoticed in
the checkout (and in editable installs) and breaks, or silently slows, an
installed copy: without hopper.py an H100/H200 runs the slow portable path."""
import ast
import shutil
import subprocess
import sys
import zipfile

from conftest import ROOT

ENTRY_POINTS = ("submission", "hopper", "eval")  # what people and the leaderboard run


def imported_names(path) -> set:
    """Top-level names of every import in the file, those inside functions included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def product_modules() -> set:
    """The entry points and the repository-root modules they import, transitively."""
    root_modules = {path.stem for path in ROOT.glob("*.py")}
    found, todo = set(), list(ENTRY_POINTS)
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += imported_names(ROOT / f"{name}.py") & root_modules
    return found


def build_wheel(tmp_path) -> list:
    """Names in a wheel built from a copy of the checkout without what git ignores.

    Not built in place: setuptools writes build/ and *.egg-info into the source
    tree, and a module left in build/lib by an earlier build lands in the wheel
    even after py-modules drops it."""
    ignored = [line.strip().strip("/") for line in (ROOT / ".gitignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", *ignored))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(tmp_path / "wheel"), str(source)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, ("pip wheel failed (needs setuptools>=70.1, the dev extra's):\n"
                                  + done.stdout[-3000:] + done.stderr[-3000:])
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_imports_inside_functions_count():
    # eval.py imports hostbench and reference only inside functions.
    assert {"harness", "hostbench", "reference", "task"} <= product_modules()


def test_wheel_ships_every_imported_module_and_no_tests(tmp_path):
    names = build_wheel(tmp_path)
    missing = sorted(f"{name}.py" for name in product_modules() if f"{name}.py" not in names)
    assert not missing, f"not in the wheel (add to [tool.setuptools] py-modules): {missing}"
    assert not [name for name in names if name.startswith("tests/")]


def test_no_import_cycles_and_the_artifact_imports_only_task():
    """The repository's modules import each other without a cycle (imports inside
    functions count too), and submission.py, which the leaderboard copies alone,
    imports no module of ours but task."""
    root_modules = {path.stem for path in ROOT.glob("*.py")}
    graph = {name: imported_names(ROOT / f"{name}.py") & root_modules - {name} for name in root_modules}
    assert graph["submission"] == {"task"}
    assert "submission" in graph["hopper"] and "submission" in graph["portable"]  # they register with it
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
