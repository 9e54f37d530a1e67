"""The portable path's dequantization and GEMM, run on the CPU against the reference."""
import pytest
import torch

from nvfp4_group_gemm import launch, portable, submission
from conftest import TEST_CASES
from nvfp4_group_gemm.reference import generate_input, ref_kernel


def test_plain_scale_factors_undo_the_blocked_layout(cpu_data):
    for (sfa, sfb), (sfa_r, sfb_r), (m, n, k, _) in zip(cpu_data[1], cpu_data[2], cpu_data[3]):
        assert torch.equal(portable.plain_scale_factors(sfa_r, m, k).view(torch.uint8),
                           sfa[:, :, 0].view(torch.uint8))
        assert torch.equal(portable.plain_scale_factors(sfb_r, n, k).view(torch.uint8),
                           sfb[:, :, 0].view(torch.uint8))


def test_e2m1_table_matches_every_code():
    from nvfp4_group_gemm.moe import decoding_tables
    from nvfp4_group_gemm.reference import e2m1_value
    assert decoding_tables(torch.device("cpu"))[0].tolist() == [e2m1_value(i) for i in range(16)]


@pytest.mark.parametrize("case", TEST_CASES, ids=lambda c: c.spec)
def test_portable_path_matches_reference_exactly(case):
    data = generate_input(**case.args, device="cpu")
    expected = ref_kernel(data)
    got = portable.run_portable(data)
    assert [c.data_ptr() for c in got] == [c.data_ptr() for _, _, c in data[0]]  # in place
    assert all(torch.equal(e, g) for e, g in zip(expected, got))


def test_portable_path_with_m_1_33_129():
    data = generate_input((1, 33, 129), (128, 256, 128), (256, 512, 768), 3, seed=4, device="cpu")
    expected = ref_kernel(data)
    assert all(torch.equal(e, g) for e, g in zip(expected, portable.run_portable(data)))


def test_portable_registers_itself_for_gpus_without_a_path():
    assert submission.EXTRA_PATHS[None] == (portable.PATH_PORTABLE, portable.run_on_gpu)
    assert launch.code_path(torch.device("cpu")) == submission.PATH_NONE  # custom_kernel refuses CPU tensors
