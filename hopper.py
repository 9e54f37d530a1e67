"""NVFP4 block-scaled grouped GEMM for Hopper (sm_90a): the same operation and
input contract as `submission.py` (docs/contract.md), for the H100 and H200.
Importing this module makes it custom_kernel's path on sm_90
(`submission.register_path`).

Hopper has no FP4 tensor-core instruction, so the kernel dequantizes:

    C[m, n] = fp16( sum_k a(m,k) sfa(m,k/16) b(n,k) sfb(n,k/16) )

Two kernels per call (the form "weights in registers"):

- Token pre-pass (`convert_tokens`): every group's A (the tokens, M <= a few
  hundred rows) once per call to fp16, scaled, into the plan's scratch after
  its descriptor table (`scratch_address`, sized by `Sm90TileConfig.plan_words`
  on the host). Launched once the previous kernel has ended, it lets the GEMM
  launch (programmatic dependent launch) once its stores are issued; the GEMM
  requests its first stages' weights at once, their tokens after its
  griddepcontrol.wait (the pre-pass's end).
- GEMM, per tile of C (tile_m tokens x 128 weight rows): a producer warp
  streams the tile's fp16 tokens and packed FP4 weights B (TMA through the
  groups' descriptors, built once per input as the B200 kernel's are:
  `build_tensormaps`, `submission.GroupTensormaps`) and SFB (a bulk copy: in the
  blocked layout the scale factors of 128 rows x 64 K are 512 contiguous
  bytes) into `num_ab_stages` stages of `tile_k` K. Each of two MMA
  warpgroups dequantizes its 64 rows of B straight into wgmma's A register
  fragments and multiplies them by the stage's tokens (wgmma m64 n<tile_m>
  k16, fp16 in, fp32 accumulate): the transposed tile C^T, so no thread
  writes an fp16 operand to shared memory. Two register buffers: a stage
  converts while the previous stage's wgmma runs. Each lane of a thread quad
  converts one quarter of its two rows' packed stage (one load per row, the
  warp's loads conflict-free), which fixes the K order within a stage
  (`stage_k_order`) that the pre-pass stores the tokens in.

- The conversion: an E2M1 nibble n placed as the fp16 bit pattern
  (n & 8) << 12 | (n & 7) << 9 is value * 2^-14 (zero, subnormal 0.5 and
  normal values alike), and one `mul.rn.f16x2` by fp16(scale) * 2^7 makes
  value * scale * 2^-7, exactly (at most 5 significant bits, magnitudes
  2^-17 .. 21). The product of two such operands is the true product * 2^-14;
  the epilogue multiplies the fp32 accumulator by 2^14 (exact) and rounds to
  fp16. Each packed 32-bit word (8 consecutive K) yields its fp16 pairs
  (0,4), (1,5), (2,6), (3,7) with shifts by constants (`dequant_word`). Both
  operands (the weights' fragments and the pre-pass's tokens) hold the same
  physical K at each of wgmma's K positions (`stage_k_order`), which leaves
  every dot product unchanged.

Persistent: at most one CTA per SM walks the tiles of all groups with the B200
kernel's scheduler (`submission.TileScheduler`), on the same run-time tables
and host path (`submission.GroupedGemmLauncher`). Per shape set custom_kernel
picks the form (128 or 192 tokens per tile, `sm90_choice`) and the schedule
(`sm90_schedule`) measured fastest on the H200, unless CONFIG_ENV names them.

Warps and pipelines (`WarpRoles`, checked at import):
  warps 0-7   MMA warpgroups 0 and 1: convert B rows 64w .. 64w + 63, wgmma,
              epilogue (C staged through shared memory per warpgroup, then
              16-byte stores); 232 registers each (setmaxnreg)
  warps 8-11  producer warpgroup, 40 registers each: warp 8 TMAs tokens and B
              and bulk-copies SFB, warps 9-11 only give their registers back
  ab  PipelineTmaAsync, `num_ab_stages` stages: producer (1 arrive + the
      stage's transaction bytes) -> consumers (one arrive per MMA warp, lane 0,
      once the wgmma reading the stage is done)

Configurations (`SM90_CONFIGS`): only forms that were the fastest on at least
one benchmark in a measured H200 sweep (docs/hopper.md). The forms that
dequantize both operands inside the CTA (lockstep, a B-only warpgroup, converter
warpgroups, with and without the pre-pass) lost on every benchmark and were
removed after commit eae43f1, whose hopper.py has them.
"""
import dataclasses
import os
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup

import submission
from submission import (K_MULTIPLE, PTR_ALIGN_BYTES, SF_VEC_SIZE, TENSORMAP_I64_PER_GROUP, GroupTensormaps,
                        TileConfig, TileScheduler, ceil_div, check_budget, tensormap_staging, write_group_tensormaps)

# =============================================================================
# Configuration
# =============================================================================
WEIGHT_ROWS = 128  # B rows (weights' N) per tile: two MMA warpgroups, wgmma M = 64 each
SF_BLOCK_BYTES = 512  # blocked layout: the scale factors of 128 rows x 64 K


@dataclasses.dataclass(frozen=True)
class Sm90TileConfig(TileConfig):
    """The launcher's TileConfig (tile_m: tokens per tile, wgmma's N; tile_n:
    weight rows per tile) plus the Hopper kernel's K per stage and a timing
    diagnostic."""
    tile_k: int = 128  # 64 or 128: one or two 512-byte scale-factor blocks per stage
    # Timing experiments only (`eval.py sweep --diagnose`; wrong results): "skip-convert"
    # leaves the weights' fragments unconverted, "skip-mma" issues no wgmma, "skip-tokens"
    # loads no tokens, "skip-prepass" runs no pre-pass, "skip-epilogue" stores no C; with exact
    # results (EXACT_DIAGNOSTICS):
    # "no-pdl", "early-release" (the pre-pass's launch_dependents first), "prepass-pdl" and
    # "weights-after-wait" (the GEMM requests no weights before its griddepcontrol.wait).
    diagnostic: str = ""

    @property
    def tile_mnk(self):
        return (self.tile_m, self.tile_n, self.tile_k)

    def make_kernel(self):
        return Sm90GroupedGemmKernel(self)

    def plan_words(self, problem_sizes) -> int:
        """The groups' descriptor table, then the token pre-pass's fp16 A of
        every group, back to back (`scratch_address`, `group_tokens`)."""
        scratch_bytes = sum(m * k * 2 for m, _, k, _ in problem_sizes)
        return super().plan_words(problem_sizes) + ceil_div(scratch_bytes, 8)


DIAGNOSTICS = ("skip-convert", "skip-mma", "skip-tokens", "skip-prepass", "skip-epilogue", "no-pdl", "early-release",
               "prepass-pdl", "weights-after-wait")
# exact results: selectable by CONFIG_ENV
EXACT_DIAGNOSTICS = ("no-pdl", "early-release", "prepass-pdl", "weights-after-wait")
# Figures: docs/hopper.md (same-run H200 timings: the default is the fastest on benchmarks 0, 2 and 3,
# 192 tokens per tile on benchmark 1; 256 tokens per tile and 128 x 128 with 64 K per stage were the
# fastest nowhere and were removed, as was the swizzled packed stage once the fragment loads stopped
# conflicting).
SM90_CONFIGS = {c.name: c for c in (
    Sm90TileConfig("sm90-128x128-k128-wr", 128, WEIGHT_ROWS, tile_k=128),
    Sm90TileConfig("sm90-192x128-k64-wr", 192, WEIGHT_ROWS, tile_k=64),
)}
SM90_CONFIG = SM90_CONFIGS["sm90-128x128-k128-wr"]  # the default form (`sm90_choice` may take the 192-token one)
# Timing experiments (`eval.py sweep --diagnose`), each on the default form.
# Exact results: "no-pdl" launches both kernels without programmatic dependent launch,
# "early-release" lets the GEMM launch as the pre-pass starts (not once its stores are issued),
# "prepass-pdl" launches the pre-pass with it too (its blocks then start in the previous
# call's GEMM's tail; on the H200 that made the pre-pass 1.5 us slower than its launch gap),
# "weights-after-wait" requests the GEMM's first weights only after its griddepcontrol.wait.
SM90_DIAGNOSTICS = tuple(dataclasses.replace(SM90_CONFIG, name=f"{SM90_CONFIG.name}-{what}", diagnostic=what,
                                             pdl=what != "no-pdl") for what in DIAGNOSTICS)

MMA_WARPGROUPS = WEIGHT_ROWS // 64  # warpgroups 0 and 1: wgmma M = 64 each
PREPASS_THREADS = 256  # token pre-pass: threads per block
PREPASS_BLOCKS_PER_CTA = 4  # token pre-pass: blocks per GEMM CTA (grid-stride over 32-K chunks)
TOKEN_CHUNK_K = 32  # token pre-pass: K per thread and chunk (4 packed words, 2 scale factors)
NUM_REGISTER_BUFFERS = 2  # weights' fragments: one converted while the other's wgmma runs
MAX_AB_STAGES = 8
SMEM_CAPACITY = 232448  # sm_90: 227 KiB per block
SMEM_RESERVED = 1024  # per CTA
REGISTERS_PER_SM = 65536
SCHEDULERS_PER_SM = 4  # warp schedulers, each with a quarter of the register file
SM90_TENSORMAPS = 2  # A (the pre-pass's tokens), B: slots 0 and 1 of each group's five in the descriptor table
ACC_SCALE = 16384.0  # 2^14: undoes the 2^-7 of each dequantized operand
# Epilogue: each MMA warpgroup stages C^T's values through shared memory, EPILOGUE_TOKENS tokens at a time,
# as rows of C (64 weight columns, 128 contiguous bytes), then stores them 16 bytes per thread.
EPILOGUE_TOKENS = 64
EPILOGUE_ROW_HALVES = 72  # a staged row's stride in fp16: 144 bytes, so the 4 lanes of a quad hit different banks
EPILOGUE_BARRIER = 1  # named barriers 1 and 2: one per MMA warpgroup (0 is the CTA's)

F16X2_128 = 0x58005800  # fp16 128.0 in both halves
A_FRAGMENT_LAYOUT = "((4,8,4),(2,2,2)):((128,1,16),(64,8,512))"  # wgmma m64k16 A in registers, (m + 64 k)


class WarpRoles(NamedTuple):
    """Warps of the kernel: the MMA warpgroups first, then the producer
    warpgroup, whose first warp issues the copies (the other three only give
    their registers back)."""
    consumer_warps: int  # warps 0 .. consumer_warps - 1
    producer_warp: int  # the first warp of the producer warpgroup
    threads: int
    ab_consumer_arrives: int  # PipelineTmaAsync: lane 0 of each consumer warp
    b_rows: tuple  # per MMA warpgroup: (first, count) of the tile's weight rows
    producer_registers: int  # setmaxnreg: per thread of the producer warpgroup
    consumer_registers: int  # setmaxnreg: per thread of each MMA warpgroup


WARP_ROLES = WarpRoles(4 * MMA_WARPGROUPS, 4 * MMA_WARPGROUPS, 128 * (MMA_WARPGROUPS + 1), 4 * MMA_WARPGROUPS,
                       tuple((64 * w, 64) for w in range(MMA_WARPGROUPS)), producer_registers=40,
                       consumer_registers=232)


def check_sm90_warp_roles() -> None:
    """Arrive counts, row splits, register shares and tile sizes against the
    warp layout, at import (a mismatch would hang a GPU, so it must fail here)."""
    roles = WARP_ROLES
    assert roles.producer_warp == roles.consumer_warps and roles.threads == 32 * (roles.consumer_warps + 4)
    assert roles.ab_consumer_arrives == roles.consumer_warps  # every consumer warp releases its stage
    covered = sorted(r for first, count in roles.b_rows for r in range(first, first + count))
    assert covered == list(range(WEIGHT_ROWS))  # every weight row converted once
    # setmaxnreg: multiples of 8 in 24 .. 256; the shares after it fit the register file, and the
    # producer gives registers back (dec) while the MMA warpgroups take them (inc) from the launch's budget
    for count in (roles.producer_registers, roles.consumer_registers):
        assert count % 8 == 0 and 24 <= count <= 256, roles
    assert 128 * (roles.producer_registers + MMA_WARPGROUPS * roles.consumer_registers) <= REGISTERS_PER_SM
    assert roles.producer_registers <= register_budget() <= roles.consumer_registers
    for config in SM90_CONFIGS.values():
        # the tokens are wgmma's N: a multiple of 8 up to 256; the pre-pass's 128-row items need none
        assert config.tile_n == WEIGHT_ROWS and config.tile_m % 8 == 0 and 8 <= config.tile_m <= 256, config
        assert config.tile_k in (64, 128) and K_MULTIPLE % (2 * config.tile_k) == 0, config  # stages in pairs
        assert not config.swap_ab and SF_VEC_SIZE == 16, config


def register_budget() -> int:
    """Registers per thread at launch that let a CTA fit an SM: each of the
    SM's four schedulers has a quarter of the register file for the warps it
    holds (warp w goes to scheduler w % 4), allocated in units of 8 per
    thread. Twelve warps (two MMA warpgroups and the producer warpgroup) put
    three on each scheduler: 168 registers, which is what ptxas caps them at;
    setmaxnreg then moves registers from the producer to the MMA warpgroups."""
    warps_per_scheduler = -(-(WARP_ROLES.threads // 32) // SCHEDULERS_PER_SM)
    return REGISTERS_PER_SM // SCHEDULERS_PER_SM // (32 * warps_per_scheduler) // 8 * 8


check_sm90_warp_roles()


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


def scratch_address(tensormaps: cute.Tensor, num_groups):
    """Where a plan's scratch starts: after its (G, 5, 16) descriptor table
    in the plan's memory (`submission.LaunchPlan`)."""
    return tensormaps.iterator.toint() + cutlass.Int64(num_groups) * (TENSORMAP_I64_PER_GROUP * 8)


def token_scale_offset(row, kb, k):
    """Byte offset, in a group's reordered SFA (K = k), of the scale factor of
    `row` and 16-K block `kb` (0 .. k/16 - 1)."""
    return (row // 128 * (k // 64) + kb // 4) * SF_BLOCK_BYTES + sf_offset(row % 128, kb % 4)


def lane_words(tile_k: int) -> int:
    """Packed 32-bit words (8 K each) of one row and stage that each lane of a
    quad converts: a quarter of the row."""
    return tile_k // 32


def fragment_word(dr: int, t: int) -> int:
    """Where pair t (0 .. 2 tile_k/32 - 1) of a lane's quarter row goes in its
    fragment (A_FRAGMENT_LAYOUT recast to 32-bit words: (row + 8, K + 8, kb)):
    rows `row` + 8 dr, 16-K block t // 2, K + 8 for odd t."""
    return dr + 2 * (t % 2) + 4 * (t // 2)


def prepass_pair(q: int, jj: int) -> int:
    """Where the pre-pass puts pair jj of quarter q's word among a 32-K chunk's
    16 fp16 pairs: the pair wgmma's K order (`stage_k_order`) has there."""
    return 4 * jj + q


def stage_k_order(tile_k: int) -> list:
    """wgmma's K order within a stage, as both operands have it: entry L is
    the physical K (0 .. tile_k - 1) at logical K L. Thread quad lane q holds
    logical K 16 kb + 8 j + 2 q + (0, 1) of each 16-K block kb (A_FRAGMENT_LAYOUT);
    `dequantize_a_fragment` fills them from physical quarter q of the row: pair
    jj of word w (physical K q tile_k/4 + 8 w + jj and + 4, `dequant_word`) as
    pair t = 4 w + jj (`fragment_word`). A host-side model for the tests."""
    order = [None] * tile_k
    for q in range(4):
        for w in range(lane_words(tile_k)):
            for jj in range(4):
                word = fragment_word(0, 4 * w + jj)  # (K + 8) = word // 2 % 2, kb = word // 4
                for p in range(2):
                    logical = 16 * (word // 4) + 8 * (word // 2 % 2) + 2 * q + p
                    order[logical] = q * tile_k // 4 + 8 * w + jj + 4 * p
    return order


def sf_offset(row, kb):
    """Byte offset of the scale factor of `row` (0..127 within its 128-row
    block) and 16-K block `kb` (0..tile_k/16 - 1 within the stage) in a
    stage's scale factors (512 bytes per 64 K) of the blocked layout:
    [K/64 block][row % 32][row / 32][kb % 4]."""
    return (kb // 4) * SF_BLOCK_BYTES + (row % 32) * 16 + (row // 32) * 4 + kb % 4


# =============================================================================
# The kernel
# =============================================================================
class Sm90SmemLayouts(NamedTuple):
    tokens: cute.ComposedLayout  # (tile_m, tile_k, STAGE) fp16, wgmma's K-major swizzle (TMA stages)
    b_packed: cute.Layout  # (WEIGHT_ROWS, K/2 bytes, STAGE)
    sf: cute.Layout  # (sf_stage_bytes, STAGE) of SFB


class Sm90GroupedGemmKernel:
    """Persistent grouped NVFP4 GEMM for sm_90a (see the module docstring)."""

    def __init__(self, config: Sm90TileConfig = SM90_CONFIG):
        self.config = config
        self.tile_k = config.tile_k
        self.tile_mnk = config.tile_mnk
        self.tile_m, self.tile_n = config.tile_m, config.tile_n  # the scheduler's tile of C (M x N)
        self.packed_k_bytes = self.tile_k // 2  # per row and stage
        self.sf_stage_bytes = SF_BLOCK_BYTES * self.tile_k // 64  # per stage
        self.roles = WARP_ROLES
        # The GEMM may read the weights before its griddepcontrol.wait only where its launch follows a
        # pre-pass launched without programmatic dependent launch (which starts once all earlier work is done).
        self.weights_before_wait = config.diagnostic not in ("skip-prepass", "prepass-pdl", "weights-after-wait")

    def _setup_attributes(self):
        mbarriers = 2 * 8 * MAX_AB_STAGES  # full and empty, 8 bytes each, for as many stages as there can be
        free = SMEM_CAPACITY - SMEM_RESERVED - mbarriers - cute.cosize(self.epilogue_layout()) * 2
        self.num_ab_stages = min(MAX_AB_STAGES, free // self.stage_bytes())
        check_budget(self.config.name, "A/B stages (at least 2)", 2, self.num_ab_stages)

    def make_tiled_mma(self):
        """wgmma's B (its 128 weight rows: wgmma's A, from registers) x A (the
        tokens: wgmma's N, from the shared-memory stage)."""
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            cutlass.Float16, cutlass.Float16, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
            cutlass.Float32, (WEIGHT_ROWS // 64, 1, 1), tiler_mn=(64, self.tile_m),
            a_source=warpgroup.OperandSource.RMEM)
        # dequantize_a_fragment writes this thread-value layout of A (m + 64 k): thread
        # (lane % 4, lane / 4, warp) at k = 2 (lane % 4), m = lane / 4 + 16 warp; values
        # (k + 1, m + 8, k + 8): fp16 pairs of consecutive K, rows r and r + 8, K and K + 8.
        if str(tiled_mma.tv_layout_A) != A_FRAGMENT_LAYOUT:
            raise ValueError(f"{self.config.name}: wgmma's A register layout is {tiled_mma.tv_layout_A}, "
                             f"dequantize_a_fragment writes {A_FRAGMENT_LAYOUT}")
        return tiled_mma

    def make_layouts(self) -> Sm90SmemLayouts:
        """Shared-memory layouts (static; made where they are used, host or device)."""
        stages, width = self.num_ab_stages, self.packed_k_bytes
        b_packed = cute.make_layout((WEIGHT_ROWS, width, stages), stride=(width, 1, WEIGHT_ROWS * width))
        return Sm90SmemLayouts(
            tokens=sm90_utils.make_smem_layout_a(utils.LayoutEnum.ROW_MAJOR, self.tile_mnk, cutlass.Float16, stages),
            b_packed=b_packed,
            sf=cute.make_layout((self.sf_stage_bytes, stages)))

    @staticmethod
    def epilogue_layout() -> cute.Layout:
        """(tokens, weight columns, warpgroup) fp16: each MMA warpgroup's staging of EPILOGUE_TOKENS rows of C."""
        return cute.make_layout((EPILOGUE_TOKENS, 64, MMA_WARPGROUPS),
                                stride=(EPILOGUE_ROW_HALVES, 1, EPILOGUE_TOKENS * EPILOGUE_ROW_HALVES))

    def stage_bytes(self) -> int:
        """Bytes one TMA stage receives (its transaction count): fp16 tokens, packed B, SFB."""
        return self.tile_m * self.tile_k * 2 + WEIGHT_ROWS * self.packed_k_bytes + self.sf_stage_bytes

    @staticmethod
    def _placeholder(dtype):
        """A (rows, K) global tensor of `dtype` from which a TMA atom is built
        (packed B as bytes, or the pre-pass's fp16 tokens): the template the
        descriptor builder fills in for each group."""
        rows, width = cutlass.Int32(128), cutlass.Int32(128)
        return cute.make_tensor(
            cute.make_ptr(dtype, 0, cute.AddressSpace.gmem, assumed_align=PTR_ALIGN_BYTES),
            cute.make_layout((rows, width), stride=(width, 1)))

    def make_tma_atoms(self):
        """The TMA atoms of the tokens and the packed weights (descriptor slots
        0 and 1) with their placeholder tensors, the same in the GEMM and the
        descriptor builder."""
        self._setup_attributes()
        layouts = self.make_layouts()
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        one_stage = lambda layout: cute.slice_(layout, (None, None, 0))
        return layouts, (
            cpasync.make_tiled_tma_atom(g2s, self._placeholder(cutlass.Float16), one_stage(layouts.tokens),
                                        (self.tile_m, self.tile_k)),
            cpasync.make_tiled_tma_atom(g2s, self._placeholder(cutlass.Uint8), one_stage(layouts.b_packed),
                                        (WEIGHT_ROWS, self.packed_k_bytes)))

    @cute.jit
    def build_tensormaps(self, ptr_problem_sizes: cute.Pointer, ptr_abc: cute.Pointer, ptr_sf: cute.Pointer,
                         ptr_tensormaps: cute.Pointer, num_groups: cutlass.Int32, total_tiles: cutlass.Int32,
                         num_ctas: cutlass.Int32, plan_ready: cutlass.Int32, stream):
        """The descriptor builder's host function (the GEMM's arguments):
        one warp per group writes its two descriptors."""
        _, ((atom_a, _), (atom_b, _)) = self.make_tma_atoms()
        self.tensormap_staging = tensormap_staging(SM90_TENSORMAPS)
        problem_sizes, abc_ptrs, _, tensormaps = submission.host_tables(
            ptr_problem_sizes, ptr_abc, ptr_sf, ptr_tensormaps, num_groups)
        self.tensormap_builder(atom_a, atom_b, problem_sizes, abc_ptrs, tensormaps, num_groups).launch(
            grid=(1, 1, num_groups), block=[32, 1, 1], smem=self.tensormap_staging.size_in_bytes(), stream=stream,
            use_pdl=self.config.pdl)

    @cute.kernel
    def tensormap_builder(self, tma_atom_a: cute.CopyAtom, tma_atom_b: cute.CopyAtom, problem_sizes: cute.Tensor,
                          abc_ptrs: cute.Tensor, tensormaps: cute.Tensor, num_groups: cutlass.Int32):
        _, _, group = cute.arch.block_idx()
        staging = utils.SmemAllocator().allocate(self.tensormap_staging)
        write_group_tensormaps(
            (tma_atom_a, tma_atom_b),
            (self.group_tokens(problem_sizes, group, scratch_address(tensormaps, num_groups)),
             self.group_weights(problem_sizes, group, abc_ptrs)), tensormaps, group, staging)

    @cute.jit
    def __call__(
        self,
        ptr_problem_sizes: cute.Pointer,  # (G, 4) Int32: M, N, K, L
        ptr_abc: cute.Pointer,  # (G, 3) Int64: A, B, C addresses
        ptr_sf: cute.Pointer,  # (G, 2) Int64: SFA, SFB addresses (reordered)
        ptr_tensormaps: cute.Pointer,  # (G, 5, 16) Int64 descriptor table, 128-byte aligned, then the scratch
        num_groups: cutlass.Int32,
        total_tiles: cutlass.Int32,
        num_ctas: cutlass.Int32,
        plan_ready: cutlass.Int32,  # the tables and descriptors complete before this launch (LaunchPlan.launch)
        stream,
    ):
        layouts, ((tma_atom_a, tma_a), (tma_atom_b, tma_b)) = self.make_tma_atoms()

        @cute.struct
        class SharedStorage:
            ab_mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.num_ab_stages]
            tokens: cute.struct.Align[cute.struct.MemRange[cutlass.Float16, cute.cosize(layouts.tokens)], 1024]
            b_packed: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, cute.cosize(layouts.b_packed)], 1024]
            sfb: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, cute.cosize(layouts.sf)], 128]
            epilogue: cute.struct.Align[cute.struct.MemRange[cutlass.Float16, cute.cosize(self.epilogue_layout())],
                                        16]

        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()
        check_budget(self.config.name, "bytes of shared memory", self.smem_bytes, SMEM_CAPACITY)

        problem_sizes, abc_ptrs, sf_ptrs, tensormaps = submission.host_tables(
            ptr_problem_sizes, ptr_abc, ptr_sf, ptr_tensormaps, num_groups)
        if cutlass.const_expr(self.config.diagnostic != "skip-prepass"):
            self.convert_tokens(problem_sizes, abc_ptrs, sf_ptrs, tensormaps, num_groups, plan_ready).launch(
                grid=(1, 1, num_ctas * PREPASS_BLOCKS_PER_CTA), block=[PREPASS_THREADS, 1, 1], stream=stream,
                use_pdl=self.config.pdl and self.config.diagnostic == "prepass-pdl")
        self.kernel(self.make_tiled_mma(), tma_atom_a, tma_a, tma_atom_b, tma_b, problem_sizes, abc_ptrs, sf_ptrs,
                    tensormaps, total_tiles, plan_ready).launch(
            grid=(1, 1, num_ctas), block=[self.roles.threads, 1, 1], smem=self.smem_bytes, stream=stream,
            use_pdl=self.config.pdl)

    # -------------------------------------------------------------------------
    # Device side: the dispatcher
    # -------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tiled_mma: cute.TiledMma, tma_atom_a: cute.CopyAtom, mA: cute.Tensor,
               tma_atom_b: cute.CopyAtom, mB: cute.Tensor, problem_sizes: cute.Tensor, abc_ptrs: cute.Tensor,
               sf_ptrs: cute.Tensor, tensormaps: cute.Tensor, total_tiles: cutlass.Int32, plan_ready: cutlass.Int32):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()

        storage = utils.SmemAllocator().allocate(self.shared_storage)
        # "skip-tokens" (a timing diagnostic) loads no tokens
        skipped = self.tile_m * self.tile_k * 2 if cutlass.const_expr(self.config.diagnostic == "skip-tokens") else 0
        ab_pipeline = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ab_mbar.data_ptr(),
            num_stages=self.num_ab_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.roles.ab_consumer_arrives),
            tx_count=self.stage_bytes() - skipped,
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        )
        producer_maps = GroupTensormaps(tensormaps, 0, SM90_TENSORMAPS)
        cute.arch.sync_threads()  # barriers initialized

        layouts = self.make_layouts()
        # every role walks the same tiles, each with its own copy of this state
        scheduler = TileScheduler.create(problem_sizes, total_tiles, self.tile_mnk,
                                         self.config.schedule.contiguous)
        if warp_idx >= self.roles.producer_warp:
            cute.arch.warpgroup_reg_dealloc(self.roles.producer_registers)
            if warp_idx == self.roles.producer_warp:
                self.producer(layouts, storage, ab_pipeline, problem_sizes, sf_ptrs, scheduler, producer_maps,
                              plan_ready, (tma_atom_a, tma_atom_b), mA, mB)
        if warp_idx < self.roles.producer_warp:
            cute.arch.warpgroup_reg_alloc(self.roles.consumer_registers)
            self.weights_consumer(layouts, storage, ab_pipeline, tiled_mma, problem_sizes, abc_ptrs, scheduler, tidx)

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
    def group_weights(self, problem_sizes: cute.Tensor, group, abc_ptrs):
        """Packed B (N, K/2) bytes of `group`."""
        half_k = problem_sizes[group, 2] // 2
        return cute.make_tensor(
            cute.make_ptr(cutlass.Uint8, abc_ptrs[group, 1], cute.AddressSpace.gmem, assumed_align=PTR_ALIGN_BYTES),
            cute.make_layout((problem_sizes[group, 1], half_k), stride=(half_k, 1)))

    # -------------------------------------------------------------------------
    # The producer warp (last warp; `WarpRoles.producer_warp`)
    # -------------------------------------------------------------------------
    @cute.jit
    def producer(self, layouts, storage, ab_pipeline, problem_sizes, sf_ptrs, scheduler, tensormaps, plan_ready,
                 atoms, mA, mB):
        """Per stage: TMA the tile's fp16 tokens (the pre-pass's, in the plan's
        scratch) and packed B, bulk-copy its SFB; the first tile's first stages'
        weights before griddepcontrol.wait, their tokens after it."""
        tma_atom_a, tma_atom_b = atoms
        sA = storage.tokens.get_tensor(layouts.tokens.outer, swizzle=layouts.tokens.inner)
        sB = storage.b_packed.get_tensor(layouts.b_packed)
        sSFB = storage.sfb.get_tensor(layouts.sf)
        # ((ATOM_V, REST_V), STAGE) and ((ATOM_V, REST_V), ROW_TILES, K_TILES)
        tAsA, tAgA = cpasync.tma_partition(
            tma_atom_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2),
            cute.group_modes(cute.local_tile(mA, (self.tile_m, self.tile_k), (None, None)), 0, 2))
        tBsB, tBgB = cpasync.tma_partition(
            tma_atom_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 2),
            cute.group_modes(cute.local_tile(mB, (WEIGHT_ROWS, self.packed_k_bytes), (None, None)), 0, 2))
        bulk = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), cutlass.Uint8, num_bits_per_copy=self.sf_stage_bytes * 8)

        # ((ATOM_V, REST_V), STAGE) destinations and their sources, for `load_stage`
        copies = (tma_atom_a, tAgA, tAsA, tma_atom_b, tBgB, tBsB, bulk, sSFB)

        # Launched as a programmatic dependent of the pre-pass, which itself started only once every earlier
        # kernel had finished: only the pre-pass's fp16 tokens need this kernel's griddepcontrol.wait. Once
        # the plan's tables and descriptors are complete (`plan_ready`), the first tile's first stages of
        # weights are requested before it (`weights_before_wait`), their tokens after it.
        tensormaps.fetch_early(scheduler, plan_ready)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_ab_stages)
        early = cutlass.Int32(0)  # stages of the first tile whose weights were requested before the wait
        if cutlass.const_expr(self.weights_before_wait):
            if plan_ready != 0:
                if scheduler.has_work():
                    first = scheduler.current()
                    sfb_first = self.sfb_tile_address(first, problem_sizes, sf_ptrs)
                    early = first.k_tiles
                    if early > self.num_ab_stages:
                        early = cutlass.Int32(self.num_ab_stages)
                    for k_tile in cutlass.range(0, early, 1, unroll=1):
                        ab_pipeline.producer_acquire(state)
                        self.load_stage("weights", copies, first, k_tile, ab_pipeline.producer_get_barrier(state),
                                        state.index, tensormaps, sfb_first)
                        state.advance()
        cute.arch.griddepcontrol_wait()
        if early > 0:
            first = scheduler.current()
            token_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_ab_stages)
            for k_tile in cutlass.range(0, early, 1, unroll=1):
                self.load_stage("tokens", copies, first, k_tile, ab_pipeline.producer_get_barrier(token_state),
                                token_state.index, tensormaps, None)
                ab_pipeline.producer_commit(token_state)
                token_state.advance()
        while scheduler.has_work():
            work = scheduler.current()
            tensormaps.fetch_ahead(work, scheduler, plan_ready)
            sfb_tile = self.sfb_tile_address(work, problem_sizes, sf_ptrs)
            for k_tile in cutlass.range(early, work.k_tiles, 1, unroll=1):
                ab_pipeline.producer_acquire(state)
                barrier = ab_pipeline.producer_get_barrier(state)
                for what in ("tokens", "weights"):  # unrolled while tracing
                    self.load_stage(what, copies, work, k_tile, barrier, state.index, tensormaps, sfb_tile)
                ab_pipeline.producer_commit(state)
                state.advance()
            early = cutlass.Int32(0)
            scheduler.advance()
        cute.arch.griddepcontrol_launch_dependents()  # the last loads are issued: the next kernel may start
        ab_pipeline.producer_tail(state)

    @staticmethod
    def sfb_tile_address(work, problem_sizes, sf_ptrs):
        """Where `work`'s SFB starts: its 128-row block of the group's blocked scale factors, (K/64)
        blocks of 512 bytes each (read once per tile; `load_stage` adds the stage's offset)."""
        return sf_ptrs[work.group, 1] + work.n_tile * (problem_sizes[work.group, 2] // 64) * SF_BLOCK_BYTES

    @cute.jit
    def load_stage(self, what: cutlass.Constexpr, copies, work, k_tile, barrier, stage, tensormaps, sfb_tile):
        """Stage `stage` of `work`'s K tile `k_tile`: its "tokens" (TMA, from the pre-pass's scratch) or its
        "weights" (packed B by TMA, SFB by a bulk copy from `sfb_tile`, `sfb_tile_address`), arriving on
        `barrier`."""
        tma_atom_a, tAgA, tAsA, tma_atom_b, tBgB, tBsB, bulk, sSFB = copies
        if cutlass.const_expr(what == "tokens"):
            if cutlass.const_expr(self.config.diagnostic != "skip-tokens"):
                cute.copy(tma_atom_a, tAgA[(None, work.m_tile, k_tile)], tAsA[(None, stage)],
                          tma_bar_ptr=barrier, tma_desc_ptr=tensormaps.descriptor(work.group, 0))
        else:
            cute.copy(tma_atom_b, tBgB[(None, work.n_tile, k_tile)], tBsB[(None, stage)],
                      tma_bar_ptr=barrier, tma_desc_ptr=tensormaps.descriptor(work.group, 1))
            # Bulk copies are not elected by the compiler (TMA copies are): one lane issues them.
            if cute.arch.lane_idx() == 0:
                src = cute.make_tensor(
                    cute.make_ptr(cutlass.Uint8, sfb_tile + k_tile * self.sf_stage_bytes, cute.AddressSpace.gmem,
                                  assumed_align=PTR_ALIGN_BYTES),
                    cute.make_layout(self.sf_stage_bytes))
                cute.copy(bulk, src, sSFB[(None, stage)], mbar_ptr=barrier)

    # -------------------------------------------------------------------------
    # The MMA warpgroups: weights dequantized into registers, times the tokens
    # -------------------------------------------------------------------------
    @cute.jit
    def dequantize_a_fragment(self, s_packed, s_sf, frag, stage, row, q):
        """This thread's wgmma A fragment (A_FRAGMENT_LAYOUT) of stage `stage`,
        rows `row` and row + 8: lane q (0..3) of a quad converts the q-th
        quarter of each row's packed stage (one 16- or 8-byte load; the 32 lanes
        of a warp read 8 consecutive rows, hence consecutive bytes: no bank
        conflicts) and puts pair t of it where `fragment_word` says, which is
        wgmma's K order of `stage_k_order`; the pre-pass stores the tokens in
        the same order."""
        blocks = cute.recast_tensor(s_packed[(None, None, stage)], cutlass.Uint64)  # (rows, tile_k / 16)
        # the scale factors of a row's four 16-K blocks of one 64-K block are 4 consecutive bytes
        scale_words = cute.recast_tensor(s_sf[(None, stage)], cutlass.Uint32)  # (sf_stage_bytes / 4,)
        frag32 = cute.recast_tensor(frag, cutlass.Uint32)  # ((1, 2, 2), 1, K blocks): (row + 8, K + 8, kb)
        words = lane_words(self.tile_k)  # packed words per row and lane: 4 or 2
        first_block = q * (words // 2)  # the lane's first 16-K block of the stage (its words' scales)
        for dr in cutlass.range_constexpr(2):
            r = row + 8 * dr
            scales = scale_words[(first_block // 4 * SF_BLOCK_BYTES + sf_offset(r, 0)) // 4] >> (8 * (first_block % 4))
            for half in cutlass.range_constexpr(words // 2):
                packed = blocks[r, q * (words // 2) + half]  # 8 bytes: the lane's words 2 half, 2 half + 1
                scale = scale_f16x2(scales, half)  # 16 K per scale factor: two words
                for h in cutlass.range_constexpr(2):
                    w = 2 * half + h
                    pairs = dequant_word(cutlass.Uint32(packed >> (32 * h)), scale)
                    for jj in cutlass.range_constexpr(4):
                        frag32[fragment_word(dr, 4 * w + jj)] = pairs[jj]

    @cute.jit
    def weights_consumer(self, layouts, storage, ab_pipeline, tiled_mma, problem_sizes, abc_ptrs, scheduler, tidx):
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
        sTokens = storage.tokens.get_tensor(layouts.tokens.outer, swizzle=layouts.tokens.inner)
        sC = storage.epilogue.get_tensor(self.epilogue_layout())  # (EPILOGUE_TOKENS, 64, MMA_WARPGROUPS)
        thr_mma = tiled_mma.get_slice(tidx)
        tCsT = tiled_mma.make_fragment_B(thr_mma.partition_B(sTokens))  # (MMA, MMA_N, MMA_K, STAGE)
        w_shape = thr_mma.partition_shape_A((WEIGHT_ROWS, self.tile_k))  # (MMA, MMA_M, MMA_K)
        tCrW = (cute.make_rmem_tensor(w_shape, cutlass.Float16), cute.make_rmem_tensor(w_shape, cutlass.Float16))
        w_row = 64 * wg + 16 * (wg_tidx // 32) + (wg_tidx % 32) // 4  # A_FRAGMENT_LAYOUT
        tCcC = thr_mma.partition_C(cute.make_identity_tensor((WEIGHT_ROWS, self.tile_m)))  # (n, m) of each accumulator
        acc = cute.make_rmem_tensor(tCcC.shape, cutlass.Float32)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_ab_stages)
        release_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_ab_stages)
        cute.arch.griddepcontrol_wait()  # C is written only once the previous kernel has finished
        while scheduler.has_work():
            work = scheduler.current()
            # the epilogue's table entries, read now: their DRAM round trip (the tables leave the L2 between
            # calls) overlaps the mainloop instead of following it
            output = self.output_of(problem_sizes, abc_ptrs, work)
            acc.fill(0.0)
            # K is a multiple of 256, so stages come in pairs: register buffer 0, then 1
            for k_pair in cutlass.range(0, work.k_tiles // NUM_REGISTER_BUFFERS, 1, unroll=1):
                for buffer in cutlass.range_constexpr(NUM_REGISTER_BUFFERS):
                    ab_pipeline.consumer_wait(state)
                    # the timing diagnostics (Sm90TileConfig.diagnostic) leave out a part
                    if cutlass.const_expr(self.config.diagnostic != "skip-convert"):
                        self.dequantize_a_fragment(sB, sSFB, tCrW[buffer], state.index, w_row, wg_tidx % 4)
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
            if cutlass.const_expr(self.config.diagnostic != "skip-epilogue"):
                self.epilogue(acc, tCcC, output, work, sC[(None, None, wg)], wg, wg_tidx)
            scheduler.advance()

    @staticmethod
    def output_of(problem_sizes, abc_ptrs, work):
        """(M, N, C's address) of `work`'s group."""
        return problem_sizes[work.group, 0], problem_sizes[work.group, 1], abc_ptrs[work.group, 2]

    @cute.jit
    def epilogue(self, acc, tCcC, output, work, staging, wg, wg_tidx):
        """acc * 2^14 to fp16 into C (`output`: M, N, address); `tCcC` holds
        each value's (n, m) in the tile C^T. Warpgroup wg owns the tile's
        weight columns 64 wg .. 64 wg + 63 of C: EPILOGUE_TOKENS tokens at a
        time its threads put their values in `staging` (rows of C), then each
        thread stores 16-byte pieces of them, 8 threads per row of C (128
        contiguous bytes), rows past M left out."""
        m, n, address = output
        first_row = work.m_tile * self.tile_m
        first_col = work.n_tile * self.tile_n + 64 * wg
        values = cute.size(acc) // (self.tile_m // EPILOGUE_TOKENS)  # per pass: the tokens' 8-column blocks
        pieces = EPILOGUE_TOKENS * 64 // 8 // 128  # 16-byte pieces per thread and pass
        for rows in cutlass.range_constexpr(self.tile_m // EPILOGUE_TOKENS):
            # acc's value i: token (m) + i % 2 + 8 (i // 4), weight (n) + 8 (i // 2 % 2) (make_tiled_mma's C)
            for i in cutlass.range_constexpr(values):
                col, row = tCcC[values * rows + i]
                staging[row - EPILOGUE_TOKENS * rows, col - 64 * wg] = (
                    acc[values * rows + i] * ACC_SCALE).to(cutlass.Float16)
            cute.arch.barrier(barrier_id=EPILOGUE_BARRIER + wg, number_of_threads=128)
            for r in cutlass.range_constexpr(pieces):
                piece = wg_tidx + 128 * r
                token = piece // 8
                row = first_row + EPILOGUE_TOKENS * rows + token
                if row < m:
                    col = first_col + 8 * (piece % 8)
                    src = cute.make_tensor(  # 16-byte aligned: the staging's rows are 144 bytes apart
                        cute.make_ptr(cutlass.Uint32, staging.iterator.toint() + (
                            token * EPILOGUE_ROW_HALVES + 8 * (piece % 8)) * 2, cute.AddressSpace.smem,
                                      assumed_align=16), cute.make_layout(4))
                    dst = cute.make_tensor(  # 16-byte aligned: C's address, N a multiple of 128, col of 8
                        cute.make_ptr(cutlass.Uint32, address + (cutlass.Int64(row) * n + col) * 2,
                                      cute.AddressSpace.gmem, assumed_align=16), cute.make_layout(4))
                    cute.autovec_copy(src, dst)
            cute.arch.barrier(barrier_id=EPILOGUE_BARRIER + wg, number_of_threads=128)  # staging free again

    # -------------------------------------------------------------------------
    # Token pre-pass (its own kernel, launched before the GEMM on the same stream)
    # -------------------------------------------------------------------------
    @cute.kernel
    def convert_tokens(self, problem_sizes: cute.Tensor, abc_ptrs: cute.Tensor, sf_ptrs: cute.Tensor,
                       tensormaps: cute.Tensor, num_groups: cutlass.Int32, plan_ready: cutlass.Int32):
        """A of every group to fp16 in the conversion's K order and scaled as
        `dequant_word` does, into the scratch (`group_tokens`). Chunks of 32 K
        of one row (16 bytes in, 64 out), numbered group by group, row-major;
        thread t of the grid takes chunks t, t + threads, ... (consecutive
        threads, consecutive chunks: coalesced). It lets the GEMM launch
        (programmatic dependent launch) once its stores are issued
        ("early-release": at once): the GEMM waits for this grid's end before its
        first copy. Itself launched after the previous kernel has ended
        (but for "prepass-pdl"), it still reads the plan's sizes before its
        wait only when they are complete (`plan_ready`), anything else past it."""
        if cutlass.const_expr(self.config.diagnostic == "early-release"):
            cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        _, _, bidz = cute.arch.block_idx()
        _, _, grid_z = cute.arch.grid_dim()
        scratch = scratch_address(tensormaps, num_groups)
        chunks_of = lambda m, k: m * (k // TOKEN_CHUNK_K)  # chunks of a group
        total = cutlass.Int32(0)
        if plan_ready != 0:
            for g in cutlass.range(0, num_groups, 1, unroll=1):
                total += chunks_of(problem_sizes[g, 0], problem_sizes[g, 2])
        cute.arch.griddepcontrol_wait()
        if plan_ready == 0:
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
        if cutlass.const_expr(self.config.diagnostic != "early-release"):
            cute.arch.griddepcontrol_launch_dependents()

    @cute.jit
    def convert_token_chunk(self, a_address, sfa_address, out_address, row, k0, k):
        """Logical K k0 .. k0 + 31 (`stage_k_order`) of A's `row`: word g =
        (k0 % tile_k) / 32 of each of the 4 quarters of its stage's packed row
        and their scale factors in, 16 fp16 pairs (64 bytes) out: pair jj of
        quarter q's word goes to pair 4 jj + q (`prepass_pair`)."""
        words = lane_words(self.tile_k)
        stage_k = k0 - k0 % self.tile_k
        g = k0 % self.tile_k // TOKEN_CHUNK_K
        row_bytes = cutlass.Int64(row) * (k // 2)
        out = cute.make_rmem_tensor((16,), cutlass.Uint32)
        for q in cutlass.range_constexpr(4):
            word = q * words + g  # physical K stage_k + 8 word .. + 7
            src = cute.make_tensor(
                cute.make_ptr(cutlass.Uint32, a_address + row_bytes + (stage_k + 8 * word) // 2,
                              cute.AddressSpace.gmem, assumed_align=4), cute.make_layout(1))
            scale_byte = cute.make_tensor(
                cute.make_ptr(cutlass.Uint8, sfa_address + token_scale_offset(row, (stage_k + 8 * word) // 16, k),
                              cute.AddressSpace.gmem, assumed_align=1), cute.make_layout(1))
            pairs = dequant_word(src[0], scale_f16x2(cutlass.Uint32(scale_byte[0]), 0))
            for jj in cutlass.range_constexpr(4):
                out[prepass_pair(q, jj)] = pairs[jj]
        dst = cute.make_tensor(
            cute.make_ptr(cutlass.Uint32, out_address + (cutlass.Int64(row) * k + k0) * 2, cute.AddressSpace.gmem,
                          assumed_align=16), cute.make_layout(16))
        cute.autovec_copy(out, dst)


# =============================================================================
# Compile and launch
# =============================================================================
PATH_HOPPER = "hopper-sm90"  # custom_kernel's label for this path (submission.code_path)
CONFIG_ENV = "NVFP4_SM90_CONFIG"  # "NAME[/SCHEDULE]" (`config_from_setting`); unset: `sm90_choice` per shape set


def sm90_schedule(problem_sizes, num_sms: int, config: Sm90TileConfig = SM90_CONFIG) -> submission.Schedule:
    """The schedule measured fastest on the H200 (docs/hopper.md, "Scheduling policies"): with more tiles than SMs,
    contiguous tile ranges over balanced CTAs, groups by descending M (3 and 7 % faster than round-robin on
    benchmarks 0 and 1); within one wave every CTA takes one tile under any schedule: round-robin."""
    if submission.tile_count(problem_sizes, config) > num_sms:
        return submission.Schedule(contiguous=True, balanced_ctas=True, groups_by_m=True)
    return submission.Schedule()


def with_schedule(config: Sm90TileConfig, schedule: submission.Schedule) -> Sm90TileConfig:
    return dataclasses.replace(config, name=f"{config.name}/{schedule.name}", schedule=schedule)


def scheduled_by_shape(config: Sm90TileConfig):
    """The launcher's `choose` for `config` under `sm90_schedule`, per shape set."""
    return lambda problem_sizes, num_sms: with_schedule(config, sm90_schedule(problem_sizes, num_sms, config))


# The forms custom_kernel chooses among when CONFIG_ENV names none, with their measured cost of one tile per K
# (ns; H200, docs/hopper.md "Per-shape form"): time ~ a fixed part + the busiest CTA's sum of K x cost. The
# wider token tile costs 1.25x per tile and wins where it cuts the tiles per CTA by more (benchmark 1: 4 for 6).
# Fitted before the quarter-row conversion and the staged epilogue; on those the measured winners are still
# the ones it picks (192 tokens on benchmark 1: 82.4 against 88.1 us; docs/hopper.md, last section).
SM90_TILE_COST_NS = {"sm90-128x128-k128-wr": 6.64, "sm90-192x128-k64-wr": 8.30}


def busiest_cta_cost(problem_sizes, num_sms: int, config: Sm90TileConfig) -> float:
    """Modeled ns of the busiest CTA of `config` under `sm90_schedule` (SM90_TILE_COST_NS per tile and K)."""
    schedule = sm90_schedule(problem_sizes, num_sms, config)
    tile_k = [problem_sizes[g][2] for g in submission.group_order(problem_sizes, schedule)
              for _ in range(submission.tile_count([problem_sizes[g]], config))]
    ctas = submission.persistent_ctas(len(tile_k), num_sms, schedule.balanced_ctas)
    return SM90_TILE_COST_NS[config.name] * max(
        sum(tile_k[t] for t in submission.cta_tiles(cta, ctas, len(tile_k), schedule)) for cta in range(ctas))


def sm90_choice(problem_sizes, num_sms: int) -> Sm90TileConfig:
    """custom_kernel's configuration per shape set when CONFIG_ENV names none: the form of SM90_TILE_COST_NS
    whose busiest CTA costs least (ties: the default), under `sm90_schedule`."""
    config = min((SM90_CONFIGS[name] for name in SM90_TILE_COST_NS),
                 key=lambda c: busiest_cta_cost(problem_sizes, num_sms, c))
    return with_schedule(config, sm90_schedule(problem_sizes, num_sms, config))


def config_from_setting(setting) -> Sm90TileConfig:
    """The configuration a CONFIG_ENV setting names (unset or empty: the default): a configuration name,
    optionally followed by "/" and a schedule (`submission.Schedule.from_name`, e.g. "contiguous+balanced"),
    or "/SCHEDULE" alone for the default configuration under that schedule. How custom_kernel uses it:
    `launcher_for_setting`."""
    if setting in (None, ""):
        return SM90_CONFIG
    name, _, schedule = setting.partition("/")
    settings = {**SM90_CONFIGS, **{c.name: c for c in SM90_DIAGNOSTICS if c.diagnostic in EXACT_DIAGNOSTICS}}
    if name not in settings and name != "":
        raise ValueError(f"{CONFIG_ENV}={setting!r}: expected one of {', '.join(settings)}, optionally with "
                         "/SCHEDULE")
    config = settings.get(name, SM90_CONFIG)
    if schedule:
        config = with_schedule(config, submission.Schedule.from_name(schedule))
    return config


def launcher_for_setting(setting) -> submission.GroupedGemmLauncher:
    """The shared host path for a CONFIG_ENV setting: unset or empty, `sm90_choice` per shape set; a
    configuration and schedule, those; a configuration alone, it under `sm90_schedule` per shape set."""
    config = config_from_setting(setting)
    if setting in (None, ""):
        return submission.GroupedGemmLauncher(choose=sm90_choice)
    if "/" in setting:
        return submission.GroupedGemmLauncher(config=config)
    return submission.GroupedGemmLauncher(choose=scheduled_by_shape(config))


_launcher = None


def run_sm90(data):
    """custom_kernel on sm_90: the shared host path with the Hopper configuration
    (compiled by `submission.compile_grouped_gemm` through `Sm90TileConfig.make_kernel`)."""
    global _launcher
    if _launcher is None:  # the configuration setting is read once, at the first call
        _launcher = launcher_for_setting(os.environ.get(CONFIG_ENV))
    return _launcher(data)


submission.register_path((9, 0), PATH_HOPPER, run_sm90)
