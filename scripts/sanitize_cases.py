"""custom_kernel on one test shape and one benchmark shape, checked against the
reference: run under `compute-sanitizer --tool memcheck` by scripts/gpu-check.sh.
Arguments: the test and benchmark indices (default 3 3; gpu-check.sh passes
$SANITIZE_CASES)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nvfp4_group_gemm.casefile import BENCHMARKS_FILE, TESTS_FILE, read_test_file  # noqa: E402
from nvfp4_group_gemm.harness import load_submission  # noqa: E402
from nvfp4_group_gemm.reference import check_implementation, generate_input  # noqa: E402

submission = load_submission()  # with hopper.py's sm_90 path

failed = False
test_index, benchmark_index = (int(a) for a in (sys.argv[1:3] if len(sys.argv) >= 3 else (3, 3)))
for path, index in ((TESTS_FILE, test_index), (BENCHMARKS_FILE, benchmark_index)):
    case = read_test_file(path)[index]
    data = generate_input(**case.args)
    output = submission.custom_kernel(data)
    torch.cuda.synchronize()
    good, message = check_implementation(data, output)
    print(f"{path.name}[{index}] {case.spec}: {'pass' if good else 'FAIL ' + message[:300]} "
          f"[{submission.code_path(torch.device('cuda'))}]")
    failed |= not good
sys.exit(1 if failed else 0)
