"""Max |custom_kernel - reference| on the 10 test shapes and on every benchmark's
first input, per case, and whether the two are bit-identical. Run from the root
of a tree (this one or an older one: that tree's submission, hopper.py and
reference are imported from the working directory):
    python3 path/to/max_error.py CASES_FILE [CASES_FILE ...]
Exit 1 when any case differs from the reference by more than 0."""
import os
import sys

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402

from nvfp4_group_gemm.casefile import read_test_file  # noqa: E402
from nvfp4_group_gemm.harness import load_submission  # noqa: E402
from nvfp4_group_gemm.reference import generate_input, ref_kernel  # noqa: E402

submission = load_submission()
worst = 0.0
for path in sys.argv[1:]:
    for index, case in enumerate(read_test_file(path)):
        data = generate_input(**case.args)
        for _, _, c in data[0]:
            c.fill_(float("nan"))  # every element must be written
        output = submission.custom_kernel(data)
        torch.cuda.synchronize()
        expected = ref_kernel(data)
        errors = [(o.float() - e.float()).abs().max().item() for o, e in zip(output, expected)]
        error = max(errors) if len(output) == len(expected) else float("inf")
        identical = len(output) == len(expected) and all(torch.equal(o, e) for o, e in zip(output, expected))
        worst = max(worst, error) if error == error else float("nan")
        print(f"{os.path.basename(path)}[{index}] max error {error:g} bit-identical {identical}")
print(f"max error over all cases: {worst:g}")
sys.exit(0 if worst == 0 else 1)
