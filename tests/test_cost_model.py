"""The B200 cost model (host only): it picks the configuration it models fastest, is bounded by DRAM time, sees
the swapped configurations' transposed problems, and its constants are the fit to the public B200 results
(`eval.py model --fit`); `eval.py model` prints its figures. Model figures, never measurements."""
import math
import re
import subprocess
import sys

import pytest

from conftest import BENCHMARK_CASES, ROOT, TEST_CASES
from nvfp4_group_gemm import model_report
from nvfp4_group_gemm import submission


def test_model_picks_the_fastest_modeled_configuration():
    for case in TEST_CASES + BENCHMARK_CASES:
        sizes = [(m, n, k, 1) for m, n, k in zip(case.args["m"], case.args["n"], case.args["k"])]
        times = {c.name: submission.model_time_us(sizes, c).time_us for c in submission.model_candidates()}
        assert submission.choose_config(sizes).name == min(times, key=times.get)
    # every compiled configuration under every schedule
    assert len(submission.model_candidates()) == len(submission.TILE_CONFIGS) * len(submission.SCHEDULES)


def test_model_is_bounded_by_dram_and_grows_with_work():
    config = submission.TILE_CONFIGS["128x128"]
    small = submission.model_time_us([(128, 4096, 1536, 1)], config)
    large = submission.model_time_us([(128, 4096, 1536 * 4, 1)], config)
    assert large.time_us > small.time_us
    for est in (small, large):
        assert est.time_us >= est.dram_us and est.time_us >= est.busiest_cta_us
    many = submission.model_time_us([(128, 8192, 8192, 1)] * 64, config)
    assert many.ctas == submission.SM100_SM_COUNT and many.tiles == 64 * 64


def test_swapped_configuration_sees_transposed_problems():
    swap = submission.TILE_CONFIGS["swap-128x256"]
    assert submission.kernel_problem((40, 7168, 2048, 1), swap) == (7168, 40, 2048, 1)
    assert submission.tile_count([(40, 7168, 2048, 1)], swap) == 56  # one token tile
    assert submission.tile_count([(40, 7168, 2048, 1)], submission.TILE_CONFIGS["128x128"]) == 56


def test_eval_model_prints_a_modeled_geometric_mean():
    done = subprocess.run([sys.executable, "eval.py", "model"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("MODEL FIGURES for a B200, not measurements")
    geomean = re.search(r"modeled geometric mean: ([\d.]+) us \(speed of light 5\.21 us", done.stdout)
    floor = re.search(r"the model's floor for any design: ([\d.]+) us", done.stdout)
    assert geomean and floor and float(geomean[1]) >= float(floor[1]) > 5.21
    # the residual table: every public point, published beside modeled
    rows = re.findall(r"^  (CuTe DSL kernel|gau-nernst|log: .+?)\s+([0-3-])\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$",
                      done.stdout, re.M)
    assert len(rows) == len(model_report.public_points())
    assert all(abs(float(modeled) / float(published) - float(ratio)) < 0.01 for *_, published, modeled, ratio in rows)


def test_the_model_constants_are_the_fit_to_the_public_results():
    """MODEL_CONSTANTS are what `eval.py model --fit` finds (to the 3 digits written), and the fit leaves no
    public point off by more than 10 %."""
    fitted, loss = model_report.fit_model_constants()
    for name, value in fitted._asdict().items():
        assert float(f"{value:.3g}") == pytest.approx(getattr(submission.MODEL_CONSTANTS, name), rel=1e-9), name
    assert all(0.9 < modeled / published < 1.1 for *_, published, modeled in model_report.modeled_public_points())
    assert loss == pytest.approx(sum(math.log(m / p) ** 2 for *_, p, m in model_report.modeled_public_points(fitted)))
