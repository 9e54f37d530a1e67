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


def column_major(c):
    return c[:, :, 0].t().contiguous().t().unsqueeze(-1)  # column-major C, same shape


def misaligned(c):
    m, n, _ = c.shape
    return torch.zeros(m * n + 1, dtype=torch.float16)[1:].view(m, n, 1)  # 2 bytes past an aligned address


# (what is wrong, how to make it from a valid input (abc, sf, sf_r, sizes: lists to edit), what the error names)
MALFORMED = [
    ("wrong dtype", lambda abc, sf, sf_r, sizes: abc[1].__setitem__(2, abc[1][2].float()),
     ("group 1", "c has dtype torch.float32", "float16")),
    ("tensors made for another K", lambda abc, sf, sf_r, sizes: sizes.__setitem__(2, (129, 384, 512, 1)),
     ("group 2", "a has shape", "(129, 256, 1)")),
    ("wrong scale factor shape", lambda abc, sf, sf_r, sizes: sf_r[1].__setitem__(1, sf_r[0][1]),
     ("group 1", "sfb_reordered has shape")),
    ("L not 1", lambda abc, sf, sf_r, sizes: sizes.__setitem__(0, (64, 128, 256, 2)), ("group 0", "L=2")),
    ("K not a multiple of 256", lambda abc, sf, sf_r, sizes: sizes.__setitem__(1, (40, 256, 384, 1)),
     ("group 1", "K=384", "256")),
    ("N not a multiple of 128", lambda abc, sf, sf_r, sizes: sizes.__setitem__(1, (40, 200, 512, 1)),
     ("group 1", "N=200")),
    ("M zero", lambda abc, sf, sf_r, sizes: sizes.__setitem__(0, (0, 128, 256, 1)), ("group 0", "M=0")),
    ("sizes not ints", lambda abc, sf, sf_r, sizes: sizes.__setitem__(2, (129.0, 384, 256, 1)),
     ("group 2", "four ints")),
    ("C not in the expected layout", lambda abc, sf, sf_r, sizes: abc[1].__setitem__(2, column_major(abc[1][2])),
     ("group 1", "c has strides")),
    ("scale factors not in the blocked layout",
     lambda abc, sf, sf_r, sizes: sf_r[0].__setitem__(0, sf_r[0][0].contiguous()),  # right shape, row-major
     ("group 0", "sfa_reordered has strides")),
    ("misaligned pointer", lambda abc, sf, sf_r, sizes: abc[0].__setitem__(2, misaligned(abc[0][2])),
     ("group 0", "c is not 16-byte aligned")),
    ("not a tensor", lambda abc, sf, sf_r, sizes: abc[2].__setitem__(0, [[0]]), ("group 2", "a is list")),
]


@pytest.mark.parametrize("what,spoil,fragments", MALFORMED, ids=[case[0] for case in MALFORMED])
def test_malformed_input_is_refused_naming_group_and_problem(what, spoil, fragments):
    abc, sf, sf_r, sizes = mutable(fresh())
    spoil(abc, sf, sf_r, sizes)
    rejects((abc, sf, sf_r, sizes), *fragments)
