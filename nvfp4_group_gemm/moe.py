"""`grouped_mm_nvfp4`: the NVFP4 grouped GEMM a MoE layer calls, with group sizes that stay on the GPU.

The layout is the one torch's `F.scaled_grouped_mm` NVFP4 path, FBGEMM's `f4f4bf16_grouped_mm`, vLLM's
CUTLASS MoE path and torchao's `NVFP4Tensor` grouped mm agree on:
  a         (T, K/2) packed E2M1 (torch.float4_e2m1fn_x2 or uint8): every expert's tokens, sorted by expert
  b         (E, N, K/2) packed E2M1, each expert's weights K-major, or its (E, K/2, N) transposed view
  a_scale   E4M3 scale factors of `a` in the 128x4-blocked layout, W = round_up(K/16, 4) bytes a row:
            group g's block of round_up(m_g, 128) rows starts at row P_g = sum_{i<g} round_up(m_i, 128)
            (P_g follows `offs` on the device; the buffer may be longer than P_E rows)
  b_scale   E4M3 of `b`, one blocked block of round_up(N, 128) x W per expert
  offs      int32 (E,): the cumulative end row of each group in `a`, on a's device
  a_global, b_global   optional fp32 decode scales of the two-level NVFP4 format, shape () or (E,):
            group g's output is scaled by a_global[g] * b_global[g]
Out: (T, N) in bf16 or fp16; rows from offs[-1] on are not written. Groups with no rows cost nothing.

What cannot be checked without reading `offs` on the host (non-decreasing, offs[-1] <= T) is the caller's
promise; `validate=True` checks it with a synchronization (refused during CUDA graph capture).
Every other error is a ValueError naming the argument, raised before anything runs.

Registered with torch.library as `nvfp4_group_gemm::grouped_mm_nvfp4` (and `..._out`, which writes `out`),
with fake implementations, so torch.compile traces through it; an eager call with nothing tracing it skips the
op's dispatch (`plain_eager`) and runs the same computation.

Two computations. The kernels (`kernel_forms`: sm_90 and sm_100, N a multiple of 128, K of 256): on sm_90 one
kernel per call (for some small T two, of which the device runs one: `hopper_policy.moe_forms`) computes each group's
rows, P_g and the tile count from `offs` on the device (every CTA, into its shared memory: hopper.py's
`OffsetTables`; at most `hopper.MOE_MAX_EXPERTS` experts); on sm_100 a builder kernel computes them, the
tables and the TMA descriptors (`moe_tables.OffsetsBuilder`), then the GEMM runs. Either
walks those tiles and multiplies each group's fp32 sums by its alpha_g before the one rounding to the output's
type; the host passes only T, E, N, K and base addresses, so a CUDA graph replays it under any routing.
Everything else runs the portable computation (dequantize, then torch._grouped_mm on CUDA, which reads `offs`
on the device; a loop over the groups on the CPU); it is exact up to fp32 summation order, except that on a GPU
torch._grouped_mm rounds to bf16 before the global scales and an fp16 output are applied (one more rounding
there). docs/moe.md has the design, figures and what is left.
"""
import ctypes
import dataclasses
import functools
import struct
from typing import Optional, Tuple

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode


SF_VEC_SIZE = 16  # K elements per scale factor
BLOCK_ROWS = 128  # rows of one blocked scale-factor block
OUT_DTYPES = (torch.bfloat16, torch.float16)
# Where torch._grouped_mm runs on the GPU without reading offs on the host (elsewhere it falls back to a loop)
GROUPED_MM_DEVICES = ((9, 0), (10, 0))
FP4_DTYPES = tuple(d for d in (getattr(torch, "float4_e2m1fn_x2", None), torch.uint8) if d is not None)
SCALE_DTYPES = (torch.float8_e4m3fn, torch.uint8)


def round_up(x: int, multiple: int) -> int:
    return (x + multiple - 1) // multiple * multiple


def scale_width(k: int) -> int:
    """Bytes of one row of a blocked scale-factor buffer: round_up(K/16, 4)."""
    return round_up(k // SF_VEC_SIZE, 4)


def worst_case_scale_rows(tokens: int, experts: int) -> int:
    """The most rows P_E can reach for T tokens over E groups: sum_g 128 ceil(m_g / 128) with sum m_g = T over
    at most min(E, T) groups holding a row, at most 128 floor((T + 127 min(E, T)) / 128) (reached by groups of
    one row and one of the rest)."""
    return BLOCK_ROWS * ((tokens + (BLOCK_ROWS - 1) * min(experts, tokens)) // BLOCK_ROWS)


class Problem:
    """The checked metadata of one call: T, N, K, E, B as (E, N, K/2) and the buffers' widths."""

    def __init__(self, a, b, a_scale, b_scale, offs, a_global, b_global, out_dtype, out, validated=False):
        def fail(argument: str, problem: str):
            raise ValueError(f"grouped_mm_nvfp4: {argument}: {problem}")

        named = (("a", a), ("b", b), ("a_scale", a_scale), ("b_scale", b_scale), ("offs", offs),
                 ("a_global", a_global), ("b_global", b_global), ("out", out))
        for i, (name, value) in enumerate(named):  # the first five required, the rest optional
            if (i < 5 or value is not None) and not isinstance(value, torch.Tensor):
                fail(name, f"expected a torch.Tensor, got {type(value).__name__}")
        device = a.device
        for name, value in named[1:]:
            if value is not None and value.device != device:
                fail(name, f"on {value.device}, a is on {device}")
        if a.dtype not in FP4_DTYPES:
            fail("a", f"dtype {a.dtype}, expected packed E2M1 ({', '.join(map(str, FP4_DTYPES))})")
        if a.dim() != 2 or (a.shape[0] > 0 and (a.stride(1) != 1 or a.stride(0) != a.shape[1])):
            fail("a", f"shape {tuple(a.shape)} strides {a.stride()}: expected (T, K/2), rows contiguous and "
                 "packed (a row every K/2 bytes)")
        self.tokens, self.k = a.shape[0], 2 * a.shape[1]
        if self.k == 0 or self.k % SF_VEC_SIZE:
            fail("a", f"K = {self.k} (2 x a.shape[1]): expected a positive multiple of {SF_VEC_SIZE}")
        if b.dtype not in FP4_DTYPES:
            fail("b", f"dtype {b.dtype}, expected packed E2M1")
        if b.dim() != 3:
            fail("b", f"shape {tuple(b.shape)}: expected (E, N, K/2) or its (E, K/2, N) transposed view")
        half_k = self.k // 2
        if b.shape[2] == half_k and b.stride(2) == 1 and b.stride(1) == half_k:
            self.b, self.b_transposed = b, False  # (E, N, K/2), K-major
        elif b.shape[1] == half_k and b.stride(1) == 1 and b.stride(2) == half_k:
            self.b, self.b_transposed = b.transpose(1, 2), True  # torch's (E, K/2, N) view of the K-major weights
        else:
            fail("b", f"shape {tuple(b.shape)} strides {b.stride()}: expected (E, N, {half_k}) with K contiguous, "
                 f"or its (E, {half_k}, N) transposed view (K = {self.k} from a)")
        self.experts, self.n = self.b.shape[0], self.b.shape[1]
        if self.n == 0 or self.experts == 0:
            fail("b", f"shape {tuple(b.shape)}: expected at least one expert and one row")
        if offs.dtype != torch.int32 or offs.shape != (self.experts,):
            fail("offs", f"dtype {offs.dtype} shape {tuple(offs.shape)}: expected int32 ({self.experts},), one "
                 "cumulative end row per expert of b")
        if offs.stride(0) != 1:
            fail("offs", f"stride {offs.stride(0)}: expected contiguous (kernels read it as an array)")
        self.width = scale_width(self.k)
        for name, scale in (("a_scale", a_scale), ("b_scale", b_scale)):
            if scale.dtype not in SCALE_DTYPES:
                fail(name, f"dtype {scale.dtype}, expected torch.float8_e4m3fn")
            if not scale.is_contiguous():
                fail(name, "not contiguous: the blocked layout is read as consecutive bytes")
        if a_scale.numel() % self.width:
            fail("a_scale", f"{a_scale.numel()} bytes: not whole rows of round_up(K/16, 4) = {self.width}")
        need = worst_case_scale_rows(self.tokens, self.experts) * self.width
        if a_scale.numel() < need and not validated:
            fail("a_scale", f"{a_scale.numel()} bytes: the groups' blocks may need up to {need} "
                 f"({need // self.width} rows of {self.width}, for T = {self.tokens} over E = {self.experts}); "
                 "pad it (as vLLM's and torchao's quantizers do), or pass validate=True to check this routing's "
                 "needs on the host")
        self.b_block = round_up(self.n, BLOCK_ROWS) * self.width
        if b_scale.numel() != self.experts * self.b_block:
            fail("b_scale", f"{b_scale.numel()} bytes: expected {self.experts} x round_up(N, 128) x "
                 f"round_up(K/16, 4) = {self.experts * self.b_block}")
        for name, scale in (("a_global", a_global), ("b_global", b_global)):
            if scale is not None and (scale.dtype != torch.float32 or scale.shape not in ((), (self.experts,))):
                fail(name, f"dtype {scale.dtype} shape {tuple(scale.shape)}: expected float32 () or "
                     f"({self.experts},)")
        if out is not None and out.dtype not in OUT_DTYPES:
            fail("out", f"dtype {out.dtype}: expected torch.bfloat16 or torch.float16")
        if out_dtype not in OUT_DTYPES:
            fail("out_dtype", f"{out_dtype}: expected torch.bfloat16 or torch.float16")
        if out is not None and (out.dtype != out_dtype or out.shape != (self.tokens, self.n)
                                or not out.is_contiguous()):
            fail("out", f"{out.dtype} {tuple(out.shape)}: expected a contiguous ({self.tokens}, {self.n}) "
                 f"{out_dtype} tensor")
        self.device, self.out_dtype = device, out_dtype
        # what a plan is made for, less its device, stream and forms (`launch_plan`)
        self.plan_shape = (self.experts, self.n, self.k, token_capacity(self.tokens))
        self.facts = None  # what calls of this signature share (`checked`): `kernel_forms` keeps its choice there

    @classmethod
    def checked(cls, a, b, a_scale, b_scale, offs, a_global, b_global, out_dtype, out, validated=False) -> "Problem":
        """Problem(...) of this call, its checks made once per `call_signature` (they read nothing else): a call
        like one checked before gets a copy of that one's facts (`facts`, shared with it), with this call's B.
        Traced (torch.compile), every call is checked: the trace runs once, and copies no object's state."""
        if torch.compiler.is_compiling():
            return cls(a, b, a_scale, b_scale, offs, a_global, b_global, out_dtype, out, validated)
        try:
            key = (call_signature(a, b, a_scale, b_scale, offs, a_global, b_global, out), out_dtype, validated)
        except AttributeError:  # an argument that is no tensor: Problem names it
            return cls(a, b, a_scale, b_scale, offs, a_global, b_global, out_dtype, out, validated)
        facts = _checked_calls.get(key)
        if facts is None:
            problem = cls(a, b, a_scale, b_scale, offs, a_global, b_global, out_dtype, out, validated)
            if len(_checked_calls) >= CHECKED_CALLS_KEPT:
                del _checked_calls[next(iter(_checked_calls))]  # the first checked: it is checked again if it comes
            facts = problem.facts = dict(problem.__dict__, b=None)  # no tensor kept
            _checked_calls[key] = facts
            return problem
        problem = object.__new__(cls)
        problem.__dict__.update(facts)
        problem.b, problem.facts = (b.transpose(1, 2) if facts["b_transposed"] else b), facts
        return problem

    def new_output(self) -> torch.Tensor:
        """A (T, N) output of the call's type on its device, unwritten."""
        return torch.empty(self.tokens, self.n, dtype=self.out_dtype, device=self.device)


def call_signature(a, b, a_scale, b_scale, offs, a_global, b_global, out) -> tuple:
    """Everything of a call's tensors that `Problem` checks and `kernel_forms` reads, less their addresses and
    values: each one's type, shape, strides, dtype and device (AttributeError where one is no tensor)."""
    return (type(a), a.shape, a.stride(), a.dtype, a.device, type(b), b.shape, b.stride(), b.dtype, b.device,
            type(a_scale), a_scale.shape, a_scale.stride(), a_scale.dtype, a_scale.device,
            type(b_scale), b_scale.shape, b_scale.stride(), b_scale.dtype, b_scale.device,
            type(offs), offs.shape, offs.stride(), offs.dtype, offs.device,
            None if a_global is None else (type(a_global), a_global.shape, a_global.stride(), a_global.dtype,
                                           a_global.device),
            None if b_global is None else (type(b_global), b_global.shape, b_global.stride(), b_global.dtype,
                                           b_global.device),
            None if out is None else (type(out), out.shape, out.stride(), out.dtype, out.device))


CHECKED_CALLS_KEPT = 256  # signatures whose checks passed, the first checked dropped first (one lookup a call)
_checked_calls = {}  # (call_signature, out_dtype, validated) -> the facts of a Problem, in the order checked


def check_offsets(offs: torch.Tensor, tokens: int, a_scale: torch.Tensor, width: int) -> None:
    """`validate=True`: offs non-decreasing from 0, offs[-1] <= T, a_scale long enough for this routing's P_E
    rows (reads offs on the host: a synchronization)."""
    if offs.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("grouped_mm_nvfp4: validate=True reads offs on the host, which a CUDA graph capture "
                           "cannot: validate outside the capture")
    check_offset_values(offs.tolist(), tokens, a_scale, width)


def check_offset_values(values: list, tokens: int, a_scale: torch.Tensor, width: int) -> None:
    """offs as read on the host: non-decreasing from 0, at most T, a_scale long enough for its P_E rows."""
    if any(v < 0 for v in values[:1]) or any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"grouped_mm_nvfp4: offs: {values}: expected non-decreasing cumulative ends from 0")
    if values and values[-1] > tokens:
        raise ValueError(f"grouped_mm_nvfp4: offs: the last group ends at row {values[-1]}, a has {tokens} rows")
    ends = [0] + values
    used = sum(round_up(end - start, BLOCK_ROWS) for start, end in zip(ends, ends[1:])) * width
    if a_scale.numel() < used:
        raise ValueError(f"grouped_mm_nvfp4: a_scale: {a_scale.numel()} bytes, this routing's blocks need {used}")


# ---- the portable computation ------------------------------------------------------------------------------------
def scale_offsets(rows: torch.Tensor, columns: int, width: int) -> torch.Tensor:
    """Byte offsets in a 128x4-blocked buffer `width` bytes a row of the scale factors (rows, 0..columns-1):
    block (row // 128, column // 4) is 512 bytes, [row % 32][(row % 128) // 32][column % 4] inside."""
    r = rows.view(-1, 1)
    c = torch.arange(columns, device=rows.device).view(1, -1)
    return ((r // BLOCK_ROWS) * (BLOCK_ROWS * width) + (c // 4) * 512 + (r % 32) * 16 + ((r % BLOCK_ROWS) // 32) * 4
            + c % 4)


def decoding_tables(device: torch.device):
    """The E2M1 (16) and E4M3 (256) values, computed on `device` (no copy from the host, which a CUDA graph
    capture would refuse); the same as reference.E2M1_TABLE and E4M3_TABLE (tests/test_moe.py)."""
    codes = torch.arange(16, device=device)
    sign = 1 - 2 * ((codes >> 3) & 1).float()
    exponent, mantissa = (codes >> 1) & 3, (codes & 1).float()
    e2m1 = torch.where(exponent == 0, mantissa * 0.5, (1 + mantissa * 0.5) * torch.exp2((exponent - 1).float()))
    e4m3 = torch.arange(256, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn).float()
    return e2m1 * sign, e4m3


def decode(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(rows, K/2) E2M1 and (rows, K/16) E4M3 bytes -> (rows, K) float32 (each product exact)."""
    codes = packed.contiguous().view(torch.uint8)
    nibbles = torch.stack((codes & 0xF, codes >> 4), dim=-1).reshape(codes.shape[0], -1).long()
    e2m1, e4m3 = decoding_tables(codes.device)
    values = e2m1[nibbles]
    block = e4m3[scales.long()]
    return values * block.repeat_interleave(SF_VEC_SIZE, dim=1)


def decode_experts(b: torch.Tensor, b_scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """(E, N, K/2) E2M1 experts and their blocked scales (one block of round_up(N, 128) rows each) -> (E, N, K)
    values in `dtype`, decoded one expert at a time (`decode`: each product exact)."""
    e, n, half = b.shape
    k = 2 * half
    rows = scale_offsets(torch.arange(n, device=b.device), k // SF_VEC_SIZE, scale_width(k))
    flat = b_scale.reshape(e, -1).view(torch.uint8)
    return torch.stack([decode(b[x], flat[x][rows]).to(dtype) for x in range(e)])


def group_starts(offs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each group's first row in a and its first row P_g in the scale buffer, from offs on its device (int64)."""
    ends = offs.long()
    starts = torch.cat((ends.new_zeros(1), ends[:-1]))
    padded = (ends - starts + BLOCK_ROWS - 1) // BLOCK_ROWS * BLOCK_ROWS
    return starts, torch.cumsum(padded, 0) - padded


def group_rows(offs: torch.Tensor, tokens: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of a, on offs's device and without reading it on the host: its group (E for rows past offs[-1]),
    its row in the scale buffer (P_g + row - start_g), and the groups' start rows."""
    ends = offs.long()
    starts, first_scale_row = group_starts(offs)
    rows = torch.arange(tokens, device=offs.device)
    group = torch.searchsorted(ends, rows, right=True)
    g = group.clamp(max=ends.numel() - 1)
    in_group = group < ends.numel()  # rows past offs[-1] read scale row 0 (their results are never written)
    return group, torch.where(in_group, first_scale_row[g] + rows - starts[g], 0), starts


def compute(problem: Problem, a, a_scale, b_scale, offs, a_global, b_global, out: torch.Tensor) -> None:
    """The portable path: dequantize both operands (exact in fp32), multiply per group, scale, write `out`'s
    rows below offs[-1]."""
    t, n, k, e, width = problem.tokens, problem.n, problem.k, problem.experts, problem.width
    if t == 0:
        return
    grouped_mm = a.is_cuda and torch.cuda.get_device_capability(a.device) in GROUPED_MM_DEVICES
    if not grouped_mm:  # the loop below reads offs on the host: check it there, as validate=True does
        ends = offs.tolist()
        check_offset_values(ends, t, a_scale, width)
    group, scale_row, starts = group_rows(offs, t)
    # bf16 holds every dequantized value exactly (at most 6 significant bits): the GPU path keeps them so,
    # expert by expert (2 bytes an element of B at its peak, not fp32's 4 and a bf16 copy)
    dtype = torch.bfloat16 if grouped_mm else torch.float32
    a_bytes = a_scale.reshape(-1).view(torch.uint8)
    a_values = decode(a, a_bytes[scale_offsets(scale_row, k // SF_VEC_SIZE, width)]).to(dtype)
    b_values = decode_experts(problem.b, b_scale, dtype)  # (E, N, K)
    alpha = torch.ones(e, dtype=torch.float32, device=a.device)
    for scale in (a_global, b_global):
        if scale is not None:
            alpha = alpha * scale
    valid = group < e
    if grouped_mm:
        # fp32 accumulation, rounded to bf16 (torch._grouped_mm's output is its inputs' dtype): exact for bf16
        # without global scales, else rounded twice
        result = torch._grouped_mm(a_values, b_values.transpose(1, 2), offs=offs).float()
    else:  # the CPU (and GPUs torch._grouped_mm runs only through a host fallback: the sizes read here)
        result = torch.zeros(t, n, dtype=torch.float32, device=a.device)
        for x, (start, end) in enumerate(zip(starts.tolist(), ends)):
            if end > start:
                result[start:end] = a_values[start:end] @ b_values[x].t()
    result = result * alpha[group.clamp(max=e - 1)].view(-1, 1)
    out.copy_(torch.where(valid.view(-1, 1), result.to(out.dtype), out))


# ---- the kernels' tables, from offs on the device -----------------------------------------------------------------
def device_tables(problem: Problem, a, a_scale, b_scale, offs, out) -> torch.Tensor:
    """The launcher's table words (`submission.gather_tables`' layout for an unswapped configuration, groups in
    order: A, B, D addresses, then SFA, SFB addresses, then (M, N) and (K, L) as int32 pairs) computed on the
    device from `offs`, with no synchronization: group g's A rows from offs[g-1], its SFA block from row P_g.
    A group with no rows has M = 0. The torch twin of what `build_from_offsets` writes, which the GPU tests
    compare it with word for word."""
    e, n, k, width = problem.experts, problem.n, problem.k, problem.width
    starts, first_scale_row = group_starts(offs)
    rows = offs.long() - starts
    experts = torch.arange(e, device=offs.device)
    b = problem.b
    abc = torch.stack((a.data_ptr() + starts * (k // 2),
                       b.data_ptr() + experts * b.stride(0) * b.element_size(),
                       out.data_ptr() + starts * (n * out.element_size())), 1).flatten()
    sf = torch.stack((a_scale.data_ptr() + first_scale_row * width,
                      b_scale.data_ptr() + experts * problem.b_block), 1).flatten()
    sizes = torch.stack((rows | (n << 32), torch.full_like(rows, k | (1 << 32))), 1).flatten()
    return torch.cat((abc, abc.new_zeros(len(abc) % 2), sf, sizes))


# ---- the kernels, with the group sizes on the device ------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _submission():
    """The submission module, imported at the first kernel call (importing it loads the DSL): a call's launch
    reads it without an import statement's cost."""
    from . import submission
    return submission


def cuda_index(tensor: torch.Tensor) -> int:
    """The index of the CUDA device `tensor` is on ("cuda" alone: the current device)."""
    return tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()


def call_addresses(a, b, a_scale, b_scale, out) -> tuple:
    """The base addresses of a call's a, B, a_scale, b_scale and out, in that order (read once a call: the
    alignment check and the launch share them)."""
    return a.data_ptr(), b.data_ptr(), a_scale.data_ptr(), b_scale.data_ptr(), out.data_ptr()


def kernel_forms(problem: Problem, a, b_scale, a_scale, a_global, b_global, out, addresses=None):
    """The configurations of the kernels launched for this call (`hopper_policy.moe_forms` on sm_90: one, or two
    the device chooses between; `moe_tables.MOE_CONFIG` on sm_100; -bf16 forms for bf16 output), or None for
    the portable path: other devices, N or K the kernels do not take, B's experts not back to back, a base
    address not 16-byte aligned, more than `hopper.MOE_MAX_EXPERTS` experts on sm_90. What does not depend on
    the addresses is found once per signature (`kernel_device`, kept in the problem's facts)."""
    facts = problem.facts if problem.facts is not None else {}
    device = facts.get("kernel_device", facts)
    if device is facts:
        device = facts["kernel_device"] = kernel_device(problem, a, a_global, b_global, out)
    if device is None:
        return None
    capability, num_sms, align, policy = device
    if addresses is None:
        addresses = call_addresses(a, problem.b, a_scale, b_scale, out)
    a_address, b_address, a_scale_address, b_scale_address, out_address = addresses
    if (a_address | b_address | a_scale_address | b_scale_address | out_address) % align:  # a power of two
        return None
    setting = policy.moe_form if policy is not None else None
    chosen = facts.get("forms")  # (the setting, its choice): the same for every call of the signature
    if chosen is None or chosen[0] != setting:
        chosen = facts["forms"] = (setting, forms_for(capability, problem.tokens, problem.experts, problem.n,
                                                      problem.k, num_sms, problem.out_dtype == torch.bfloat16,
                                                      setting))
    return chosen[1]


def kernel_device(problem: Problem, a, a_global, b_global, out) -> Optional[tuple]:
    """Where a kernel may take calls of this problem's signature, whatever their addresses: (the device's
    capability, its SMs, the alignment the kernels need of each base address, the module whose `moe_form` sets
    the form, or None); None for the portable path."""
    from . import submission
    if not a.is_cuda or problem.tokens == 0:
        return None
    if problem.n % submission.N_MULTIPLE or problem.k % submission.K_MULTIPLE:
        return None
    b = problem.b
    if b.stride(0) != b.shape[1] * b.shape[2] or not out.is_contiguous():
        return None
    if any(g is not None and g.dim() == 1 and g.stride(0) != 1 for g in (a_global, b_global)):
        return None  # the kernels read a per-expert scale as an array
    index = cuda_index(a)
    capability, policy = torch.cuda.get_device_capability(index), None
    if capability == (9, 0):
        from . import hopper_policy as policy
    return capability, submission.sm_count(index), submission.PTR_ALIGN_BYTES, policy


@functools.lru_cache(maxsize=1024)
def forms_for(capability: tuple, tokens: int, experts: int, n: int, k: int, num_sms: int, bf16: bool,
              form_setting: Optional[str]):
    """`kernel_forms`' choice from the facts it depends on, made once per set of them (the Hopper choice models
    sampled routings): the forms, or None where no kernel takes the call. `form_setting`, `hopper_policy.moe_form`,
    which `hopper_policy.moe_forms` reads itself, is here to key the cache: a changed setting is a new choice."""
    if capability == (10, 0):
        from . import moe_tables
        configs = (moe_tables.MOE_CONFIG,)
    elif capability == (9, 0):
        from . import hopper, hopper_policy
        if experts > hopper.MOE_MAX_EXPERTS:
            return None  # more groups than its CTAs hold in shared memory
        configs = hopper_policy.moe_forms(tokens, experts, n, k, num_sms)
    else:
        return None
    return Forms(dataclasses.replace(c, bf16_output=bf16) for c in configs)


class Forms(tuple):
    """The configurations a call launches, in launch order, with their names (`names`: what keys their plan)."""

    def __new__(cls, configs):
        forms = super().__new__(cls, configs)
        forms.names = tuple(c.name for c in forms)
        return forms


def token_capacity(tokens: int) -> int:
    """The T a plan is made for: `tokens` rounded up to a power of two (at least 64), so that calls whose T
    varies share a few plans."""
    return max(64, 1 << (tokens - 1).bit_length())


class CallCells:
    """A call's arguments (`names`, in order), 8 signed bytes each (a 4-byte one, negative too, in the low half),
    in one array that several launches read (`ChangingLaunch`): a call writes them once."""

    def __init__(self, names):
        self.names = tuple(names)
        self.array = (ctypes.c_uint64 * len(self.names))()
        layout = struct.Struct(f"<{len(self.names)}q")
        self.write_at, self.read_at = layout.pack_into, layout.unpack_from

    def write(self, values: tuple) -> None:
        self.write_at(self.array, 0, *values)

    def values(self) -> dict:
        """The arguments last written, by name."""
        return dict(zip(self.names, self.read_at(self.array, 0)))

    def address(self, name: str) -> int:
        return ctypes.addressof(self.array) + 8 * self.names.index(name)


class ChangingLaunch:
    """A host function (`submission.HostFunction`) bound to `values` on `stream`, whose arguments that `cells`
    names (a `CallCells`) change from call to call: write the cells, then launch what `bind` returned."""

    def __init__(self, host, values: dict, stream: int, cells: CallCells):
        self.host, self.values, self.stream, self.cells = host, dict(values), stream, cells
        self.changing = [name for name in cells.names if name in host.spec.names]

    def bind(self):
        """A function launching with the cells' values at each call (written before the first): where the host
        function owns the argument storage, its address array points at the cells for the changing arguments, so
        a launch binds nothing; else (the DSL's own conversion) each launch binds again."""
        launch = self.bind_now()
        storage = getattr(launch, "storage", None)
        if storage is None:
            pending = [launch]  # bound for the first call

            def rebind():
                (pending.pop() if pending else self.bind_now())()
            return rebind
        # the launch reads argument i at the address in entry i of its address array (`packed`)
        first = (launch.packed - ctypes.addressof(storage)) // 8
        for name in self.changing:
            storage[first + self.host.spec.names.index(name)] = self.cells.address(name)
        return launch

    def bind_now(self):
        """The host function bound to its values and the cells' current ones."""
        return self.host.bind({**self.values, **self.cells.values()}, self.stream)


# The host functions' arguments a MoE call supplies (`KernelPlan.launch` writes them in this order); the plan
# supplies the rest
CALL_ARGUMENTS = ("ptr_offs", "tokens", "n", "k", "a_address", "b_address", "ptr_b", "c_address", "sfa_address",
                  "sfb_address", "a_global_address", "a_global_per_group", "b_global_address", "b_global_per_group")


class KernelPlan:
    """What one (device, stream, configurations, E, N, K, `token_capacity`) keeps between calls, none of it read
    from `offs` on the host: the plan's memory (hopper.py's token counters, zero between launches, and
    converted tokens, `tokens` x K x 2 bytes; the B200 form's descriptors), the tables where a form's host
    functions take them (the B200 form's builder writes them: `submission.table_offsets` order, then the tile
    count after the sizes), the grid (for the most tiles any routing of `tokens` over E experts can make, so of
    any fewer) and the launches. Each call waits for the kernel before it (the previous call's), so calls in
    stream order share them, and another stream has its own; a CUDA graph keeps using them, so a plan launched
    in a capture is kept (`PlanCache`).

    Each form's kernel names its host functions in launch order (`host_functions`: hopper.py's MoE form one,
    which computes the groups from offs itself; the B200 form's builder from offs, then its GEMM); the plan
    binds each by name from its own values and the call's. hopper.py's forms may come two to a call
    (`hopper_policy.moe_forms`): each launched, one after the other on the same memory, the device choosing which
    one computes (`hopper_policy.MOE_TWO_FORM_RULES`)."""

    def __init__(self, configs, device_index: int, stream: int, experts: int, n: int, k: int, tokens: int,
                 device=None, rules: Optional[tuple] = None):
        """`rules`: which calls each of hopper.py's forms takes (default: every call for one form,
        `hopper_policy.MOE_TWO_FORM_RULES` for two)."""
        from . import moe_tables, submission
        device = torch.device("cuda", device_index) if device is None else device  # a stand-in's test: "cpu"
        compiled = [submission.compile_grouped_gemm(c) for c in configs]
        layouts = {c.plan_layout for c in configs}
        if len(layouts) != 1:
            raise ValueError(f"{[c.name for c in configs]}: forms sharing a plan share its memory's layout")
        (layout,) = layouts
        scratch = configs[0].scratch_bytes([(tokens, n, k, 1)])
        self.memory = torch.zeros(layout.words(experts, scratch), dtype=torch.int64, device=device)
        self.experts, self.n, self.k = experts, n, k
        self.stream = stream
        self.stream_capturing = submission.stream_capturing
        self.captured = self.stream_capturing()  # made or launched in a capture: a graph may replay it
        # the kernels' own region (hopper.py's token counters, zero between launches): a plan made during a
        # capture is zeroed by the graph's replays alone, so its first launch outside one zeroes it first
        self.counters = self.memory[layout.fixed_offset(experts) // 8:layout.scratch_offset(experts) // 8]
        self.zero_first = self.captured
        names = {name for c in compiled for _, spec in c.functions.values() for name in spec.names}
        plan = dict(ptr_tensormaps=self.memory.data_ptr(), ptr_memory=self.memory.data_ptr(),
                    ptr_scratch=self.memory.data_ptr() + layout.scratch_offset(experts), plan_ready=0)
        self.tables = None
        if "ptr_problem_sizes" in names:  # a builder's tables, which its GEMM reads
            self.tables = torch.empty(moe_tables.moe_table_words(experts), dtype=torch.int64, device=device)
            abc_at, sf_at, sizes_at = submission.table_offsets(experts)
            plan.update(zip(("ptr_problem_sizes", "ptr_abc", "ptr_sf"),
                            (self.tables.data_ptr() + 8 * at for at in (sizes_at, abc_at, sf_at))))
        self.one_wave_ctas = None
        if "one_wave_rule" in names:  # hopper.py's forms: which calls each launch takes
            from . import hopper, hopper_policy
            if rules is None:
                rules = (hopper.MOE_EVERY_CALL,) if len(configs) == 1 else hopper_policy.MOE_TWO_FORM_RULES
            self.one_wave_ctas = hopper_policy.moe_one_wave_ctas(tokens, experts, n, submission.sm_count(device_index))
            plan["one_wave_ctas"] = self.one_wave_ctas
        # each form's host functions in launch order, with the plan's values; bound now where the call adds none,
        # else at the first call (`ChangingLaunch`), reading the call's arguments from `cells`
        self.cells, self.launches, self.bound = CallCells(CALL_ARGUMENTS), [], None
        for i, (config, form) in enumerate(zip(configs, compiled)):
            tiles = moe_tables.most_tiles(tokens, experts, n, config)
            values = dict(plan, total_tiles=tiles, num_groups=experts, num_ctas=submission.persistent_ctas(
                tiles, submission.sm_count(device_index) // config.cta_group))
            if "one_wave_rule" in names:
                values["one_wave_rule"] = rules[i]
            for name in form.functions:
                function = form.host_function(name, device_index)
                per_call = any(arg in CALL_ARGUMENTS for arg in function.spec.names)
                self.launches.append(ChangingLaunch(function, values, stream, self.cells) if per_call
                                     else function.bind(values, stream))

    def launch(self, a, b, a_scale, b_scale, offs, out, a_global=None, b_global=None, addresses=None) -> None:
        """On the plan's stream, each form's host functions (`host_functions`) in order, with this call's
        arguments (`CALL_ARGUMENTS`); `addresses`: `call_addresses`, if known."""
        capturing = self.stream_capturing()
        self.captured = self.captured or capturing
        if self.zero_first and not capturing:
            self.counters.zero_()
            self.zero_first = False
        if addresses is None:
            addresses = call_addresses(a, b, a_scale, b_scale, out)
        a_address, b_address, a_scale_address, b_scale_address, out_address = addresses
        values = (offs.data_ptr(), a.shape[0], self.n, self.k, a_address, b_address, b_address, out_address,
                  a_scale_address, b_scale_address, 0 if a_global is None else a_global.data_ptr(),
                  0 if a_global is None else int(a_global.dim() == 1),
                  0 if b_global is None else b_global.data_ptr(), 0 if b_global is None else int(b_global.dim() == 1))
        self.cells.write(values)
        bound = self.bound
        if bound is None:
            bound = self.bound = [launch.bind() if isinstance(launch, ChangingLaunch) else launch
                                  for launch in self.launches]
        for launch in bound:
            launch()

    @property
    def nbytes(self) -> int:
        """Device memory it holds (its memory, and the B200 form's tables)."""
        return self.memory.numel() * 8 + (self.tables.numel() * 8 if self.tables is not None else 0)


class PlanCache:
    """The KernelPlans kept between calls, by key, least recently used first. Plans never launched in a CUDA
    graph capture are dropped, oldest first, while theirs is more than `limit` bytes (a plan's memory grows
    with T x K: about 940 MB at 65,536 tokens and K = 7,168); a plan launched in a capture is kept until
    `release_plans` (a graph's replays use it). Dropping one is safe while its kernel runs: its memory goes
    back to torch's allocator on its stream, so only later work on that stream reuses it."""

    def __init__(self, limit: int):
        self.limit = limit
        self.plans = {}  # key -> KernelPlan, in use order (dicts keep insertion order)

    def get(self, key):
        plan = self.plans.get(key)
        if plan is not None and next(reversed(self.plans)) != key:
            self.plans[key] = self.plans.pop(key)  # now the most recently used
        return plan

    def add(self, key, plan):
        self.plans[key] = plan
        self.trim(keep=key)
        return plan

    def trim(self, keep=None) -> None:
        """Drop the least recently used uncaptured plans, `keep` never, while theirs is over the limit."""
        held = sum(p.nbytes for p in self.plans.values() if not p.captured)
        for key in [k for k, p in self.plans.items() if not p.captured and k != keep]:
            if held <= self.limit:
                break
            held -= self.plans.pop(key).nbytes

    def clear(self) -> None:
        self.plans.clear()


_kernel_plans = PlanCache(limit=4 << 30)


def set_plan_memory_limit(nbytes: int) -> None:
    """At most `nbytes` of device memory in plans no CUDA graph captured (default 4 GiB; the plan a call needs
    is kept whatever its size); the least recently used beyond it are dropped now and as new plans are made."""
    if nbytes < 0:
        raise ValueError(f"set_plan_memory_limit: nbytes: {nbytes}: expected 0 or more")
    _kernel_plans.limit = nbytes
    _kernel_plans.trim()


def release_plans() -> None:
    """Drop every plan, those CUDA graphs captured included: call it only when no graph that captured a call of
    the op will replay again (the next call makes its plan anew)."""
    _kernel_plans.clear()


def run_kernel(configs, problem: Problem, a, a_scale, b_scale, offs, out, a_global=None, b_global=None,
               addresses=None) -> None:
    """`configs` (`kernel_forms`' or one form's tuple) on this call, with the plan its stream keeps for them, on
    a's device (made current for the call where it is not); `addresses`: `call_addresses`, if known."""
    index = a.device.index
    if index == torch.cuda.current_device():
        launch_plan(configs, problem, index, a, a_scale, b_scale, offs, out, a_global, b_global, addresses)
    else:
        with torch.cuda.device(index):
            launch_plan(configs, problem, index, a, a_scale, b_scale, offs, out, a_global, b_global, addresses)


def launch_plan(configs, problem: Problem, index: int, a, a_scale, b_scale, offs, out, a_global, b_global,
                addresses=None) -> None:
    stream = _submission().current_stream_handle(index)
    names = configs.names if type(configs) is Forms else tuple(c.name for c in configs)
    key = (index, stream, names) + problem.plan_shape
    plan = _kernel_plans.get(key)
    if plan is None:
        plan = _kernel_plans.add(key, KernelPlan(configs, index, stream, *key[3:]))
    plan.launch(a, problem.b, a_scale, b_scale, offs, out, a_global, b_global, addresses)


def run(problem: Problem, a, a_scale, b_scale, offs, a_global, b_global, out: torch.Tensor) -> None:
    """The kernels where they take the call (`kernel_forms`), else the portable computation."""
    addresses = call_addresses(a, problem.b, a_scale, b_scale, out) if a.is_cuda else None
    configs = kernel_forms(problem, a, b_scale, a_scale, a_global, b_global, out, addresses)
    if configs is None:
        compute(problem, a, a_scale, b_scale, offs, a_global, b_global, out)
    else:
        run_kernel(configs, problem, a, a_scale, b_scale, offs, out, a_global, b_global, addresses)


# ---- the torch ops -----------------------------------------------------------------------------------------------
@torch.library.custom_op("nvfp4_group_gemm::grouped_mm_nvfp4_out", mutates_args=("out",))
def _grouped_mm_out(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                    offs: torch.Tensor, a_global: Optional[torch.Tensor], b_global: Optional[torch.Tensor],
                    out: torch.Tensor) -> None:
    problem = Problem.checked(a, b, a_scale, b_scale, offs, a_global, b_global, out.dtype, out)
    run(problem, a, a_scale, b_scale, offs, a_global, b_global, out)


@_grouped_mm_out.register_fake
def _(a, b, a_scale, b_scale, offs, a_global, b_global, out) -> None:
    return None


@torch.library.custom_op("nvfp4_group_gemm::grouped_mm_nvfp4", mutates_args=())
def _grouped_mm(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                offs: torch.Tensor, a_global: Optional[torch.Tensor], b_global: Optional[torch.Tensor],
                out_dtype: torch.dtype) -> torch.Tensor:
    problem = Problem.checked(a, b, a_scale, b_scale, offs, a_global, b_global, out_dtype, None)
    out = problem.new_output()
    run(problem, a, a_scale, b_scale, offs, a_global, b_global, out)
    return out


@_grouped_mm.register_fake
def _(a, b, a_scale, b_scale, offs, a_global, b_global, out_dtype):
    """(T, N) without reading any data: N from b's rows (or its transposed view's columns)."""
    half_k = a.shape[1]
    n = b.shape[1] if (b.shape[2] == half_k and b.stride(2) == 1) else b.shape[2]
    return a.new_empty((a.shape[0], n), dtype=out_dtype)


def unpack_nvfp4_tensor(value, scale, global_scale, name: str):
    """A torchao NVFP4Tensor (anything with `qdata`, `scale`, `per_tensor_scale`) as its packed data, its
    swizzled scales (which must be the 128x4-blocked layout: is_swizzled_scales=True) and its per-tensor scale,
    without copies; a plain tensor as it is."""
    if type(value) is torch.Tensor or (isinstance(value, torch.Tensor) and not hasattr(value, "qdata")):
        return value, scale, global_scale
    if not all(hasattr(value, field) for field in ("qdata", "scale", "per_tensor_scale")):
        return value, scale, global_scale  # Problem names what it is not
    if scale is not None or global_scale is not None:
        raise ValueError(f"grouped_mm_nvfp4: {name}: an NVFP4Tensor carries its scales: pass {name}_scale and "
                         f"{name}_global as None")
    if not getattr(value, "is_swizzled_scales", True):
        raise ValueError(f"grouped_mm_nvfp4: {name}: an NVFP4Tensor with unswizzled scales: make it with "
                         "is_swizzled_scales=True (the 128x4-blocked layout)")
    return value.qdata, value.scale, value.per_tensor_scale


def plain_eager(*tensors) -> bool:
    """Whether a call may skip the torch op's dispatch (in eager mode most of a call's host time): nothing
    traces it (torch.compile, a torch function or dispatch mode such as fake tensors'), every tensor is a plain
    torch.Tensor and none asks for gradients. The op runs the same computation either way."""
    if torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled() or _get_current_dispatch_mode():
        return False
    for t in tensors:
        if t is not None and (type(t) is not torch.Tensor or t.requires_grad):
            return False
    return True


def grouped_mm_nvfp4(a: torch.Tensor, b: torch.Tensor, a_scale: Optional[torch.Tensor],
                     b_scale: Optional[torch.Tensor], offs: torch.Tensor, *, a_global: Optional[torch.Tensor] = None,
                     b_global: Optional[torch.Tensor] = None, out_dtype: Optional[torch.dtype] = None,
                     out: Optional[torch.Tensor] = None, validate: bool = False) -> torch.Tensor:
    """out[t] = alpha_g * dequant(a[t]) @ dequant(b[g])^T for the rows t of group g (the module docstring has
    the layout); ValueError naming the argument for anything malformed, before anything runs. Returns `out`
    (a new (T, N) tensor of `out_dtype`, default bf16, when None). `a` or `b` may be a torchao NVFP4Tensor made
    with is_swizzled_scales=True: its scales and per-tensor scale are used (pass that scale as None)."""
    a, a_scale, a_global = unpack_nvfp4_tensor(a, a_scale, a_global, "a")
    b, b_scale, b_global = unpack_nvfp4_tensor(b, b_scale, b_global, "b")
    if out_dtype is None:
        out_dtype = out.dtype if isinstance(out, torch.Tensor) else torch.bfloat16
    problem = Problem.checked(a, b, a_scale, b_scale, offs, a_global, b_global, out_dtype, out, validate)
    if validate:  # this routing checked on the host: a_scale may be as short as its blocks (torch's tests')
        check_offsets(offs, problem.tokens, a_scale, problem.width)
    if validate or plain_eager(a, b, a_scale, b_scale, offs, a_global, b_global, out):
        if out is None:
            out = problem.new_output()
        run(problem, a, a_scale, b_scale, offs, a_global, b_global, out)
        return out
    if out is None:
        return torch.ops.nvfp4_group_gemm.grouped_mm_nvfp4(a, b, a_scale, b_scale, offs, a_global, b_global,
                                                           out_dtype)
    torch.ops.nvfp4_group_gemm.grouped_mm_nvfp4_out(a, b, a_scale, b_scale, offs, a_global, b_global, out)
    return out


# ---- quantization, for tests and examples ------------------------------------------------------------------------
E2M1_MAX, E4M3_MAX = 6.0, 448.0


def quantize_nvfp4(x: torch.Tensor, global_scale: Optional[torch.Tensor] = None):
    """(R, K) float -> (R, K/2) packed E2M1 (uint8) and (R, K/16) E4M3 scale factors, NVFP4's recipe: each
    16-element block's scale is amax / 6 (divided by `global_scale`, the tensor's fp32 decode scale, when
    given), rounded to E4M3; each element is rounded to the nearest E2M1 value (ties to the even code)."""
    rows, k = x.shape
    blocks = x.float().reshape(rows, k // SF_VEC_SIZE, SF_VEC_SIZE)
    amax = blocks.abs().amax(-1)
    decode_scale = 1.0 if global_scale is None else global_scale.float()
    # at least E4M3's smallest normal value (2^-6), as torchao's quantizer: a block of zeros gets it too
    scales = (amax / E2M1_MAX / decode_scale).clamp(min=torch.finfo(torch.float8_e4m3fn).tiny, max=E4M3_MAX)
    scales = scales.to(torch.float8_e4m3fn)
    block_scale = scales.float() * decode_scale
    scaled = blocks / block_scale.unsqueeze(-1)
    code = e2m1_codes(scaled).reshape(rows, k)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    return packed, scales


# The magnitudes where E2M1's code steps up (0, 0.5, 1, 1.5, 2, 3, 4, 6: the midpoints), each with whether a
# value exactly on it rounds up: ties go to the even code
E2M1_STEPS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_codes(scaled: torch.Tensor) -> torch.Tensor:
    """Each value's E2M1 code (uint8): the nearest of the eight magnitudes (saturating at 6; NaN to 0), ties to
    the even code, and the sign bit of -0 and of values rounded to 0 too, as torchao. The kernels
    (token_quantizer.py) count the same steps."""
    magnitude = scaled.abs()
    code = torch.zeros(scaled.shape, dtype=torch.uint8, device=scaled.device)
    for step, up_on_tie in E2M1_STEPS:
        code += (magnitude >= step) if up_on_tie else (magnitude > step)
    return code | (torch.signbit(scaled).to(torch.uint8) << 3)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """(R, K/16) E4M3 scale factors -> the 128x4-blocked layout, (round_up(R, 128), round_up(K/16, 4)) bytes
    with zero padding (scale_offsets' order)."""
    rows, cols = scales.shape
    padded = torch.zeros(round_up(rows, BLOCK_ROWS), round_up(cols, 4), dtype=torch.uint8, device=scales.device)
    padded[:rows, :cols] = scales.view(torch.uint8)
    r, c = padded.shape
    blocked = padded.view(r // 128, 4, 32, c // 4, 4).permute(0, 3, 2, 1, 4).reshape(r, c)
    return blocked.view(torch.float8_e4m3fn)


def quantize_tokens(x: torch.Tensor, offs: torch.Tensor, global_scale: Optional[torch.Tensor] = None,
                    rows: Optional[int] = None):
    """Sorted tokens (T, K) and their groups' ends -> a (T, K/2) and a_scale: each group's scale factors
    blocked from row P_g, then zero rows up to `rows` (default: the worst case for T and E, as vLLM's and
    torchao's stacked quantizers pad; P_E: the blocks alone, as torch's tests concatenate them). Reads offs
    on the host: for tests and examples."""
    packed, scales = quantize_nvfp4(x, global_scale)
    width = scale_width(x.shape[1])
    ends = offs.tolist()
    blocks = [to_blocked(scales[start:end]) for start, end in zip([0] + ends[:-1], ends) if end > start]
    used = sum(block.shape[0] for block in blocks)
    rows = worst_case_scale_rows(x.shape[0], len(ends)) if rows is None else rows
    tail = torch.zeros(max(rows - used, 0), width, dtype=torch.float8_e4m3fn, device=x.device)
    return packed, torch.cat(blocks + [tail])


def quantize_experts(w: torch.Tensor, global_scale: Optional[torch.Tensor] = None):
    """Stacked weights (E, N, K) -> b (E, N, K/2) and b_scale (E, round_up(N, 128), round_up(K/16, 4))."""
    def decode_scale(x: int):
        return None if global_scale is None else global_scale if global_scale.dim() == 0 else global_scale[x]
    pairs = [quantize_nvfp4(w[x], decode_scale(x)) for x in range(w.shape[0])]
    return torch.stack([p for p, _ in pairs]), torch.stack([to_blocked(s) for _, s in pairs])
