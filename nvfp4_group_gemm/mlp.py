"""The expert MLP of a MoE layer in NVFP4, with nothing read on the host: `moe_mlp_nvfp4`.

    x (T, hidden) bf16 or fp16, sorted by expert; offs (E,) int32, each expert's end row, on x's device
      -> quantize x (`quantize_tokens_device`: group g's scale block from row P_g, computed from offs on the
         device), h = grouped_mm_nvfp4(x, w13) (T, 2I) bf16, y = swiglu(h) (T, I) bf16, quantize y,
         out = grouped_mm_nvfp4(y, w2) (T, hidden) bf16.

w13 (E, 2I, hidden/2) and w2 (E, hidden, I/2) packed E2M1 with their blocked scales and optional fp32 global
scales (`moe.quantize_experts` makes them); the activations' global scales (`x_global`, `h_global`: one value,
or one per expert) are the decode scales their quantization divides by (None: 1). `swiglu` takes the options
serving frameworks pass: gate and up in halves or interleaved, `alpha` in the sigmoid, `limit` clamping gate
(above) and up (both sides), `beta` added to up (gpt-oss: alpha 1.702, beta 1, limit 7).

Every step runs on the device (torch ops, the quantizer, the grouped GEMM): a CUDA graph replays it under new
routings, and `torch.ops.nvfp4_group_gemm.moe_mlp_nvfp4` (registered here, with a fake) lets torch.compile
trace it. The quantizer is one kernel on a Hopper or B200 GPU (token_quantizer.py), elsewhere torch's
element-wise ops and one scatter, bit-equal to `moe.quantize_tokens` (which reads offs on the host). On such
a GPU in eager mode the activation and its requantization are that kernel too, computing SwiGLU as it loads
gate and up (`swiglu_quantized`; docs/moe.md says what is measured)."""
from typing import Optional, Tuple

import torch

from . import moe
from .moe import SF_VEC_SIZE, group_rows, quantize_nvfp4, scale_offsets, scale_width, worst_case_scale_rows

GATE_UP_LAYOUTS = ("halves", "interleaved")  # gate then up in each row's halves, or alternating columns


def check_decode_scale(scale: Optional[torch.Tensor], experts: int, name: str) -> None:
    """ValueError naming `name` unless `scale` is None, one value or one per expert."""
    if scale is not None and scale.numel() != 1 and tuple(scale.shape) != (experts,):
        raise ValueError(f"{name}: shape {tuple(scale.shape)}: expected one value or one per expert ({experts},)")


def expert_scale(scale: Optional[torch.Tensor], group: torch.Tensor, experts: int, name: str):
    """A decode scale per row from one value or one per expert (rows past offs[-1]: the last expert's), as
    quantize_nvfp4 takes it; None for None."""
    check_decode_scale(scale, experts, name)
    if scale is None:
        return None
    if scale.numel() == 1:
        return scale.float().reshape(())
    return scale.float()[group.clamp(max=experts - 1)].unsqueeze(1)


def scale_rows(rows: Optional[int], tokens: int, experts: int, caller: str) -> int:
    """The scale buffer's rows: `rows`, default and at least the worst case for T and E
    (`moe.worst_case_scale_rows`); ValueError, naming `caller`, where `rows` is fewer."""
    least = worst_case_scale_rows(tokens, experts)
    if rows is not None and rows < least:
        raise ValueError(f"{caller}: rows={rows}: the scale buffer needs {least} rows for T={tokens} "
                         f"over E={experts} whatever the routing")
    return least if rows is None else rows


def quantize_tokens_device(x: torch.Tensor, offs: torch.Tensor, global_scale: Optional[torch.Tensor] = None,
                           rows: Optional[int] = None):
    """`moe.quantize_tokens` without reading offs on the host: (T, K) tokens sorted by expert -> a (T, K/2)
    packed E2M1 (uint8) and a_scale (`rows` x round_up(K/16, 4) E4M3, default and at least the worst case for
    T and E: `moe.worst_case_scale_rows`), group g's scale block from row P_g, every other byte zero.
    `global_scale`: one decode scale, or one per expert. On a Hopper or B200 GPU one kernel
    (token_quantizer.py), elsewhere torch's ops (`quantize_tokens_torch`); the same bytes either way."""
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"quantize_tokens_device: x: {x.dtype} of shape {tuple(x.shape)}: expected (T, K) floats")
    tokens, k = x.shape
    experts = offs.numel()
    if k % SF_VEC_SIZE:
        raise ValueError(f"quantize_tokens_device: x: K={k} is not a multiple of {SF_VEC_SIZE}")
    if offs.device != x.device:
        raise ValueError(f"quantize_tokens_device: offs: on {offs.device}, x is on {x.device}")
    rows = scale_rows(rows, tokens, experts, "quantize_tokens_device")
    check_decode_scale(global_scale, experts, "global_scale")
    if global_scale is not None and global_scale.device != x.device:
        raise ValueError(f"quantize_tokens_device: global_scale: on {global_scale.device}, x is on {x.device}")
    if moe.plain_eager(x, offs, global_scale):
        return quantize_checked(x, offs, global_scale, rows)
    return torch.ops.nvfp4_group_gemm.quantize_tokens(x, offs, global_scale, rows)


def quantize_checked(x: torch.Tensor, offs: torch.Tensor, global_scale: Optional[torch.Tensor], rows: int):
    """`quantize_tokens_device` past its checks: the kernel where it runs, else the torch composition."""
    if x.is_cuda:
        from . import token_quantizer
        if token_quantizer.runs_on(x, offs, global_scale):
            return token_quantizer.quantize_tokens(x, offs, global_scale, rows)
    return quantize_tokens_torch(x, offs, global_scale, rows)


@torch.library.custom_op("nvfp4_group_gemm::quantize_tokens", mutates_args=())
def _quantize_tokens(x: torch.Tensor, offs: torch.Tensor, global_scale: Optional[torch.Tensor],
                     rows: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return quantize_checked(x, offs, global_scale, rows)


@_quantize_tokens.register_fake
def _(x, offs, global_scale, rows):
    return (x.new_empty((x.shape[0], x.shape[1] // 2), dtype=torch.uint8),
            x.new_empty((rows, scale_width(x.shape[1])), dtype=torch.float8_e4m3fn))


def quantize_tokens_torch(x: torch.Tensor, offs: torch.Tensor, global_scale: Optional[torch.Tensor], rows: int):
    """`quantize_tokens_device` as torch's element-wise ops and one scatter (checked arguments)."""
    tokens, k = x.shape
    experts = offs.numel()
    group, scale_row, _ = group_rows(offs, tokens)
    packed, scales = quantize_nvfp4(x, expert_scale(global_scale, group, experts, "global_scale"))
    width, columns = scale_width(k), k // SF_VEC_SIZE
    # each row's scale bytes to its place in its group's block; rows past offs[-1] to a tail cut off after
    places = torch.where((group < experts).view(-1, 1), scale_offsets(scale_row, columns, width),
                         rows * width + torch.arange(columns, device=x.device).view(1, -1))
    blocked = torch.zeros(rows * width + columns, dtype=torch.uint8, device=x.device)
    blocked.scatter_(0, places.reshape(-1), scales.view(torch.uint8).reshape(-1))
    return packed, blocked[:rows * width].view(rows, width).view(torch.float8_e4m3fn)


def swiglu(h: torch.Tensor, layout: str = "halves", alpha: float = 1.0, beta: float = 0.0,
           limit: Optional[float] = None) -> torch.Tensor:
    """(T, 2I) -> (T, I) in h's dtype: gate * sigmoid(alpha * gate) * (up + beta), computed in fp32, with gate
    clamped to at most `limit` and up to [-limit, limit] first where `limit` is given; gate and up are each
    row's two halves, or its even and odd columns ("interleaved")."""
    if layout not in GATE_UP_LAYOUTS:
        raise ValueError(f"swiglu: layout={layout!r}: one of {', '.join(GATE_UP_LAYOUTS)}")
    if h.dim() != 2 or h.shape[1] % 2:
        raise ValueError(f"swiglu: h: shape {tuple(h.shape)}: expected (T, 2I)")
    values = h.float()
    gate, up = values.chunk(2, dim=1) if layout == "halves" else (values[:, 0::2], values[:, 1::2])
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    return (gate * torch.sigmoid(alpha * gate) * (up + beta)).to(h.dtype)


def swiglu_quantized(h: torch.Tensor, offs: torch.Tensor, global_scale: Optional[torch.Tensor] = None,
                     layout: str = "halves", alpha: float = 1.0, beta: float = 0.0, limit: Optional[float] = None,
                     rows: Optional[int] = None):
    """`quantize_tokens_device(swiglu(h, layout, alpha, beta, limit), offs, global_scale, rows)`, the same bytes:
    on a Hopper or B200 GPU in eager mode one kernel (the quantizer computing SwiGLU as it loads h, which then
    never leaves the registers), else those two steps."""
    if h.dim() != 2 or h.shape[1] % 2 or not h.is_floating_point():
        raise ValueError(f"swiglu_quantized: h: {h.dtype} of shape {tuple(h.shape)}: expected (T, 2I) floats")
    if layout not in GATE_UP_LAYOUTS:
        raise ValueError(f"swiglu_quantized: layout={layout!r}: one of {', '.join(GATE_UP_LAYOUTS)}")
    if h.is_cuda and moe.plain_eager(h, offs, global_scale):
        from . import token_quantizer
        same_device = offs.device == h.device and (global_scale is None or global_scale.device == h.device)
        if same_device and token_quantizer.runs_on(h, offs, global_scale, swiglu=True):
            experts = offs.numel()
            rows = scale_rows(rows, h.shape[0], experts, "swiglu_quantized")
            check_decode_scale(global_scale, experts, "global_scale")
            return token_quantizer.quantize_tokens(h, offs, global_scale, rows,
                                                   swiglu=(layout, float(alpha), float(beta),
                                                           None if limit is None else float(limit)))
    return quantize_tokens_device(swiglu(h, layout, alpha, beta, limit), offs, global_scale, rows)


def mlp_steps(x, offs, w13, w13_scale, w2, w2_scale, w13_global=None, w2_global=None, x_global=None,
                            h_global=None, layout="halves", alpha=1.0, beta=0.0, limit=None):
    """The MLP's steps, each a call of this package's public functions: what `moe_mlp_nvfp4` and its op run."""
    a, a_scale = quantize_tokens_device(x, offs, x_global)
    h = moe.grouped_mm_nvfp4(a, w13, a_scale, w13_scale, offs, a_global=x_global, b_global=w13_global)
    a2, a2_scale = swiglu_quantized(h, offs, h_global, layout, alpha, beta, limit)
    return moe.grouped_mm_nvfp4(a2, w2, a2_scale, w2_scale, offs, a_global=h_global, b_global=w2_global)


def check_mlp(x, offs, w13, w2, layout):
    """ValueError naming the argument where the two GEMMs' shapes do not chain (the GEMMs check the rest)."""
    if x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"moe_mlp_nvfp4: x: {x.dtype} of shape {tuple(x.shape)}: expected (T, hidden) bf16 or fp16")
    hidden = x.shape[1]
    if w13.dim() != 3 or w13.shape[0] != offs.numel() or w13.shape[2] * 2 != hidden or w13.shape[1] % 2:
        raise ValueError(f"moe_mlp_nvfp4: w13: shape {tuple(w13.shape)}: expected (E={offs.numel()}, 2I, "
                         f"hidden/2={hidden // 2})")
    inter = w13.shape[1] // 2
    if w2.dim() != 3 or tuple(w2.shape) != (offs.numel(), hidden, inter // 2):
        raise ValueError(f"moe_mlp_nvfp4: w2: shape {tuple(w2.shape)}: expected (E={offs.numel()}, "
                         f"hidden={hidden}, I/2={inter // 2})")
    if layout not in GATE_UP_LAYOUTS:
        raise ValueError(f"moe_mlp_nvfp4: layout={layout!r}: one of {', '.join(GATE_UP_LAYOUTS)}")


@torch.library.custom_op("nvfp4_group_gemm::moe_mlp_nvfp4", mutates_args=())
def _moe_mlp(x: torch.Tensor, offs: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
             w2_scale: torch.Tensor, w13_global: Optional[torch.Tensor], w2_global: Optional[torch.Tensor],
             x_global: Optional[torch.Tensor], h_global: Optional[torch.Tensor], layout: str, alpha: float,
             beta: float, limit: Optional[float]) -> torch.Tensor:
    return mlp_steps(x, offs, w13, w13_scale, w2, w2_scale, w13_global, w2_global, x_global,
                                   h_global, layout, alpha, beta, limit)


@_moe_mlp.register_fake
def _(x, offs, w13, w13_scale, w2, w2_scale, w13_global, w2_global, x_global, h_global, layout, alpha, beta,
      limit):
    return x.new_empty(x.shape[0], w2.shape[1], dtype=torch.bfloat16)


def moe_mlp_nvfp4(x: torch.Tensor, offs: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor,
                  w2: torch.Tensor, w2_scale: torch.Tensor, *, w13_global: Optional[torch.Tensor] = None,
                  w2_global: Optional[torch.Tensor] = None, x_global: Optional[torch.Tensor] = None,
                  h_global: Optional[torch.Tensor] = None, layout: str = "halves", alpha: float = 1.0,
                  beta: float = 0.0, limit: Optional[float] = None) -> torch.Tensor:
    """The experts' MLP of sorted tokens (module docstring): (T, hidden) bf16 out; rows from offs[-1] on are
    not written (garbage). ValueError naming the argument for shapes that do not chain, before anything runs."""
    check_mlp(x, offs, w13, w2, layout)
    args = (x, offs, w13, w13_scale, w2, w2_scale, w13_global, w2_global, x_global, h_global, layout, float(alpha),
            float(beta), None if limit is None else float(limit))
    if moe.plain_eager(x, offs, w13, w13_scale, w2, w2_scale, w13_global, w2_global, x_global, h_global):
        return mlp_steps(*args)
    return torch.ops.nvfp4_group_gemm.moe_mlp_nvfp4(*args)
