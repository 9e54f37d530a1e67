"""ref_kernel against an independent float64 computation, and the check itself."""
import numpy as np
import pytest
import torch

from conftest import TEST_CASES
from nvfp4_group_gemm.reference import check_implementation, generate_input, ref_kernel


def independent_result(a, b, sfa, sfb):
    """C for one group by other means than reference.py: E2M1 decoded with numpy
    arithmetic on the bit fields, E4M3 through torch's own conversion, float64
    matrix product, one rounding to fp16."""
    def fp4(packed):
        codes = packed[:, :, 0].view(torch.uint8).numpy()
        nib = np.stack((codes & 0xF, codes >> 4), axis=-1).reshape(codes.shape[0], -1)
        sign = np.where(nib & 8, -1.0, 1.0)
        exponent = (nib >> 1) & 3
        mantissa = nib & 1
        magnitude = np.where(exponent == 0, 0.5 * mantissa, (1 + 0.5 * mantissa) * 2.0 ** (exponent - 1))
        return sign * magnitude

    def scales(sf):
        return np.repeat(sf[:, :, 0].to(torch.float64).numpy(), 16, axis=1)

    full_a = fp4(a) * scales(sfa)
    full_b = fp4(b) * scales(sfb)
    return torch.from_numpy(full_a @ full_b.T).to(torch.float16)


def assert_reference_exact(data):
    got = ref_kernel(data)
    assert len(got) == len(data[3])
    for (a, b, _), (sfa, sfb), out, (m, n, _, _) in zip(data[0], data[1], got, data[3]):
        assert out.shape == (m, n, 1) and out.dtype == torch.float16
        assert torch.equal(out[:, :, 0], independent_result(a, b, sfa, sfb))


@pytest.mark.parametrize("case", TEST_CASES, ids=lambda c: c.spec)
def test_reference_is_exact_on_every_test_shape(case):
    assert_reference_exact(generate_input(**case.args, device="cpu"))


@pytest.mark.parametrize("ms", [(1,), (33,), (129,), (1, 33, 129, 200)])
def test_reference_is_exact_outside_the_task(ms):
    g = len(ms)
    ns = tuple(128 * (i + 1) for i in range(g))
    ks = tuple(256 * (g - i) for i in range(g))
    assert_reference_exact(generate_input(ms, ns, ks, g, seed=21, device="cpu"))


def test_reference_does_not_touch_c(cpu_data):
    before = [c.clone() for _, _, c in cpu_data[0]]
    ref_kernel(cpu_data)
    assert all(torch.equal(x, c) for x, (_, _, c) in zip(before, cpu_data[0]))


# ---- the check ----------------------------------------------------------------
def test_check_passes_the_reference_itself(cpu_data):
    assert check_implementation(cpu_data, ref_kernel(cpu_data)) == (True, "")


def test_check_accepts_within_tolerance(cpu_data):
    out = ref_kernel(cpu_data)
    out[0] = out[0].to(torch.float32)  # fp32, so that the nudge is not rounded away
    out[0][0, 0, 0] += 0.5e-3
    assert check_implementation(cpu_data, out)[0]
    out[0][0, 0, 0] += 2e-3 + 1e-3 * abs(float(out[0][0, 0, 0]))
    assert not check_implementation(cpu_data, out)[0]


def test_check_catches_one_wrong_element(cpu_data):
    out = ref_kernel(cpu_data)
    out[1][17, 3, 0] += 1
    ok, message = check_implementation(cpu_data, out)
    assert not ok
    assert message.startswith("mismatch found! custom implementation doesn't match reference: 1 ")
    assert "Number of mismatched elements: 1" in message and "ERROR AT (17, 3, 0)" in message


def test_check_counts_and_truncates_many_mismatches(cpu_data):
    out = ref_kernel(cpu_data)
    out[0][:2, :4, 0] += 8
    ok, message = check_implementation(cpu_data, out)
    assert not ok and "Number of mismatched elements: 8" in message
    assert message.count("ERROR AT") == 5 and "... and 3 more mismatched elements." in message


def test_check_catches_a_nan(cpu_data):
    out = ref_kernel(cpu_data)
    out[0][5, 5, 0] = float("nan")
    ok, message = check_implementation(cpu_data, out)
    assert not ok and "ERROR AT (5, 5, 0)" in message


def test_check_catches_a_wrong_shape(cpu_data):
    out = ref_kernel(cpu_data)
    out[1] = out[1][:-1]
    ok, message = check_implementation(cpu_data, out)
    assert not ok and "SIZE MISMATCH" in message


def test_check_catches_a_missing_group(cpu_data):
    ok, message = check_implementation(cpu_data, ref_kernel(cpu_data)[:1])
    assert not ok and message == "output length mismatch: got 1, expected 2"


def test_check_catches_an_untouched_output(cpu_data):
    # c as generated holds random values: a kernel that writes nothing must fail
    ok, _ = check_implementation(cpu_data, [c for _, _, c in cpu_data[0]])
    assert not ok
