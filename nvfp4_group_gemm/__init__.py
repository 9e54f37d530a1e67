"""NVFP4 block-scaled grouped GEMM: GPU MODE's `nvfp4_group_gemm` task as a library.

    from nvfp4_group_gemm import custom_kernel, generate_input
    data = generate_input(m=(64, 200), n=(256, 512), k=(512, 256), g=2, seed=7)
    outputs = custom_kernel(data)  # one fp16 (M, N, 1) tensor per group

`custom_kernel(data)` takes the leaderboard's input tuple and runs the B200
tcgen05 kernel on sm_100, the Hopper kernel on sm_90 and an exact portable
torch path on any other CUDA GPU (`code_path` names the one a device gets).
Nothing heavy is imported until a name is used: `import nvfp4_group_gemm` stays
cheap for command-line tools.

In a checkout, the leaderboard's files (`submission.py`, `task.py`,
`reference.py`, `eval.py`) live at the repository root, as the leaderboard
expects; this package reaches them as `nvfp4_group_gemm.submission` and so on.
"""
import importlib
import sys

# name -> (module, attribute): the public names, imported on first use
_EXPORTS = {
    "custom_kernel": ("harness", "custom_kernel"),
    "code_path": ("harness", "code_path"),
    "load_submission": ("harness", "load_submission"),
    "generate_input": ("reference", "generate_input"),
    "ref_kernel": ("reference", "ref_kernel"),
    "check_implementation": ("reference", "check_implementation"),
    "grouped_mm_nvfp4": ("moe", "grouped_mm_nvfp4"),
    "quantize_nvfp4": ("moe", "quantize_nvfp4"),
    "quantize_tokens": ("moe", "quantize_tokens"),
    "quantize_experts": ("moe", "quantize_experts"),
    "moe_mlp_nvfp4": ("mlp", "moe_mlp_nvfp4"),
    "quantize_tokens_device": ("mlp", "quantize_tokens_device"),
    "swiglu": ("mlp", "swiglu"),
}

__all__ = sorted(_EXPORTS)

# The torch ops (torch.ops.nvfp4_group_gemm.grouped_mm_nvfp4, ..._out, moe_mlp_nvfp4, quantize_tokens) exist
# once `moe` and `mlp` are imported. Where torch is imported already, its user gets them with the package (code
# calling them through torch.ops, a compiled graph naming them); a command-line tool that imports the package
# first stays free of torch.
if "torch" in sys.modules:
    importlib.import_module(f"{__name__}.mlp")


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), attribute)


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
