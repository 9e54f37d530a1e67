"""generate_input: shapes, dtypes, strides, the reordered scale factors, determinism."""
import pytest
import torch

from conftest import TEST_CASES
from nvfp4_group_gemm.reference import ceil_div, generate_input


def _check_group(a, b, c, sfa, sfb, sfa_r, sfb_r, m, n, k):
    assert a.dtype == b.dtype == torch.float4_e2m1fn_x2
    assert c.dtype == torch.float16
    assert sfa.dtype == sfb.dtype == sfa_r.dtype == sfb_r.dtype == torch.float8_e4m3fn
    assert a.shape == (m, k // 2, 1) and a.stride() == (k // 2, 1, m * k // 2)
    assert b.shape == (n, k // 2, 1) and b.stride() == (k // 2, 1, n * k // 2)
    assert c.shape == (m, n, 1) and c.stride() == (n, 1, m * n)
    assert sfa.shape == (m, k // 16, 1) and sfa.device.type == "cpu"
    assert sfb.shape == (n, k // 16, 1) and sfb.device.type == "cpu"
    for sf_r, rows in ((sfa_r, m), (sfb_r, n)):
        rb, kb = ceil_div(rows, 128), ceil_div(k // 16, 4)
        assert sf_r.shape == (32, 4, rb, 4, kb, 1)
        # a permuted view of contiguous storage [1, rb, kb, 32, 4, 4]
        assert sf_r.permute(5, 2, 4, 0, 1, 3).is_contiguous()


@pytest.mark.parametrize("case", TEST_CASES, ids=lambda c: c.spec)
def test_layouts_of_every_test_shape(case):
    args = case.args
    data = generate_input(**args, device="cpu")
    abc, sf, sf_r, sizes = data
    assert sizes == [(m, n, k, 1) for m, n, k in zip(args["m"], args["n"], args["k"])]
    for (a, b, c), (sfa, sfb), (sfa_r, sfb_r), (m, n, k, _) in zip(abc, sf, sf_r, sizes):
        _check_group(a, b, c, sfa, sfb, sfa_r, sfb_r, m, n, k)


@pytest.mark.parametrize("rows,k", [(1, 256), (40, 512), (129, 768), (300, 1024)])
def test_every_real_reordered_entry_equals_the_plain_one(rows, k):
    data = generate_input((rows,), (rows + 128 - rows % 128,), (k,), 1, seed=3, device="cpu")
    sfa, sfb = data[1][0]
    sfa_r, sfb_r = data[2][0]
    for plain, blocked in ((sfa, sfa_r), (sfb, sfb_r)):
        plain_u8 = plain.view(torch.uint8)
        blocked_u8 = blocked.view(torch.uint8)
        for r in range(plain.shape[0]):
            for j in range(plain.shape[1]):
                assert blocked_u8[r % 32, (r % 128) // 32, r // 128, j % 4, j // 4, 0] == plain_u8[r, j, 0]


def test_fp4_values_are_the_masked_set():
    data = generate_input((64,), (128,), (512,), 1, seed=9, device="cpu")
    codes = data[0][0][0].view(torch.uint8)
    assert int((codes & 0b0100_0100).count_nonzero()) == 0  # top exponent bit cleared
    scales = data[1][0][0].float()
    assert set(scales.unique().tolist()) <= {1.0, 2.0}


def _tensors(data):
    abc, sf, sf_r, _ = data
    return [t for group in abc + sf + sf_r for t in group]


def test_same_seed_same_tensors_other_seed_other_tensors():
    first = generate_input((72, 40), (256, 128), (256, 512), 2, seed=11, device="cpu")
    again = generate_input((72, 40), (256, 128), (256, 512), 2, seed=11, device="cpu")
    other = generate_input((72, 40), (256, 128), (256, 512), 2, seed=12, device="cpu")
    assert all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) if x.element_size() == 1
               else torch.equal(x, y) for x, y in zip(_tensors(first), _tensors(again)))
    a_first, a_other = first[0][0][0].view(torch.uint8), other[0][0][0].view(torch.uint8)
    assert not torch.equal(a_first, a_other)


def test_mismatched_lists_are_rejected():
    with pytest.raises(ValueError):
        generate_input((64, 64), (128,), (256, 256), 2, seed=1, device="cpu")


@pytest.mark.parametrize("args,says", [
    (dict(m=64, n=(256,), k=(512,), g=1), "m: 64: expected a sequence of 1 integers, one per group (for one group: "
                                          "m=(64,))"),
    (dict(m=(64,), n=(200,), k=(512,), g=1), "n: group 0: 200, expected a positive multiple of 128"),
    (dict(m=(64, 0), n=(256, 256), k=(512, 512), g=2), "m: group 1: 0, expected at least 1"),
    (dict(m=(64,), n=(256,), k=(100,), g=1), "k: group 0: 100, expected a positive multiple of 256"),
    (dict(m=(64, 1), n=(256,), k=(512,), g=2), "n: 1 values, g is 2"),
    (dict(m=(64,), n=(256,), k=(512,), g=0), "g: 0: expected the number of groups"),
])
def test_shapes_outside_the_task_are_refused_naming_the_argument(args, says):
    with pytest.raises(ValueError) as error:
        generate_input(**args, seed=1, device="cpu")
    assert str(error.value).startswith("generate_input: " + says), str(error.value)
