"""Shared fixtures. Tests run from the repository root (`python -m pytest`)."""
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# The compile gate's tests compile for real, and write nothing into the user's cache; the cache's own tests
# name a folder of their own.
os.environ["NVFP4_GROUP_GEMM_CACHE"] = "off"

HAS_CUDA = torch.cuda.is_available()
IS_B200 = HAS_CUDA and torch.cuda.get_device_capability() == (10, 0)

IS_HOPPER = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)


class Requirement:
    """Hardware a test needs: its markers (registered in pyproject.toml, to select with -m) and a skip, with the
    reason shown, where the hardware is absent. Decorates a test; `marks` serves as a module's pytestmark."""

    def __init__(self, markers, present: bool, reason: str):
        self.marks = [getattr(pytest.mark, m) for m in markers] + [pytest.mark.skipif(not present, reason=reason)]

    def __call__(self, test):
        for mark in self.marks:
            test = mark(test)
        return test


needs_cuda = Requirement(["gpu"], HAS_CUDA, "needs a CUDA GPU")
needs_b200 = Requirement(["gpu", "b200"], IS_B200, "needs a B200 (sm_100) to run tcgen05")
needs_hopper = Requirement(["gpu", "hopper"], IS_HOPPER, "needs a Hopper GPU (sm_90) for hopper.py's kernel")
needs_hopper_or_b200 = Requirement(["gpu"], IS_HOPPER or IS_B200,
                                   "needs a GPU one of the kernels runs on (sm_90, sm_100)")


from nvfp4_group_gemm.harness import load_submission  # noqa: E402

load_submission()  # the sm_90 and portable paths registered, as eval.py has them


def read_cases(name: str):
    from nvfp4_group_gemm import eval as evaluation
    return evaluation.read_test_file(ROOT / "cases" / name)


TEST_CASES = read_cases("tests.txt")
BENCHMARK_CASES = read_cases("benchmarks.txt")


@pytest.fixture
def cpu_data():
    """A small two-group input on the CPU with M not a multiple of 128."""
    from nvfp4_group_gemm.reference import generate_input
    return generate_input((40, 129), (256, 128), (512, 256), 2, seed=5, device="cpu")


def pytest_collection_modifyitems(items):
    """A test that reads a compile report (the `report` fixtures of test_compile.py and test_hopper.py) waits
    for every kernel to compile: slow."""
    for item in items:
        if "report" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
