"""The portable path: any CUDA GPU (or the CPU, for tests) without a kernel of
its own. Exact dequantization of A and B to bf16 (every E2M1 x E4M3 product
has at most 6 significant bits) and a torch GEMM with fp32 accumulation,
rounded to fp16 into C. Importing this module makes it custom_kernel's path
on every CUDA GPU without one of its own (`launch.register_path(None, ...)`).
eval.py uses its dequantization for the dequantize-then-grouped_mm peer and the
reference's self-check."""
import torch

from . import launch, submission
from .submission import SF_VEC_SIZE
from .task import input_t, output_t

PATH_PORTABLE = "portable-torch"  # custom_kernel's label for this path (launch.code_path)

def plain_scale_factors(blocked: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """[32, 4, RB, 4, KB, 1] blocked view -> [rows, K/16] (row r = 128 rb + 32 i4 + i32,
    scale column j = 4 kb + j4)."""
    row_blocks, k_blocks = blocked.shape[2], blocked.shape[4]
    plain = blocked[..., 0].permute(2, 1, 0, 4, 3).reshape(row_blocks * 128, k_blocks * 4)
    return plain[:rows, : k // SF_VEC_SIZE]


def dequantize_bf16(packed: torch.Tensor, blocked_sf: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """[rows, K/2, 1] FP4 and its blocked scale factors -> exact [rows, K] bf16 (`moe.decode`'s values, each
    of at most 6 significant bits)."""
    from .moe import decode
    return decode(packed[:, :, 0], plain_scale_factors(blocked_sf, rows, k).view(torch.uint8)).to(torch.bfloat16)


def _matmul_fp32(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """a @ b_t with fp32 accumulation and fp32 result."""
    if a.is_cuda:
        try:
            return torch.mm(a, b_t, out_dtype=torch.float32)
        except (TypeError, RuntimeError):
            pass  # older torch: no mm(out_dtype=...)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return a.float() @ b_t.float()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


@torch.no_grad()
def run_portable(data: input_t) -> output_t:
    """Every group's C from a valid input (tensors on the CPU too)."""
    abc_tensors, _, sfasfb_reordered_tensors, problem_sizes = data
    for (a, b, c), (sfa_r, sfb_r), (m, n, k, _) in zip(abc_tensors, sfasfb_reordered_tensors, problem_sizes):
        a_bf16 = dequantize_bf16(a, sfa_r, m, k)
        b_bf16 = dequantize_bf16(b, sfb_r, n, k)
        c[:, :, 0].copy_(_matmul_fp32(a_bf16, b_bf16.t()))
    return [c for _, _, c in abc_tensors]


def run_on_gpu(data: input_t) -> output_t:
    """custom_kernel's portable path: validated on every call, then computed."""
    submission.validate_input(data)
    return run_portable(data)


launch.register_path(None, PATH_PORTABLE, run_on_gpu)
