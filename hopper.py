"""NVFP4 block-scaled grouped GEMM for Hopper (sm_90a): the same operation and
input contract as `submission.py` (TASK.md), for the H100 and H200.

Hopper has no FP4 tensor-core instruction, so the kernel dequantizes:

    C[m, n] = fp16( sum_k a(m,k) sfa(m,k/16) b(n,k) sfb(n,k/16) )

The default form (`weights_in_registers`, SM90_CONFIG) runs two kernels:

- Token pre-pass (`convert_tokens`): every group's A (the tokens, M <= a few
  hundred rows) once per call to fp16, scaled, into scratch after the CTAs'
  tensormaps (`scratch_address`, sized by `Sm90TileConfig.scratch_bytes` on
  the host). It lets the GEMM launch at once (programmatic dependent launch);
  the GEMM's producer waits for its end before the first copy.
- GEMM, per 128 x 128 tile of C: a producer warp streams the tile's fp16
  tokens and packed FP4 weights B (TMA through per-CTA descriptors rewritten
  when the CTA moves to another group, as the B200 kernel does) and SFB (a
  bulk copy: in the blocked layout the scale factors of 128 rows x 64 K are
  512 contiguous bytes) into `num_ab_stages` stages of `tile_k` K. Each of
  two MMA warpgroups dequantizes its 64 rows of B straight into wgmma's A
  register fragments and multiplies them by the stage's tokens (wgmma
  m64 n128 k16, fp16 in, fp32 accumulate): the transposed tile C^T, so no
  thread writes an fp16 operand to shared memory. Two register buffers: a
  stage converts while the previous stage's wgmma runs.

The other forms in SM90_CONFIGS (kept to time against, `eval.py sweep`)
dequantize both operands inside the CTA: A into registers (RS) or fp16 shared
memory (SS) and B into fp16 shared memory, by the MMA warpgroups in lockstep
(optionally helped by a B-only third warpgroup), or by two converter
warpgroups feeding two MMA warpgroups (`warp_specialized`, optionally after
the token pre-pass).

- The conversion: an E2M1 nibble n placed as the fp16 bit pattern
  (n & 8) << 12 | (n & 7) << 9 is value * 2^-14 (zero, subnormal 0.5 and
  normal values alike), and one `mul.rn.f16x2` by fp16(scale) * 2^7 makes
  value * scale * 2^-7, exactly (at most 5 significant bits, magnitudes
  2^-17 .. 21). The product of two such operands is the true product * 2^-14;
  the epilogue multiplies the fp32 accumulator by 2^14 (exact) and rounds to
  fp16. Each packed 32-bit word (8 consecutive K) yields its fp16 pairs in the
  K order (0,4), (1,5), (2,6), (3,7); both operands (registers, shared memory
  or the pre-pass's scratch) use the same order, which leaves every dot
  product unchanged.

Persistent: min(tiles, SMs) CTAs walk the tiles of all groups with the B200
kernel's scheduler (`submission.locate_tile`), on the same run-time tables and
host path (`submission.GroupedGemmLauncher`).

Warps and pipelines of the default form (`WarpRoles`, checked at import):
  warps 0-7   MMA warpgroups 0 and 1: convert B rows 64w .. 64w + 63, wgmma,
              epilogue (direct stores of C^T's values)
  warp 8      producer: TMA tokens and B, bulk-copy SFB
  ab  PipelineTmaAsync, `num_ab_stages` stages: producer (1 arrive + the
      stage's transaction bytes) -> consumers (one arrive per MMA warp, lane 0,
      once the wgmma reading the stage is done)
The lockstep forms add named barrier 1 (every consumer thread, once per
stage); the warp-specialized form an fp16 ring (PipelineAsync: every
converter thread fills, every MMA thread releases).
"""
import dataclasses
import functools
import os
from typing import NamedTuple, Optional, Tuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cute.runtime import make_fake_stream, make_ptr

import submission
from submission import (BYTES_PER_TENSORMAP, PTR_ALIGN_BYTES, SF_VEC_SIZE, TENSORMAP_I64_PER_CTA, TileConfig,
                        check_budget, locate_tile, publish_tensormaps)

# =============================================================================
# Configuration
# =============================================================================
TILE_M = 128  # two consumer warpgroups: wgmma M = 64 each
TILE_N = 128
SF_BLOCK_BYTES = 512  # blocked layout: the scale factors of 128 rows x 64 K


@dataclasses.dataclass(frozen=True)
class Sm90TileConfig(TileConfig):
    """The launcher's TileConfig plus the Hopper kernel's form: K per stage,
    where A is converted to, which warps convert, the token pre-pass, and
    whether the weights (B) go into registers instead (the default form)."""
    tile_k: int = 128  # 64 or 128: one or two 512-byte scale-factor blocks per operand and stage
    a_in_registers: bool = False  # A dequantized into wgmma's register fragments (RS) instead of shared memory
    converter_warpgroups: int = 0  # extra warpgroups that only dequantize B (0 or 1)
    # Two converter warpgroups dequantize A and B into a ring of fp16 stages that two
    # MMA-only warpgroups consume (mbarrier pipeline, no per-stage named barrier).
    warp_specialized: bool = False
    # The tokens (A) converted once per call by a pre-pass kernel into fp16 scratch
    # after the tensormaps, then loaded by TMA (warp-specialized: converters do B).
    tokens_prepass: bool = False
    # Token pre-pass form without converter warps: each MMA warpgroup dequantizes its
    # 64 rows of B (the weights) into wgmma's register fragments, which multiply the
    # TMA stage's fp16 tokens (wgmma N = mma_m tokens): a transposed tile C^T, and no
    # fp16 operand written to shared memory by threads.
    weights_in_registers: bool = False
    # Weights in registers: the packed B stage arrives in TMA's 32- or 64-byte swizzle (its
    # row width at 64 or 128 K), so that the 8 rows one fragment load of a warp reads fall
    # in different banks (unswizzled, rows 32 or 64 bytes apart share banks 2- or 4-way).
    swizzle_packed_b: bool = False
    # Timing experiments only (`eval.py sweep --diagnose`; wrong results): "skip-convert"
    # leaves the fp16 operands unconverted, "skip-mma" issues no wgmma, "alu-only"
    # replaces the conversion by as many register-only integer operations, "skip-a"
    # converts B only (what converting the tokens once per call would leave); with the
    # weights in registers "skip-tokens" loads no tokens, "skip-prepass" runs no pre-pass.
    diagnostic: str = ""

    @property
    def tile_mnk(self):
        return (self.mma_m, self.mma_n, self.tile_k)

    def scratch_bytes(self, problem_sizes) -> int:
        """The token pre-pass's fp16 A of every group, back to back."""
        return sum(m * k * 2 for m, _, k, _ in problem_sizes) if self.tokens_prepass else 0


# The configurations `eval.py sweep` times side by side (us for benchmarks 0-3,
# one H200 run, against torch._grouped_mm on pre-dequantized bf16 at
# 198/130/49/26): k128-wr (SM90_CONFIG) 163/112/40/22, k64-wr 162/112/40/22,
# k64-ws-pre 191/142/48/29, k64-ws 229/160/53/29, k64-rs-3wg 250/176/56/30,
# k64-rs 232/164/52/29, k64 230/164/52/29. Dropped after measuring: k128 (the
# first design), k128-rs (spills under DSL 4.5.2), two CTAs per SM at k64, 256
# tokens per tile with the weights in registers (spills: 128 accumulator
# registers), 256 weight rows in four warpgroups (17 warps cap registers at 96),
# 192 tokens per tile at 128 K (ptxas serializes the wgmma). Compiled clean, not yet
# timed on a GPU: k64 at 192 tokens per tile (fewer conversions per weight, more
# padding), and k128-wr-sw (the packed weights in TMA's swizzle: no bank conflicts in
# the fragment loads).
# The diagnostics (README, "The Hopper kernel") show conversion and wgmma adding
# up rather than overlapping in the in-CTA forms.
SM90_CONFIGS = {c.name: c for c in (
    Sm90TileConfig("sm90-128x128-k64-wr", TILE_M, TILE_N, False, tile_k=64, tokens_prepass=True,
                   weights_in_registers=True),
    Sm90TileConfig("sm90-128x128-k128-wr", TILE_M, TILE_N, False, tile_k=128, tokens_prepass=True,
                   weights_in_registers=True),
    Sm90TileConfig("sm90-192x128-k64-wr", 192, TILE_N, False, tile_k=64, tokens_prepass=True,
                   weights_in_registers=True),
    Sm90TileConfig("sm90-128x128-k128-wr-sw", TILE_M, TILE_N, False, tile_k=128, tokens_prepass=True,
                   weights_in_registers=True, swizzle_packed_b=True),
    Sm90TileConfig("sm90-128x128-k64-ws-pre", TILE_M, TILE_N, False, tile_k=64, warp_specialized=True,
                   tokens_prepass=True),
    Sm90TileConfig("sm90-128x128-k64-ws", TILE_M, TILE_N, False, tile_k=64, warp_specialized=True),
    Sm90TileConfig("sm90-128x128-k64-rs-3wg", TILE_M, TILE_N, False, tile_k=64, a_in_registers=True,
                   converter_warpgroups=1),
    Sm90TileConfig("sm90-128x128-k64-rs", TILE_M, TILE_N, False, tile_k=64, a_in_registers=True),
    Sm90TileConfig("sm90-128x128-k64", TILE_M, TILE_N, False, tile_k=64),
)}
SM90_CONFIG = SM90_CONFIGS["sm90-128x128-k128-wr"]
# Timing experiments (`eval.py sweep --diagnose`; see Sm90TileConfig.diagnostic).
SM90_DIAGNOSTICS = tuple(dataclasses.replace(config, name=f"{config.name}-{what}", diagnostic=what)
                         for config, what in ((SM90_CONFIG, "skip-convert"), (SM90_CONFIG, "skip-mma"),
                                              (SM90_CONFIG, "alu-only"), (SM90_CONFIG, "skip-a"),
                                              (SM90_CONFIGS["sm90-128x128-k64-ws"], "skip-a"))
                     + tuple((SM90_CONFIGS["sm90-128x128-k128-wr"], what) for what in (
                         "skip-convert", "skip-mma", "skip-tokens", "skip-prepass")))

MMA_WARPGROUPS = TILE_M // 64  # warpgroups 0 and 1: wgmma M = 64 each
CONSUMER_BARRIER_ID = 1  # every consumer warpgroup: fp16 stage written, own wgmma done
NUM_F16_BUFFERS = 2
PREPASS_THREADS = 256  # token pre-pass: threads per block
PREPASS_BLOCKS_PER_CTA = 4  # token pre-pass: blocks per GEMM CTA (grid-stride over 32-K chunks)
TOKEN_CHUNK_K = 32  # token pre-pass: K per thread and chunk (4 packed words, 2 scale factors)
NUM_F16_STAGES_WS = 4  # warp-specialized: the converters run up to 4 stages ahead of the wgmma
SMEM_CAPACITY = 232448  # sm_90: 227 KiB per block
SMEM_PER_SM = 233472  # 228 KiB, shared by the CTAs of an SM
SMEM_RESERVED = 1024  # per CTA
REGISTERS_PER_SM = 65536
SCHEDULERS_PER_SM = 4  # warp schedulers, each with a quarter of the register file
NUM_TENSORMAPS = 2  # A, B (of the five slots the host's workspace has per CTA)
ACC_SCALE = 16384.0  # 2^14: undoes the 2^-7 of each dequantized operand

F16X2_128 = 0x58005800  # fp16 128.0 in both halves
A_FRAGMENT_LAYOUT = "((4,8,4),(2,2,2)):((128,1,16),(64,8,512))"  # wgmma m64k16 A in registers, (m + 64 k)


class WarpRoles(NamedTuple):
    """Warps of one configuration: consumer warpgroups first (the MMA ones,
    then the converters), the producer warp last."""
    consumer_warpgroups: int
    consumer_warps: int  # warps 0 .. consumer_warps - 1
    producer_warp: int
    threads: int
    consumer_threads: int  # named barrier CONSUMER_BARRIER_ID (lockstep forms)
    ab_consumer_arrives: int  # PipelineTmaAsync: lane 0 of each warp that converts
    b_rows: Tuple[Tuple[int, int], ...]  # per converting warpgroup: (first, count) of B's 128 rows
    f16_arrives: int  # warp-specialized: fp16 ring, every converter thread (full), every MMA thread (empty)


def warp_roles(config: "Sm90TileConfig") -> WarpRoles:
    if config.weights_in_registers:
        # warps 0-7: MMA warpgroup w converts B rows 64w .. 64w + 63 and multiplies them
        groups = MMA_WARPGROUPS
        return WarpRoles(groups, 4 * groups, 4 * groups, 32 * (4 * groups + 1), 0, 4 * groups,
                         ((0, 64), (64, 64)), 0)
    if config.warp_specialized:
        # warps 0-7 MMA, 8-15 converters (A and B rows 64c .. 64c + 63 for converter c);
        # with the token pre-pass the MMA warps also release TMA stages (their fp16 A)
        groups = 2 * MMA_WARPGROUPS
        ab_arrives = 4 * MMA_WARPGROUPS * (2 if config.tokens_prepass else 1)
        return WarpRoles(groups, 4 * groups, 4 * groups, 32 * (4 * groups + 1), 0, ab_arrives,
                         ((0, 64), (64, 64)), 128 * MMA_WARPGROUPS)
    groups = MMA_WARPGROUPS + config.converter_warpgroups
    # B's rows: split evenly between MMA warpgroups, or half to the converter
    # warpgroup and a quarter to each MMA warpgroup (which also converts its A).
    b_rows = ((0, 64), (64, 64)) if groups == 2 else ((0, 32), (32, 32), (64, 64))
    return WarpRoles(groups, 4 * groups, 4 * groups, 32 * (4 * groups + 1), 128 * groups, 4 * groups, b_rows, 0)


def check_warp_roles() -> None:
    """Arrive counts, barriers and row splits against the warp layout, at
    import (a mismatch would hang a GPU, so it must fail here)."""
    for config in SM90_CONFIGS.values():
        roles = warp_roles(config)
        assert config.converter_warpgroups in (0, 1), config
        # only the weights' fragment loads read a swizzled packed stage
        assert config.weights_in_registers or not config.swizzle_packed_b, config
        assert roles.producer_warp == roles.consumer_warps == 4 * roles.consumer_warpgroups
        assert roles.threads == 32 * (roles.consumer_warps + 1)
        if config.weights_in_registers:
            assert config.tokens_prepass, config
            assert not (config.warp_specialized or config.a_in_registers or config.converter_warpgroups), config
            assert roles.consumer_warpgroups == MMA_WARPGROUPS == TILE_N // 64, config
            assert roles.ab_consumer_arrives == roles.consumer_warps, config  # every warp releases its stage
            # the tokens are wgmma's N: a multiple of 8 up to 256; the pre-pass's 128-row items need none
            assert config.mma_n == TILE_N and config.mma_m % 8 == 0 and 8 <= config.mma_m <= 256, config
        elif config.warp_specialized:
            # converters: warpgroups 2, 3 (TMA stages: one arrive per warp; fp16 ring: every
            # thread); MMA: warpgroups 0, 1 (fp16 ring: every thread releases)
            assert not config.a_in_registers and config.converter_warpgroups == 0, config
            assert roles.ab_consumer_arrives == (roles.consumer_warps if config.tokens_prepass
                                                 else roles.consumer_warps // 2)
            assert roles.f16_arrives == 128 * MMA_WARPGROUPS and len(roles.b_rows) == MMA_WARPGROUPS
        else:
            assert not config.tokens_prepass, config
            assert roles.ab_consumer_arrives == roles.consumer_warps
            assert roles.consumer_threads == 32 * roles.consumer_warps
            assert len(roles.b_rows) == roles.consumer_warpgroups
        covered = sorted(r for first, count in roles.b_rows for r in range(first, first + count))
        assert covered == list(range(TILE_N)), config  # every B row converted once
        # dequantize_rows: a warpgroup's 128 threads cover 128 / (tile_k / 16) rows per pass
        rows_per_pass = 128 // (config.tile_k // 16)
        assert all(count % rows_per_pass == 0 for _, count in roles.b_rows), config
        assert config.tile_k in (64, 128) and SF_VEC_SIZE == 16, config
        assert config.weights_in_registers or (config.mma_m, config.mma_n) == (TILE_M, TILE_N), config
        assert config.converter_warpgroups == 0 or config.a_in_registers, config


def smem_budget(config: Sm90TileConfig) -> int:
    """Shared memory one CTA may use so that `ctas_per_sm` CTAs fit an SM."""
    return min(SMEM_CAPACITY, SMEM_PER_SM // config.ctas_per_sm - SMEM_RESERVED)


def register_budget(config: Sm90TileConfig) -> int:
    """Registers per thread that let `ctas_per_sm` CTAs fit an SM: each of the
    SM's four schedulers has a quarter of the register file for the warps it
    holds (warp w of a CTA goes to scheduler w % 4), allocated in units of 8
    per thread. Nine warps (two warpgroups and a producer) put three on one
    scheduler: 168 registers, which is what ptxas caps them at."""
    warps = (warp_roles(config).threads // 32) * config.ctas_per_sm
    warps_per_scheduler = -(-warps // SCHEDULERS_PER_SM)
    return REGISTERS_PER_SM // SCHEDULERS_PER_SM // (32 * warps_per_scheduler) // 8 * 8


check_warp_roles()


# =============================================================================
# Dequantization: E2M1 pairs and E4M3 scales to fp16 with inline PTX
# =============================================================================
def _asm(result_types, args, ptx: str, constraints: str):
    return llvm.inline_asm(result_types, [a.ir_value() for a in args], ptx, constraints,
                           has_side_effects=False, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT)


def _pair_ptx(j: int, packed: str, scale: str, out: str) -> str:
    """PTX for the fp16 pair (j, j + 4) of the eight E2M1 nibbles in `packed`,
    times `scale`, into `out`: sign bits from the word shifted left by 12 - 4j,
    magnitude bits from it shifted left by 9 - 4j (right by 3 for j = 3). Left
    shifts can go to the multiply-add pipe, leaving two logic operations per
    pair on the integer pipe, which the conversion otherwise fills first."""
    sign = f"mov.b32 a, {packed};" if j == 3 else f"shl.b32 a, {packed}, {12 - 4 * j};"
    magnitude = f"shr.b32 b, {packed}, 3;" if j == 3 else f"shl.b32 b, {packed}, {9 - 4 * j};"
    return (f"{sign}\n\t{magnitude}\n\tand.b32 a, a, 0x80008000;\n\tand.b32 b, b, 0x0E000E00;\n\t"
            f"or.b32 x, a, b;\n\tmul.rn.f16x2 {out}, x, {scale};\n\t")


PAIR_REGISTERS = "{\n\t.reg .b32 a, b, x;\n\t"
DEQUANT_WORD_PTX = PAIR_REGISTERS + "".join(_pair_ptx(j, "$4", "$5", f"${j}") for j in range(4)) + "}"
DEQUANT_PAIR_PTX = PAIR_REGISTERS + _pair_ptx(3, "$1", "$2", "$0") + "}"


@cute.jit
def scale_f16x2(scales: cutlass.Uint32, index: int) -> cutlass.Uint32:
    """fp16(E4M3 scale) * 2^7 in both halves of a 32-bit word, for byte
    `index` (0..3) of `scales` (a word of four scale factors, or one in byte 0)."""
    selector = index | (index << 4)  # byte `index` into bytes 0 and 1
    return cutlass.Uint32(_asm(
        cutlass.Uint32.mlir_type, [scales],
        "{\n\t.reg .b16 h;\n\t.reg .b32 d, s, c;\n\t"
        f"prmt.b32 d, $1, 0, {selector};\n\t"
        "cvt.u16.u32 h, d;\n\t"
        "cvt.rn.f16x2.e4m3x2 s, h;\n\t"
        f"mov.b32 c, {F16X2_128};\n\t"
        "mul.rn.f16x2 $0, s, c;\n\t}",
        "=r,r"))


@cute.jit
def dequant_word(packed: cutlass.Uint32, scale: cutlass.Uint32):
    """Eight E2M1 values (one 32-bit word, K ascending from the low nibble)
    times the scale: four f16x2 words, K pairs (0,4), (1,5), (2,6), (3,7)
    (`_pair_ptx`)."""
    out = _asm(llvm.StructType.get_literal([cutlass.Uint32.mlir_type] * 4), [packed, scale],
               DEQUANT_WORD_PTX, "=r,=r,=r,=r,r,r")
    return tuple(cutlass.Uint32(llvm.extractvalue(cutlass.Uint32.mlir_type, out, [i])) for i in range(4))


@cute.jit
def dequant_pair(packed: cutlass.Uint32, scale: cutlass.Uint32) -> cutlass.Uint32:
    """The fp16 pair of the nibbles at bits 12-15 and 28-31 of `packed`, times
    the scale (`dequant_word`'s arithmetic for one pair)."""
    return cutlass.Uint32(_asm(cutlass.Uint32.mlir_type, [packed, scale], DEQUANT_PAIR_PTX, "=r,r,r"))


def scratch_address(tensormaps: cute.Tensor, num_ctas):
    """Where a launch's scratch starts: after its CTAs' tensormaps in the
    per-stream workspace (`submission.StreamResources.workspace_for`)."""
    return tensormaps.iterator.toint() + cutlass.Int64(num_ctas) * (TENSORMAP_I64_PER_CTA * 8)


def token_scale_offset(row, k0, k):
    """Byte offset, in a group's reordered SFA, of the two scale factors of
    K k0 .. k0 + 31 (k0 a multiple of 32) of `row`: consecutive bytes."""
    return (row // 128 * (k // 64) + k0 // 64) * SF_BLOCK_BYTES + sf_offset(row % 128, k0 % 64 // 16)


def packed_column(row, kb, row_bytes: int, swizzle_bits: int):
    """Where 8-byte block `kb` of `row` sits in a packed stage of `row_bytes`
    per row (the stage on a 1024-byte boundary): at `kb`, or in TMA's swizzle
    (CuTe Swizzle<swizzle_bits, 4, 3> on byte offsets: the 16-byte chunk index
    XORed with bits 7 .. 7 + swizzle_bits - 1 of the offset, which for rows of
    32 or 64 bytes come from the row alone). Python ints or DSL integers."""
    if swizzle_bits == 0:
        return kb
    row_shift = 7 - (row_bytes.bit_length() - 1)  # row * row_bytes >> 7 == row >> row_shift
    return kb ^ (((row >> row_shift) & ((1 << swizzle_bits) - 1)) << 1)


def sf_offset(row, kb):
    """Byte offset of the scale factor of `row` (0..127 within its 128-row
    block) and 16-K block `kb` (0..tile_k/16 - 1 within the stage) in a
    stage's scale factors (512 bytes per 64 K) of the blocked layout:
    [K/64 block][row % 32][row / 32][kb % 4]."""
    return (kb // 4) * SF_BLOCK_BYTES + (row % 32) * 16 + (row // 32) * 4 + kb % 4


# =============================================================================
# The kernel
# =============================================================================
class SmemLayouts(NamedTuple):
    a_packed: cute.Layout  # (TILE_M, K/2 bytes, STAGE)
    b_packed: cute.Layout  # (TILE_N, K/2 bytes, STAGE), as threads index it
    b_packed_tma: object  # the same, swizzled where TMA swizzles it (swizzle_packed_b)
    sf: cute.Layout  # (sf_stage_bytes, STAGE), SFA and SFB each
    a16: cute.ComposedLayout  # (TILE_M, tile_k, STAGE) fp16, wgmma's K-major swizzle
    b16: cute.ComposedLayout  # (TILE_N, tile_k, STAGE)


class Sm90GroupedGemmKernel:
    """Persistent grouped NVFP4 GEMM for sm_90a (see the module docstring)."""

    def __init__(self, config: Sm90TileConfig = SM90_CONFIG):
        self.config = config
        self.tile_k = config.tile_k
        self.tile_mnk = config.tile_mnk
        self.tile_m, self.tile_n = config.mma_m, config.mma_n  # the scheduler's tile of C (M x N)
        self.packed_k_bytes = self.tile_k // 2  # per row and stage
        # swizzle_packed_b: TMA's swizzle of 16-byte chunks within 2^bits-chunk rows (32 or 64 bytes)
        self.b_swizzle_bits = (self.packed_k_bytes // 16).bit_length() - 1 if config.swizzle_packed_b else 0
        self.sf_stage_bytes = SF_BLOCK_BYTES * self.tile_k // 64  # per operand and stage
        self.smem_budget = smem_budget(config)
        self.roles = warp_roles(config)
        self.num_f16_stages = NUM_F16_STAGES_WS if config.warp_specialized else NUM_F16_BUFFERS

    def _setup_attributes(self):
        # fp16 written by threads (the token pre-pass's fp16 A is in the TMA stages)
        f16_rows = TILE_N if self.config.a_in_registers or self.config.tokens_prepass else TILE_M + TILE_N
        f16_bytes = 0 if self.config.weights_in_registers else f16_rows * self.tile_k * 2 * self.num_f16_stages
        mbarriers = 2 * 8 * (8 + self.num_f16_stages)  # full and empty, 8 TMA stages at most
        free = self.smem_budget - NUM_TENSORMAPS * BYTES_PER_TENSORMAP - mbarriers - f16_bytes
        self.num_ab_stages = min(8, free // self.stage_bytes())
        check_budget(self.config.name, "A/B stages (at least 2)", 2, self.num_ab_stages)

    def make_tiled_mma(self):
        """wgmma's A x B^T: A (M) x B (N) of the CTA tile, or with the weights
        in registers B (its 128 rows: wgmma's A, from registers) x A (the
        tokens: wgmma's N)."""
        fragment_a = self.config.a_in_registers or self.config.weights_in_registers
        source = warpgroup.OperandSource.RMEM if fragment_a else warpgroup.OperandSource.SMEM
        rows, cols = (TILE_N, self.tile_m) if self.config.weights_in_registers else (TILE_M, TILE_N)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            cutlass.Float16, cutlass.Float16, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
            cutlass.Float32, (rows // 64, 1, 1), tiler_mn=(64, cols), a_source=source)
        if fragment_a:
            # dequantize_a_fragment writes this thread-value layout of A (m + 64 k): thread
            # (lane % 4, lane / 4, warp) at k = 2 (lane % 4), m = lane / 4 + 16 warp; values
            # (k + 1, m + 8, k + 8): fp16 pairs of consecutive K, rows r and r + 8, K and K + 8.
            if str(tiled_mma.tv_layout_A) != A_FRAGMENT_LAYOUT:
                raise ValueError(f"{self.config.name}: wgmma's A register layout is {tiled_mma.tv_layout_A}, "
                                 f"dequantize_a_fragment writes {A_FRAGMENT_LAYOUT}")
        return tiled_mma

    def make_layouts(self) -> SmemLayouts:
        """Shared-memory layouts (static; made where they are used, host or device)."""
        stages, width = self.num_ab_stages, self.packed_k_bytes
        b_packed = cute.make_layout((TILE_N, width, stages), stride=(width, 1, TILE_N * width))
        return SmemLayouts(
            a_packed=cute.make_layout((TILE_M, width, stages), stride=(width, 1, TILE_M * width)),
            b_packed=b_packed,
            b_packed_tma=(cute.make_composed_layout(cute.make_swizzle(self.b_swizzle_bits, 4, 3), 0, b_packed)
                          if self.b_swizzle_bits else b_packed),
            sf=cute.make_layout((self.sf_stage_bytes, stages)),
            # fp16 A: the converters' ring, or with the token pre-pass the TMA stages (tile_m rows)
            a16=sm90_utils.make_smem_layout_a(
                utils.LayoutEnum.ROW_MAJOR, self.tile_mnk, cutlass.Float16,
                self.num_ab_stages if self.config.tokens_prepass else self.num_f16_stages),
            b16=sm90_utils.make_smem_layout_b(  # unused with the weights in registers
                utils.LayoutEnum.ROW_MAJOR, self.tile_mnk, cutlass.Float16, self.num_f16_stages))

    def stage_bytes(self) -> int:
        """Bytes one TMA stage receives (its transaction count)."""
        if self.config.tokens_prepass:  # fp16 A, packed B, SFB
            return self.tile_m * self.tile_k * 2 + TILE_N * self.packed_k_bytes + self.sf_stage_bytes
        return (TILE_M + TILE_N) * self.packed_k_bytes + 2 * self.sf_stage_bytes

    @staticmethod
    def _placeholder(dtype):
        """A (rows, K) global tensor of `dtype` from which a TMA atom is built
        (packed A or B as bytes, or the pre-pass's fp16 A); each CTA rewrites
        the descriptors for its groups before its first copy."""
        rows, width = cutlass.Int32(128), cutlass.Int32(128)
        return cute.make_tensor(
            cute.make_ptr(dtype, 0, cute.AddressSpace.gmem, assumed_align=PTR_ALIGN_BYTES),
            cute.make_layout((rows, width), stride=(width, 1)))

    @cute.jit
    def __call__(
        self,
        ptr_problem_sizes: cute.Pointer,  # (G, 4) Int32: M, N, K, L
        ptr_abc: cute.Pointer,  # (G, 3) Int64: A, B, C addresses
        ptr_sf: cute.Pointer,  # (G, 2) Int64: SFA, SFB addresses (reordered)
        ptr_tensormaps: cute.Pointer,  # (CTAs, 5, 16) Int64 workspace, 128-byte aligned
        num_groups: cutlass.Int32,
        total_tiles: cutlass.Int32,
        num_ctas: cutlass.Int32,
        stream,
    ):
        self._setup_attributes()
        layouts = self.make_layouts()
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        one_stage = lambda layout: cute.slice_(layout, (None, None, 0))
        if cutlass.const_expr(self.config.tokens_prepass):
            tma_atom_a, tma_a = cpasync.make_tiled_tma_atom(
                g2s, self._placeholder(cutlass.Float16), one_stage(layouts.a16), (self.tile_m, self.tile_k))
        else:
            tma_atom_a, tma_a = cpasync.make_tiled_tma_atom(
                g2s, self._placeholder(cutlass.Uint8), one_stage(layouts.a_packed), (TILE_M, self.packed_k_bytes))
        tma_atom_b, tma_b = cpasync.make_tiled_tma_atom(
            g2s, self._placeholder(cutlass.Uint8), one_stage(layouts.b_packed_tma), (TILE_N, self.packed_k_bytes))

        @cute.struct
        class SharedStorage:
            tensormaps: cute.struct.Align[
                cute.struct.MemRange[cutlass.Int64, NUM_TENSORMAPS * BYTES_PER_TENSORMAP // 8],
                BYTES_PER_TENSORMAP]
            ab_mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.num_ab_stages]
            f16_mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.num_f16_stages]  # warp-specialized only
            a16: cute.struct.Align[cute.struct.MemRange[
                cutlass.Float16, 8 if self.config.a_in_registers else cute.cosize(layouts.a16)], 1024]
            b16: cute.struct.Align[cute.struct.MemRange[
                cutlass.Float16, 8 if self.config.weights_in_registers else cute.cosize(layouts.b16)], 1024]
            a_packed: cute.struct.Align[cute.struct.MemRange[
                cutlass.Uint8, 128 if self.config.tokens_prepass else cute.cosize(layouts.a_packed)], 128]
            b_packed: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, cute.cosize(layouts.b_packed)], 1024]
            sfa: cute.struct.Align[cute.struct.MemRange[
                cutlass.Uint8, 128 if self.config.tokens_prepass else cute.cosize(layouts.sf)], 128]
            sfb: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, cute.cosize(layouts.sf)], 128]

        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()
        check_budget(self.config.name, "bytes of shared memory", self.smem_bytes, self.smem_budget)

        problem_sizes, abc_ptrs, sf_ptrs, tensormaps = submission.host_tables(
            ptr_problem_sizes, ptr_abc, ptr_sf, ptr_tensormaps, num_groups, num_ctas)
        if cutlass.const_expr(self.config.tokens_prepass and self.config.diagnostic != "skip-prepass"):
            self.convert_tokens(problem_sizes, abc_ptrs, sf_ptrs, tensormaps, num_groups, num_ctas).launch(
                grid=(1, 1, num_ctas * PREPASS_BLOCKS_PER_CTA), block=[PREPASS_THREADS, 1, 1], stream=stream)
        self.kernel(self.make_tiled_mma(), tma_atom_a, tma_a, tma_atom_b, tma_b, problem_sizes, abc_ptrs, sf_ptrs,
                    tensormaps, total_tiles).launch(
            grid=(1, 1, num_ctas), block=[self.roles.threads, 1, 1], smem=self.smem_bytes, stream=stream,
            use_pdl=self.config.tokens_prepass)

    # -------------------------------------------------------------------------
    # Device side: the dispatcher
    # -------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tiled_mma: cute.TiledMma, tma_atom_a: cute.CopyAtom, mA: cute.Tensor,
               tma_atom_b: cute.CopyAtom, mB: cute.Tensor, problem_sizes: cute.Tensor, abc_ptrs: cute.Tensor,
               sf_ptrs: cute.Tensor, tensormaps: cute.Tensor, total_tiles: cutlass.Int32):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        _, _, bidz = cute.arch.block_idx()
        _, _, grid_z = cute.arch.grid_dim()

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        ab_pipeline = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ab_mbar.data_ptr(),
            num_stages=self.num_ab_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.roles.ab_consumer_arrives),
            # "skip-tokens" (a timing diagnostic) loads no tokens
            tx_count=self.stage_bytes() - (self.tile_m * self.tile_k * 2 if self.config.diagnostic == "skip-tokens"
                                           else 0),
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        )
        tensormap_manager = utils.TensorMapManager(utils.TensorMapUpdateMode.SMEM, BYTES_PER_TENSORMAP)
        tensormap_smem = [storage.tensormaps.data_ptr() + i * (BYTES_PER_TENSORMAP // 8)
                          for i in range(NUM_TENSORMAPS)]
        tensormap_gmem = [tensormap_manager.get_tensormap_ptr(tensormaps[(bidz, i, None)].iterator)
                          for i in range(NUM_TENSORMAPS)]
        f16_pipeline = None
        if cutlass.const_expr(self.config.warp_specialized):
            f16_pipeline = pipeline.PipelineAsync.create(
                barrier_storage=storage.f16_mbar.data_ptr(),
                num_stages=self.num_f16_stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.roles.f16_arrives),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.roles.f16_arrives),
            )
        cute.arch.sync_threads()  # barriers initialized

        layouts = self.make_layouts()
        if warp_idx == self.roles.producer_warp:
            self.producer(layouts, storage, ab_pipeline, problem_sizes, abc_ptrs, sf_ptrs, total_tiles, tensormap_manager,
                          tensormap_smem, tensormap_gmem, tma_atom_a, mA, tma_atom_b, mB, bidz, grid_z,
                          scratch_address(tensormaps, grid_z))
        if cutlass.const_expr(self.config.weights_in_registers):
            if warp_idx < self.roles.producer_warp:
                self.weights_consumer(layouts, storage, ab_pipeline, tiled_mma, problem_sizes, abc_ptrs, total_tiles,
                                      tidx, bidz, grid_z)
        elif cutlass.const_expr(self.config.warp_specialized):
            if warp_idx < 4 * MMA_WARPGROUPS:
                self.mma_warpgroup(layouts, storage, ab_pipeline, f16_pipeline, tiled_mma, problem_sizes, abc_ptrs,
                                   total_tiles, tidx, bidz, grid_z)
            elif warp_idx < self.roles.producer_warp:
                self.converter(layouts, storage, ab_pipeline, f16_pipeline, problem_sizes, total_tiles, tidx, bidz,
                               grid_z)
        else:
            if warp_idx < self.roles.producer_warp:
                self.consumer(layouts, storage, ab_pipeline, tiled_mma, problem_sizes, abc_ptrs, total_tiles, tidx,
                              bidz, grid_z)

    @cute.jit
    def group_tokens(self, problem_sizes: cute.Tensor, group, scratch):
        """The token pre-pass's fp16 A (M, K) of `group`: groups back to back in `scratch`."""
        offset = cutlass.Int64(0)
        for g in cutlass.range(0, group, 1, unroll=1):
            offset = offset + cutlass.Int64(problem_sizes[g, 0]) * cutlass.Int64(problem_sizes[g, 2]) * 2
        k = problem_sizes[group, 2]
        return cute.make_tensor(
            cute.make_ptr(cutlass.Float16, scratch + offset, cute.AddressSpace.gmem, assumed_align=PTR_ALIGN_BYTES),
            cute.make_layout((problem_sizes[group, 0], k), stride=(k, 1)))

    @cute.jit
    def group_packed(self, problem_sizes: cute.Tensor, group, abc_ptrs):
        """Packed A (M, K/2) and B (N, K/2) bytes of `group`."""
        half_k = problem_sizes[group, 2] // 2

        def rows_of(address, rows):
            return cute.make_tensor(
                cute.make_ptr(cutlass.Uint8, address, cute.AddressSpace.gmem, assumed_align=PTR_ALIGN_BYTES),
                cute.make_layout((rows, half_k), stride=(half_k, 1)))
        return (rows_of(abc_ptrs[group, 0], problem_sizes[group, 0]),
                rows_of(abc_ptrs[group, 1], problem_sizes[group, 1]))

    # -------------------------------------------------------------------------
    # The producer warp (last warp; `WarpRoles.producer_warp`)
    # -------------------------------------------------------------------------
    @cute.jit
    def producer(self, layouts, storage, ab_pipeline, problem_sizes, abc_ptrs, sf_ptrs, total_tiles, tensormap_manager,
                 tensormap_smem, tensormap_gmem, tma_atom_a, mA, tma_atom_b, mB, bidz, grid_z, scratch):
        """TMA A (packed, or with the token pre-pass its fp16 copy in `scratch`)
        and B, bulk-copy SFA (not with the pre-pass) and SFB, per stage."""
        prepass = self.config.tokens_prepass
        atoms = (tma_atom_a, tma_atom_b)
        for i in cutlass.range_constexpr(NUM_TENSORMAPS):
            cpasync.prefetch_descriptor(atoms[i])
            tensormap_manager.init_tensormap_from_atom(atoms[i], tensormap_smem[i], self.roles.producer_warp)
        if cutlass.const_expr(prepass):
            sA = storage.a16.get_tensor(layouts.a16.outer, swizzle=layouts.a16.inner)
            a_tile = (self.tile_m, self.tile_k)
        else:
            sA = storage.a_packed.get_tensor(layouts.a_packed)
            a_tile = (TILE_M, self.packed_k_bytes)
        if cutlass.const_expr(self.b_swizzle_bits):
            sB = storage.b_packed.get_tensor(layouts.b_packed_tma.outer, swizzle=layouts.b_packed_tma.inner)
        else:
            sB = storage.b_packed.get_tensor(layouts.b_packed)
        sSFA = storage.sfa.get_tensor(layouts.sf)
        sSFB = storage.sfb.get_tensor(layouts.sf)
        # ((ATOM_V, REST_V), STAGE) and ((ATOM_V, REST_V), ROW_TILES, K_TILES)
        tAsA, tAgA = cpasync.tma_partition(
            tma_atom_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2),
            cute.group_modes(cute.local_tile(mA, a_tile, (None, None)), 0, 2))
        tBsB, tBgB = cpasync.tma_partition(
            tma_atom_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 2),
            cute.group_modes(cute.local_tile(mB, (TILE_N, self.packed_k_bytes), (None, None)), 0, 2))
        bulk = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), cutlass.Uint8, num_bits_per_copy=self.sf_stage_bytes * 8)

        if cutlass.const_expr(prepass):
            # launched while the pre-pass runs (programmatic dependent launch): its fp16 A is
            # complete and visible only past this wait (nothing else in the kernel reads it)
            cute.arch.griddepcontrol_wait()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_ab_stages)
        tile = bidz
        group = cutlass.Int32(0)
        group_first_tile = cutlass.Int32(0)
        loaded_group = cutlass.Int32(-1)
        while tile < total_tiles:
            group, group_first_tile, m_tile, n_tile = locate_tile(
                problem_sizes, self.tile_m, self.tile_n, tile, group, group_first_tile)
            if group != loaded_group:
                operands = self.group_packed(problem_sizes, group, abc_ptrs)
                if cutlass.const_expr(prepass):
                    operands = (self.group_tokens(problem_sizes, group, scratch), operands[1])
                publish_tensormaps(tensormap_manager, operands, atoms,
                                   tuple(tensormap_gmem), self.roles.producer_warp, tuple(tensormap_smem))
                loaded_group = group
            k = problem_sizes[group, 2]
            k_tiles = k // self.tile_k
            # Scale factors: 128-row blocks, (K/64) blocks of 512 bytes each.
            sf_row_bytes = (k // 64) * SF_BLOCK_BYTES
            sfa_base = sf_ptrs[group, 0] + (m_tile * TILE_M // 128) * sf_row_bytes
            sfb_base = sf_ptrs[group, 1] + n_tile * sf_row_bytes
            for k_tile in cutlass.range(0, k_tiles, 1, unroll=1):
                ab_pipeline.producer_acquire(state)
                barrier = ab_pipeline.producer_get_barrier(state)
                if cutlass.const_expr(self.config.diagnostic != "skip-tokens"):
                    cute.copy(tma_atom_a, tAgA[(None, m_tile, k_tile)], tAsA[(None, state.index)],
                              tma_bar_ptr=barrier, tma_desc_ptr=tensormap_manager.get_tensormap_ptr(
                                  tensormap_gmem[0], cute.AddressSpace.generic))
                cute.copy(tma_atom_b, tBgB[(None, n_tile, k_tile)], tBsB[(None, state.index)], tma_bar_ptr=barrier,
                          tma_desc_ptr=tensormap_manager.get_tensormap_ptr(tensormap_gmem[1], cute.AddressSpace.generic))
                # Bulk copies are not elected by the compiler (TMA copies are): one lane issues them.
                if cute.arch.lane_idx() == 0:
                    for base, dst in ((sfb_base, sSFB),) if prepass else ((sfa_base, sSFA), (sfb_base, sSFB)):
                        src = cute.make_tensor(
                            cute.make_ptr(cutlass.Uint8, base + k_tile * self.sf_stage_bytes, cute.AddressSpace.gmem,
                                          assumed_align=PTR_ALIGN_BYTES),
                            cute.make_layout(self.sf_stage_bytes))
                        cute.copy(bulk, src, dst[(None, state.index)], mbar_ptr=barrier)
                ab_pipeline.producer_commit(state)
                state.advance()
            tile += grid_z
        ab_pipeline.producer_tail(state)

    # -------------------------------------------------------------------------
    # Conversion helpers, and the lockstep consumer (warpgroups that convert
    # and multiply, meeting at a named barrier once per stage)
    # -------------------------------------------------------------------------
    @cute.jit
    def dequantize_rows(self, s_packed, s_sf, s16, stage, buffer, first_row, tidx, num_rows: cutlass.Constexpr = 64):
        """Rows first_row .. first_row + num_rows - 1 of stage `stage` (packed rows and
        their scale factors) into fp16 buffer `buffer`. A row has B = tile_k / 16
        blocks of 16 K (one 64-bit load, one scale factor each); thread t (of
        the warpgroup) takes block t % B of rows first_row + t / B + (128 / B) i.
        Tiles start on 128-row boundaries, so a row of the tile is also its row
        in the scale factors' 128-row block."""
        blocks_per_row = self.tile_k // 16
        rows_per_pass = 128 // blocks_per_row
        kb = tidx % blocks_per_row
        blocks = cute.recast_tensor(s_packed[(None, None, stage)], cutlass.Uint64)  # (rows, blocks_per_row)
        for i in cutlass.range_constexpr(num_rows // rows_per_pass):
            row = first_row + tidx // blocks_per_row + rows_per_pass * i
            scale = scale_f16x2(cutlass.Uint32(s_sf[(sf_offset(row, kb), stage)]), 0)
            packed = blocks[row, kb]
            frag = cute.make_rmem_tensor((16,), cutlass.Float16)
            frag32 = cute.recast_tensor(frag, cutlass.Uint32)
            for half in cutlass.range_constexpr(2):
                pairs = dequant_word(cutlass.Uint32(packed >> (32 * half)), scale)
                for j in cutlass.range_constexpr(4):
                    frag32[4 * half + j] = pairs[j]
            dst = cute.local_tile(s16[(row, None, buffer)], (16,), (kb,))
            cute.autovec_copy(frag, dst)

    @cute.jit
    def dequantize_a_fragment(self, s_packed, s_sf, frag, stage, row, lane, swizzle_bits: cutlass.Constexpr = 0):
        """This thread's wgmma A fragment (A_FRAGMENT_LAYOUT) of stage `stage`:
        rows `row` and row + 8, K pairs (2 q, 2 q + 1) + 8 j + 16 kb for q = lane % 4.
        In the K order of `dequant_word` (logical pair p of an 8-group holds
        physical K p and p + 4, as B's shared-memory stage does), that is pair q
        of each packed word: the word shifted left by 4 (3 - q), then `dequant_pair`.
        With `swizzle_bits` the stage is in TMA's swizzle: the 16-byte chunk
        index of a row is XORed with bits 7 .. 7 + swizzle_bits - 1 of the row's
        byte offset (the stage starts on a 1024-byte boundary)."""
        blocks = cute.recast_tensor(s_packed[(None, None, stage)], cutlass.Uint64)  # (rows, tile_k / 16)
        # the scale factors of a row's four 16-K blocks of one 64-K block are 4 consecutive bytes
        scale_words = cute.recast_tensor(s_sf[(None, stage)], cutlass.Uint32)  # (sf_stage_bytes / 4,)
        frag32 = cute.recast_tensor(frag, cutlass.Uint32)  # ((1, 2, 2), 1, K blocks): (row + 8, K + 8, kb)
        to_pair = cutlass.Uint32(1) << (4 * (3 - lane % 4))  # a multiply (IMAD), not a shift on the integer pipe
        for dr in cutlass.range_constexpr(2):
            r = row + 8 * dr
            for block64 in cutlass.range_constexpr(self.tile_k // 64):
                scales = scale_words[(block64 * SF_BLOCK_BYTES + sf_offset(r, 0)) // 4]
                for kb4 in cutlass.range_constexpr(4):
                    kb = 4 * block64 + kb4
                    scale = scale_f16x2(scales, kb4)
                    column = packed_column(r, kb, self.packed_k_bytes, swizzle_bits)
                    packed = blocks[r, column]  # one 8-byte load: K 16 kb .. 16 kb + 15
                    for j in cutlass.range_constexpr(2):
                        frag32[dr + 2 * j + 4 * kb] = dequant_pair(cutlass.Uint32(packed >> (32 * j)) * to_pair,
                                                                   scale)

    @cute.jit
    def dequantize_b_rows(self, sB, sSFB, sB16, stage, buffer, wg, wg_tidx):
        """This warpgroup's rows of B (`WarpRoles.b_rows`)."""
        b_rows = self.roles.b_rows
        if cutlass.const_expr(all(count == b_rows[0][1] and first == w * count
                                  for w, (first, count) in enumerate(b_rows))):
            self.dequantize_rows(sB, sSFB, sB16, stage, buffer, b_rows[0][1] * wg, wg_tidx, b_rows[0][1])
        else:
            for w in cutlass.range_constexpr(len(b_rows)):
                if wg == w:
                    self.dequantize_rows(sB, sSFB, sB16, stage, buffer, b_rows[w][0], wg_tidx, b_rows[w][1])

    @cute.jit
    def consumer(self, layouts, storage, ab_pipeline, tiled_mma, problem_sizes, abc_ptrs, total_tiles, tidx, bidz, grid_z):
        """Lockstep forms: every consumer warpgroup converts its rows of each
        stage (A into registers or fp16 shared memory, its B rows into fp16
        shared memory); the MMA warpgroups then multiply it while the next
        stage converts."""
        wg = tidx // 128
        wg_tidx = tidx % 128
        sA = storage.a_packed.get_tensor(layouts.a_packed)
        sB = storage.b_packed.get_tensor(layouts.b_packed)
        sSFA = storage.sfa.get_tensor(layouts.sf)
        sSFB = storage.sfb.get_tensor(layouts.sf)
        sB16 = storage.b16.get_tensor(layouts.b16.outer, swizzle=layouts.b16.inner)
        thr_mma = tiled_mma.get_slice(tidx)
        # (MMA, MMA_M/N, MMA_K, BUFFER); each warpgroup's A partition is its 64 rows
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB16))
        if cutlass.const_expr(self.config.a_in_registers):
            # two register buffers (MMA, MMA_M, MMA_K): one converted while the other's wgmma runs
            a_shape = thr_mma.partition_shape_A((TILE_M, self.tile_k))
            tCrA = (cute.make_rmem_tensor(a_shape, cutlass.Float16), cute.make_rmem_tensor(a_shape, cutlass.Float16))
            a_row = 64 * wg + 16 * (wg_tidx // 32) + (wg_tidx % 32) // 4  # A_FRAGMENT_LAYOUT
        else:
            sA16 = storage.a16.get_tensor(layouts.a16.outer, swizzle=layouts.a16.inner)
            tCsA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA16))  # (MMA, MMA_M, MMA_K, BUFFER)
            tCrA = (tCsA[(None, None, None, 0)], tCsA[(None, None, None, 1)])
        tCcC = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, TILE_N)))  # (m, n) of each accumulator
        acc = cute.make_rmem_tensor(tCcC.shape, cutlass.Float32)
        num_k_blocks = self.tile_k // 16
        # Always accumulate (the accumulator is zeroed per tile): the flag never
        # changes inside the run-time loops and branches.
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)

        # the timing diagnostics (Sm90TileConfig.diagnostic) leave out A's or all conversion
        convert_b = self.config.diagnostic not in ("skip-convert", "alu-only")
        convert_a = convert_b and self.config.diagnostic != "skip-a"
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_ab_stages)
        tile = bidz
        group = cutlass.Int32(0)
        group_first_tile = cutlass.Int32(0)
        burn = cutlass.Uint32(tidx)  # "alu-only" diagnostic
        while tile < total_tiles:
            group, group_first_tile, m_tile, n_tile = locate_tile(
                problem_sizes, TILE_M, TILE_N, tile, group, group_first_tile)
            # A warpgroup whose 64 rows are all past M (or a converter warpgroup)
            # converts only its rows of B; a warp whose 16 fragment rows are all
            # past M leaves its A registers as they are (they feed only rows past M).
            rows_live = (wg < MMA_WARPGROUPS) & (m_tile * TILE_M + 64 * wg < problem_sizes[group, 0])
            warp_rows_live = m_tile * TILE_M + 64 * wg + 16 * (wg_tidx // 32) < problem_sizes[group, 0]
            acc.fill(0.0)
            # K is a multiple of 256, so stages come in pairs: buffer 0, then 1
            for _ in cutlass.range(0, problem_sizes[group, 2] // (2 * self.tile_k), 1, unroll=1):
                for buffer in cutlass.range_constexpr(NUM_F16_BUFFERS):
                    ab_pipeline.consumer_wait(state)
                    if cutlass.const_expr(self.config.diagnostic == "alu-only"):
                        burn = self.integer_work(burn)
                    if cutlass.const_expr(convert_a):
                        if rows_live:
                            if cutlass.const_expr(self.config.a_in_registers):
                                if warp_rows_live:
                                    self.dequantize_a_fragment(sA, sSFA, tCrA[buffer], state.index, a_row,
                                                               wg_tidx % 32)
                            else:
                                self.dequantize_rows(sA, sSFA, sA16, state.index, buffer, 64 * wg, wg_tidx)
                    if cutlass.const_expr(convert_b):
                        self.dequantize_b_rows(sB, sSFB, sB16, state.index, buffer, wg, wg_tidx)
                    ab_pipeline.consumer_release(state)
                    # The previous stage's wgmma is done in both warpgroups (its buffers
                    # are free again) and the fp16 stage, written by threads, is visible
                    # to wgmma's async proxy, before either multiplies.
                    warpgroup.wait_group(0)
                    cute.arch.fence_proxy("async.shared", space="cta")
                    cute.arch.barrier(barrier_id=CONSUMER_BARRIER_ID, number_of_threads=self.roles.consumer_threads)
                    if rows_live:
                        if cutlass.const_expr(self.config.diagnostic != "skip-mma"):
                            warpgroup.fence()
                            for kb in cutlass.range_constexpr(num_k_blocks):
                                cute.gemm(tiled_mma, acc, tCrA[buffer][(None, None, kb)],
                                          tCrB[(None, None, kb, buffer)], acc)
                            warpgroup.commit_group()
                    state.advance()
            warpgroup.wait_group(0)
            if cutlass.const_expr(self.config.diagnostic == "alu-only"):
                if burn == cutlass.Uint32(0x2545F491):  # keeps the work alive (the epilogue stores acc)
                    acc[0] = cutlass.Float32(1.0)
            if rows_live:
                self.epilogue(acc, tCcC, problem_sizes, abc_ptrs, group, m_tile, n_tile)
            tile += grid_z

    @cute.jit
    def integer_work(self, x: cutlass.Uint32) -> cutlass.Uint32:
        """"alu-only": about the conversion's instruction count per stage
        (~200 per thread: shifts, logic, multiply-adds) on registers alone,
        in four independent chains."""
        chains = [x, x + 1, x + 2, x + 3]
        for _ in cutlass.range_constexpr(16):
            for c in cutlass.range_constexpr(4):
                chains[c] = (chains[c] * cutlass.Uint32(0x9E3779B1)) ^ (chains[c] >> 7) ^ cutlass.Uint32(c)
        return chains[0] ^ chains[1] ^ chains[2] ^ chains[3]

    # -------------------------------------------------------------------------
    # Token pre-pass (its own kernel, launched before the GEMM on the same stream)
    # -------------------------------------------------------------------------
    @cute.kernel
    def convert_tokens(self, problem_sizes: cute.Tensor, abc_ptrs: cute.Tensor, sf_ptrs: cute.Tensor,
                       tensormaps: cute.Tensor, num_groups: cutlass.Int32, num_ctas: cutlass.Int32):
        """A of every group to fp16 in the conversion's K order and scaled as
        `dequant_word` does, into the scratch (`group_tokens`). Chunks of 32 K
        of one row (16 bytes in, 64 out), numbered group by group, row-major;
        thread t of the grid takes chunks t, t + threads, ... (consecutive
        threads, consecutive chunks: coalesced). It lets the GEMM launch
        (programmatic dependent launch) at once: the GEMM's producer waits
        for this grid's end before its first copy."""
        cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        _, _, bidz = cute.arch.block_idx()
        _, _, grid_z = cute.arch.grid_dim()
        scratch = scratch_address(tensormaps, num_ctas)
        chunks_of = lambda m, k: m * (k // TOKEN_CHUNK_K)  # chunks of a group
        total = cutlass.Int32(0)
        for g in cutlass.range(0, num_groups, 1, unroll=1):
            total += chunks_of(problem_sizes[g, 0], problem_sizes[g, 2])
        chunk = bidz * PREPASS_THREADS + tidx
        group = cutlass.Int32(0)
        group_first = cutlass.Int32(0)
        offset = cutlass.Int64(0)  # bytes of fp16 A before this group's
        while chunk < total:
            m = problem_sizes[group, 0]
            k = problem_sizes[group, 2]
            while chunk >= group_first + chunks_of(m, k):
                group_first += chunks_of(m, k)
                offset += cutlass.Int64(m) * cutlass.Int64(k) * 2
                group += 1
                m = problem_sizes[group, 0]
                k = problem_sizes[group, 2]
            local = chunk - group_first
            row = local // (k // TOKEN_CHUNK_K)
            k0 = local % (k // TOKEN_CHUNK_K) * TOKEN_CHUNK_K
            self.convert_token_chunk(abc_ptrs[group, 0], sf_ptrs[group, 0], scratch + offset, row, k0, k)
            chunk += grid_z * PREPASS_THREADS

    @cute.jit
    def convert_token_chunk(self, a_address, sfa_address, out_address, row, k0, k):
        """K k0 .. k0 + 31 of A's `row`: 4 packed words and 2 scale factors in,
        16 fp16 pairs out."""
        src = cute.make_tensor(
            cute.make_ptr(cutlass.Uint32, a_address + cutlass.Int64(row) * (k // 2) + k0 // 2,
                          cute.AddressSpace.gmem, assumed_align=16), cute.make_layout(4))
        words = cute.make_rmem_tensor((4,), cutlass.Uint32)
        cute.autovec_copy(src, words)
        scales = cute.make_tensor(
            cute.make_ptr(cutlass.Uint16, sfa_address + token_scale_offset(row, k0, k), cute.AddressSpace.gmem,
                          assumed_align=2), cute.make_layout(1))
        scale_pair = cutlass.Uint32(scales[0])  # the scale factors of K k0 .. k0 + 15 and k0 + 16 .. k0 + 31
        out = cute.make_rmem_tensor((16,), cutlass.Uint32)
        for half in cutlass.range_constexpr(2):
            scale = scale_f16x2(scale_pair, half)
            for word in cutlass.range_constexpr(2):
                w = 2 * half + word
                pairs = dequant_word(words[w], scale)
                for j in cutlass.range_constexpr(4):
                    out[4 * w + j] = pairs[j]
        dst = cute.make_tensor(
            cute.make_ptr(cutlass.Uint32, out_address + (cutlass.Int64(row) * k + k0) * 2, cute.AddressSpace.gmem,
                          assumed_align=16), cute.make_layout(16))
        cute.autovec_copy(out, dst)

    # -------------------------------------------------------------------------
    # Warp-specialized form: converter warpgroups 2, 3 and MMA warpgroups 0, 1
    # -------------------------------------------------------------------------
    @cute.jit
    def converter(self, layouts, storage, ab_pipeline, f16_pipeline, problem_sizes, total_tiles, tidx, bidz, grid_z):
        """Converter c (warpgroup 2 + c): A and B rows 64c .. 64c + 63 of every
        TMA stage into the next free fp16 stage of the ring."""
        c = tidx // 128 - MMA_WARPGROUPS
        c_tidx = tidx % 128
        sA = storage.a_packed.get_tensor(layouts.a_packed)
        sB = storage.b_packed.get_tensor(layouts.b_packed)
        sSFA = storage.sfa.get_tensor(layouts.sf)
        sSFB = storage.sfb.get_tensor(layouts.sf)
        sA16 = storage.a16.get_tensor(layouts.a16.outer, swizzle=layouts.a16.inner)
        sB16 = storage.b16.get_tensor(layouts.b16.outer, swizzle=layouts.b16.inner)
        ab_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_ab_stages)
        f16_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_f16_stages)
        tile = bidz
        group = cutlass.Int32(0)
        group_first_tile = cutlass.Int32(0)
        while tile < total_tiles:
            group, group_first_tile, m_tile, n_tile = locate_tile(
                problem_sizes, TILE_M, TILE_N, tile, group, group_first_tile)
            rows_live = m_tile * TILE_M + 64 * c < problem_sizes[group, 0]  # else no wgmma reads them
            for _ in cutlass.range(0, problem_sizes[group, 2] // self.tile_k, 1, unroll=1):
                ab_pipeline.consumer_wait(ab_state)
                f16_pipeline.producer_acquire(f16_state)
                if cutlass.const_expr(self.config.diagnostic != "skip-a" and not self.config.tokens_prepass):
                    if rows_live:
                        self.dequantize_rows(sA, sSFA, sA16, ab_state.index, f16_state.index, 64 * c, c_tidx)
                self.dequantize_rows(sB, sSFB, sB16, ab_state.index, f16_state.index, 64 * c, c_tidx)
                ab_pipeline.consumer_release(ab_state)
                # fp16 stores visible to wgmma's async proxy before the stage is handed over
                cute.arch.fence_proxy("async.shared", space="cta")
                f16_pipeline.producer_commit(f16_state)
                ab_state.advance()
                f16_state.advance()
            tile += grid_z

    @cute.jit
    def mma_warpgroup(self, layouts, storage, ab_pipeline, f16_pipeline, tiled_mma, problem_sizes, abc_ptrs,
                      total_tiles, tidx, bidz, grid_z):
        """MMA warpgroup w: wgmma on A rows 64w .. 64w + 63 of each fp16 stage;
        a stage goes back to the converters once the wgmma reading it is done
        (wait_group 1 after the next one is issued). With the token pre-pass, A
        comes from the TMA stage, which goes back to the producer likewise."""
        prepass = self.config.tokens_prepass
        wg = tidx // 128
        sA16 = storage.a16.get_tensor(layouts.a16.outer, swizzle=layouts.a16.inner)
        sB16 = storage.b16.get_tensor(layouts.b16.outer, swizzle=layouts.b16.inner)
        thr_mma = tiled_mma.get_slice(tidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA16))  # (MMA, MMA_M, MMA_K, STAGE)
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB16))  # (MMA, MMA_N, MMA_K, STAGE)
        tCcC = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, TILE_N)))
        acc = cute.make_rmem_tensor(tCcC.shape, cutlass.Float32)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_f16_stages)
        release_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_f16_stages)
        ab_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_ab_stages)
        ab_release_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_ab_stages)
        tile = bidz
        group = cutlass.Int32(0)
        group_first_tile = cutlass.Int32(0)
        while tile < total_tiles:
            group, group_first_tile, m_tile, n_tile = locate_tile(
                problem_sizes, TILE_M, TILE_N, tile, group, group_first_tile)
            rows_live = m_tile * TILE_M + 64 * wg < problem_sizes[group, 0]
            acc.fill(0.0)
            for k_tile in cutlass.range(0, problem_sizes[group, 2] // self.tile_k, 1, unroll=1):
                f16_pipeline.consumer_wait(state)
                a_stage = state.index
                if cutlass.const_expr(prepass):
                    ab_pipeline.consumer_wait(ab_state)
                    a_stage = ab_state.index
                if rows_live:
                    warpgroup.fence()
                    for kb in cutlass.range_constexpr(self.tile_k // 16):
                        cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, a_stage)],
                                  tCrB[(None, None, kb, state.index)], acc)
                    warpgroup.commit_group()
                warpgroup.wait_group(1)  # the previous stage's wgmma is done
                if k_tile > 0:
                    f16_pipeline.consumer_release(release_state)
                    release_state.advance()
                    if cutlass.const_expr(prepass):
                        ab_pipeline.consumer_release(ab_release_state)
                        ab_release_state.advance()
                state.advance()
                if cutlass.const_expr(prepass):
                    ab_state.advance()
            warpgroup.wait_group(0)
            f16_pipeline.consumer_release(release_state)
            release_state.advance()
            if cutlass.const_expr(prepass):
                ab_pipeline.consumer_release(ab_release_state)
                ab_release_state.advance()
            if rows_live:
                self.epilogue(acc, tCcC, problem_sizes, abc_ptrs, group, m_tile, n_tile)
            tile += grid_z

    # -------------------------------------------------------------------------
    # Weights in registers: two MMA warpgroups, no converter warps
    # -------------------------------------------------------------------------
    @cute.jit
    def weights_consumer(self, layouts, storage, ab_pipeline, tiled_mma, problem_sizes, abc_ptrs, total_tiles, tidx,
                         bidz, grid_z):
        """Warpgroup w dequantizes rows 64w .. 64w + 63 of each TMA stage's B
        (packed weights and SFB) into wgmma A fragments and multiplies them by
        the stage's fp16 tokens: the C^T tile. Two register buffers: a stage is
        converted while the previous stage's wgmma runs; a TMA stage goes back
        to the producer once the wgmma reading it is done (wait_group 1 after
        the next one is issued)."""
        wg = tidx // 128
        wg_tidx = tidx % 128
        sB = storage.b_packed.get_tensor(layouts.b_packed)
        sSFB = storage.sfb.get_tensor(layouts.sf)
        sTokens = storage.a16.get_tensor(layouts.a16.outer, swizzle=layouts.a16.inner)
        thr_mma = tiled_mma.get_slice(tidx)
        tCsT = tiled_mma.make_fragment_B(thr_mma.partition_B(sTokens))  # (MMA, MMA_N, MMA_K, STAGE)
        w_shape = thr_mma.partition_shape_A((TILE_N, self.tile_k))  # (MMA, MMA_M, MMA_K)
        tCrW = (cute.make_rmem_tensor(w_shape, cutlass.Float16), cute.make_rmem_tensor(w_shape, cutlass.Float16))
        w_row = 64 * wg + 16 * (wg_tidx // 32) + (wg_tidx % 32) // 4  # A_FRAGMENT_LAYOUT
        tCcC = thr_mma.partition_C(cute.make_identity_tensor((TILE_N, self.tile_m)))  # (n, m) of each accumulator
        acc = cute.make_rmem_tensor(tCcC.shape, cutlass.Float32)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_ab_stages)
        release_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_ab_stages)
        tile = bidz
        group = cutlass.Int32(0)
        group_first_tile = cutlass.Int32(0)
        while tile < total_tiles:
            group, group_first_tile, m_tile, n_tile = locate_tile(
                problem_sizes, self.tile_m, self.tile_n, tile, group, group_first_tile)
            acc.fill(0.0)
            # K is a multiple of 256, so stages come in pairs: register buffer 0, then 1
            for k_pair in cutlass.range(0, problem_sizes[group, 2] // (2 * self.tile_k), 1, unroll=1):
                for buffer in cutlass.range_constexpr(2):
                    ab_pipeline.consumer_wait(state)
                    # the timing diagnostics (Sm90TileConfig.diagnostic) leave out a part
                    if cutlass.const_expr(self.config.diagnostic != "skip-convert"):
                        self.dequantize_a_fragment(sB, sSFB, tCrW[buffer], state.index, w_row, wg_tidx % 32,
                                                   self.b_swizzle_bits)
                    if cutlass.const_expr(self.config.diagnostic != "skip-mma"):
                        warpgroup.fence()
                        for kb in cutlass.range_constexpr(self.tile_k // 16):
                            cute.gemm(tiled_mma, acc, tCrW[buffer][(None, None, kb)],
                                      tCsT[(None, None, kb, state.index)], acc)
                        warpgroup.commit_group()
                    warpgroup.wait_group(1)  # the previous stage's wgmma is done: release its stage
                    if buffer == 1 or k_pair > 0:
                        ab_pipeline.consumer_release(release_state)
                        release_state.advance()
                    state.advance()
            warpgroup.wait_group(0)
            ab_pipeline.consumer_release(release_state)
            release_state.advance()
            self.epilogue(acc, tCcC, problem_sizes, abc_ptrs, group, m_tile, n_tile, transposed=True)
            tile += grid_z

    @cute.jit
    def epilogue(self, acc, tCcC, problem_sizes, abc_ptrs, group, m_tile, n_tile, transposed: cutlass.Constexpr = False):
        """acc * 2^14 to fp16 into C; `tCcC` holds each value's (m, n) in the
        tile, or (n, m) when `transposed` (the weights-in-registers tile C^T)."""
        m = problem_sizes[group, 0]
        n = problem_sizes[group, 1]
        c = cute.make_tensor(
            cute.make_ptr(cutlass.Float16, abc_ptrs[group, 2], cute.AddressSpace.gmem,
                          assumed_align=PTR_ALIGN_BYTES),
            cute.make_layout((m, n), stride=(n, 1)))
        for i in cutlass.range_constexpr(cute.size(acc)):
            row, col = tCcC[i]
            if cutlass.const_expr(transposed):
                row, col = col, row
            row = row + m_tile * self.tile_m
            if row < m:
                c[row, col + n_tile * self.tile_n] = (acc[i] * ACC_SCALE).to(cutlass.Float16)


# =============================================================================
# Compile and launch
# =============================================================================
def target_arch() -> str:
    return os.environ.get("CUTE_DSL_ARCH", "sm_90a")


@functools.lru_cache(maxsize=None)
def compile_sm90(config: Optional[Sm90TileConfig] = None, arch: Optional[str] = None):
    """(compiled, kernel), one compile per configuration and architecture
    (the launcher passes the configuration of each shape set)."""
    kernel = Sm90GroupedGemmKernel(config or SM90_CONFIG)
    return compile_kernel(kernel), kernel


def compile_kernel(kernel: Sm90GroupedGemmKernel):
    """cute.compile with placeholder arguments of the host function's types
    (the same as the B200 kernel's: `submission.host_arguments`)."""
    null = lambda dtype, align=16: make_ptr(dtype, 0, cute.AddressSpace.gmem, assumed_align=align)
    return cute.compile(
        kernel, null(cutlass.Int32), null(cutlass.Int64), null(cutlass.Int64),
        null(cutlass.Int64, BYTES_PER_TENSORMAP), cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1),
        make_fake_stream())


CONFIG_ENV = "NVFP4_SM90_CONFIG"  # a name in SM90_CONFIGS; unset: SM90_CONFIG


def launcher_options(setting: Optional[str]) -> dict:
    """GroupedGemmLauncher's configuration for a CONFIG_ENV setting."""
    if setting in (None, ""):
        return {"config": SM90_CONFIG}
    if setting not in SM90_CONFIGS:
        raise ValueError(f"{CONFIG_ENV}={setting!r}: expected one of {', '.join(SM90_CONFIGS)}")
    return {"config": SM90_CONFIGS[setting]}


_launcher = None


def run_sm90(data):
    global _launcher
    if _launcher is None:  # the configuration setting is read once, at the first call
        _launcher = submission.GroupedGemmLauncher(
            compile_fn=lambda config: compile_sm90(config, target_arch()),
            **launcher_options(os.environ.get(CONFIG_ENV)))
    return _launcher(data)
