"""custom_kernel rejects malformed input before any launch, naming group and problem."""
import pytest
import torch

from nvfp4_group_gemm import submission
from nvfp4_group_gemm.reference import generate_input


def fresh():
    """Three valid groups on the CPU; only the device check would fail."""
    return generate_input((64, 40, 129), (128, 256, 384), (256, 512, 256), 3, seed=2, device="cpu")


def mutable(data):
    abc, sf, sf_r, sizes = data
    return [list(g) for g in abc], list(sf), [list(g) for g in sf_r], list(sizes)


def rejects(data, *fragments):
    before = [c.clone() for _, _, c in data[0]] if isinstance(data, tuple) and data[0] else []
    with pytest.raises(ValueError) as info:
        submission.custom_kernel(data)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    # nothing was written
    assert all(torch.equal(x, c) for x, (_, _, c) in zip(before, data[0]))
    return message


def test_valid_cpu_input_fails_only_for_the_device():
    rejects(fresh(), "group 0", "a is on cpu", "CUDA")


def test_empty_group_list():
    rejects(([], [], [], []), "no groups")


def test_list_lengths_disagree():
    abc, sf, sf_r, sizes = fresh()
    rejects((abc, sf, sf_r[:2], sizes), "disagree", "sfasfb_reordered_tensors")


def test_not_a_four_tuple():
    rejects(fresh()[:3], "abc_tensors, sfasfb_tensors")


def test_wrong_dtype():
    abc, sf, sf_r, sizes = mutable(fresh())
    abc[1][2] = abc[1][2].float()
    rejects((abc, sf, sf_r, sizes), "group 1", "c has dtype torch.float32", "float16")


def test_wrong_shape_for_the_stated_sizes():
    abc, sf, sf_r, sizes = mutable(fresh())
    sizes[2] = (129, 384, 512, 1)  # K stated 512, tensors made for 256
    rejects((abc, sf, sf_r, sizes), "group 2", "a has shape", "(129, 256, 1)")


def test_wrong_scale_factor_shape():
    abc, sf, sf_r, sizes = mutable(fresh())
    sf_r[1][1] = sf_r[0][1]
    rejects((abc, sf, sf_r, sizes), "group 1", "sfb_reordered has shape")


def test_l_not_one():
    abc, sf, sf_r, sizes = mutable(fresh())
    sizes[0] = (64, 128, 256, 2)
    rejects((abc, sf, sf_r, sizes), "group 0", "L=2")


def test_k_not_a_multiple_of_256():
    abc, sf, sf_r, sizes = mutable(fresh())
    sizes[1] = (40, 256, 384, 1)
    rejects((abc, sf, sf_r, sizes), "group 1", "K=384", "256")


def test_n_not_a_multiple_of_128():
    abc, sf, sf_r, sizes = mutable(fresh())
    sizes[1] = (40, 200, 512, 1)
    rejects((abc, sf, sf_r, sizes), "group 1", "N=200")


def test_m_zero():
    abc, sf, sf_r, sizes = mutable(fresh())
    sizes[0] = (0, 128, 256, 1)
    rejects((abc, sf, sf_r, sizes), "group 0", "M=0")


def test_sizes_not_ints():
    abc, sf, sf_r, sizes = mutable(fresh())
    sizes[2] = (129.0, 384, 256, 1)
    rejects((abc, sf, sf_r, sizes), "group 2", "four ints")


def test_not_in_the_expected_layout():
    abc, sf, sf_r, sizes = mutable(fresh())
    c = abc[1][2]
    abc[1][2] = c[:, :, 0].t().contiguous().t().unsqueeze(-1)  # column-major C, same shape
    rejects((abc, sf, sf_r, sizes), "group 1", "c has strides")


def test_scale_factors_not_in_the_blocked_layout():
    abc, sf, sf_r, sizes = mutable(fresh())
    sf_r[0][0] = sf_r[0][0].contiguous()  # right shape, plain row-major storage
    rejects((abc, sf, sf_r, sizes), "group 0", "sfa_reordered has strides")


def test_misaligned_pointer():
    abc, sf, sf_r, sizes = mutable(fresh())
    m, n, k, _ = sizes[0]
    storage = torch.zeros(m * n + 1, dtype=torch.float16)
    abc[0][2] = storage[1:].view(m, n, 1)  # 2 bytes past an aligned address
    rejects((abc, sf, sf_r, sizes), "group 0", "c is not 16-byte aligned")


def test_not_a_tensor():
    abc, sf, sf_r, sizes = mutable(fresh())
    abc[2][0] = [[0]]
    rejects((abc, sf, sf_r, sizes), "group 2", "a is list")
