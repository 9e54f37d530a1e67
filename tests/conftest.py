"""Shared fixtures. Tests run from the repository root (`python -m pytest`)."""
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HAS_CUDA = torch.cuda.is_available()
IS_B200 = HAS_CUDA and torch.cuda.get_device_capability() == (10, 0)

needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
needs_b200 = pytest.mark.skipif(not IS_B200, reason="needs a B200 (sm_100) to run tcgen05")


from harness import load_submission  # noqa: E402

load_submission()  # the sm_90 and portable paths registered, as eval.py has them


def read_cases(name: str):
    import eval as evaluation
    return evaluation.read_test_file(ROOT / "cases" / name)


TEST_CASES = read_cases("tests.txt")
BENCHMARK_CASES = read_cases("benchmarks.txt")


@pytest.fixture
def cpu_data():
    """A small two-group input on the CPU with M not a multiple of 128."""
    from reference import generate_input
    return generate_input((40, 129), (256, 128), (512, 256), 2, seed=5, device="cpu")
