"""Types of the leaderboard task `nvfp4_group_gemm` (GPU MODE, NVIDIA B200).

The leaderboard brings its own copy of this file; ours defines the same names so
that `submission.py` imports identically here and there.
"""
from typing import TypedDict, TypeVar

import torch

# (abc_tensors, sfasfb_tensors, sfasfb_reordered_tensors, problem_sizes); see docs/contract.md.
input_t = TypeVar(
    "input_t",
    bound=tuple[
        list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        list[tuple[torch.Tensor, torch.Tensor]],
        list[tuple[torch.Tensor, torch.Tensor]],
        list[tuple[int, int, int, int]],
    ],
)
# One fp16 tensor [M, N, L] per group, in group order.
output_t = TypeVar("output_t", bound=list[torch.Tensor])


class TestSpec(TypedDict):
    problem_sizes: list[tuple[int, int, int, int]]
    seed: int
