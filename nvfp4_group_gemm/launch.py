"""submission.py's host side as the package's other modules use it and the leaderboard never does: custom_kernel's
paths on other GPUs (`register_path`, `code_path`) and a plan memory's layout beyond the descriptor table
(`PlanLayout`, `PlannedMemory`)."""
import dataclasses
from typing import Callable, Optional, Tuple

import torch

from . import submission
from .submission import TENSORMAP_I64_PER_GROUP, ceil_div
from .task import input_t, output_t


# ==== custom_kernel's paths beside the B200 kernel (submission.EXTRA_PATHS) ==========================================
def register_path(capability: Optional[Tuple[int, int]], label: str, run: Callable[[input_t], output_t]) -> None:
    """Make `run` (which validates its input) custom_kernel's path for `capability` (None: the other GPUs)."""
    if capability == (10, 0):
        raise ValueError("sm_100 runs this module's B200 kernel")
    submission.EXTRA_PATHS[capability] = (label, run)
    submission._path_for_index.cache_clear()


def code_path(device: torch.device) -> str:
    """The label of the implementation `custom_kernel` uses for tensors on `device`."""
    if device.type != "cuda":
        return submission.PATH_NONE
    return submission._path_for_index(device.index if device.index is not None else torch.cuda.current_device())[0]


# ==== A plan's memory beyond the descriptor table (the MoE forms', hopper.py's) ======================================
@dataclasses.dataclass(frozen=True)
class PlanLayout:
    """A plan's own device memory, as the host (its size) and the kernels (their addresses) both read it: the
    (G, 5, 16) Int64 descriptor table, then `fixed_bytes` of the kernel's own (hopper.py: its token counters),
    then the input's scratch (hopper.py: the converted tokens). Offsets are bytes from the table's start; they
    take host ints or device integers (the number of groups is a run-time value)."""
    fixed_bytes: int = 0

    @staticmethod
    def table_bytes(num_groups):
        return num_groups * (TENSORMAP_I64_PER_GROUP * 8)

    def fixed_offset(self, num_groups):
        return self.table_bytes(num_groups)

    def scratch_offset(self, num_groups):
        return self.table_bytes(num_groups) + self.fixed_bytes

    def words(self, num_groups: int, scratch_bytes: int = 0) -> int:
        return ceil_div(self.scratch_offset(num_groups) + scratch_bytes, 8)


class PlannedMemory:
    """A TileConfig mixin for a plan memory laid out by `plan_layout` (moe.py shares one between forms)."""
    plan_layout = PlanLayout()  # the descriptor table alone

    def scratch_bytes(self, problem_sizes) -> int:
        """Bytes of per-input scratch a plan holds after its table and fixed regions (none here)."""
        return 0

    def plan_words(self, problem_sizes) -> int:
        """Int64 words of device memory a plan owns (`PlanLayout.words`)."""
        return self.plan_layout.words(len(problem_sizes), self.scratch_bytes(problem_sizes))
