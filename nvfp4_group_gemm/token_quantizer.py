"""The tokens' NVFP4 quantizer on the GPU: one kernel, nothing read on the host (`quantize_tokens`).

    x (T, K) bf16 or fp16, sorted by expert; offs (E,) int32, each expert's end row; a decode scale (none, one,
    or one per expert) -> packed (T, K/2) E2M1 and the blocked scale buffer (rows x K/16 E4M3): group g's
    scale rows from row P_g (the groups before it, each rounded up to 128 rows), every other byte zero.

`moe.quantize_nvfp4`'s recipe, bit for bit: a 16-value block's scale is amax / 6 / decode scale (IEEE
divisions), clamped to [2^-6, 448], rounded to E4M3; each value divided by that scale times the decode scale,
then E2M1's code by the steps of `moe.E2M1_STEPS` (nearest, ties to the even code). Rows past offs[-1] are
quantized with the last expert's scale and their scale bytes are not stored, as `mlp.quantize_tokens_device`'s
torch composition does. (One difference: a block holding NaN takes its scale from its other values, where
torch's amax is NaN, and a NaN's code is the zero of its sign.) The kernel divides no value: it counts the
steps |x| reaches against thresholds made once a block (`step_thresholds`), which select exactly the values
whose fp32 quotient passes each step.

Work: each thread takes 16-value blocks of x (two 16-byte loads, one 8-byte store of codes, one scale byte at
its blocked place), then 4-byte words of the scale buffer's padding (the rows of no token: zeros), grid-stride.
Every CTA first finds the groups from offs (one warp: `moe_tables.clamped_bounds`, a scan of the rows rounded
up to 128) into shared memory; a thread's first row's group is a binary search there, each later one's a
search forward from the last (its blocks come in row order). Compiled once per token type, decode scale kind
and architecture (sm_90a, sm_100a); K a multiple of 64 (whole 4-byte scale words per row).

The kernel `quantize_tokens` launches is a paired configuration (`TokenQuantizerConfig.paired`, while `PAIRED`
is set, the default): the same on 32-bit words of two tokens, the amax by bf16x2 / f16x2 maxes, the codes by
packed compares against the thresholds rounded up to the tokens' type (`PAIR_CODE_PTX`), each block's loads
issued one block ahead: the same bytes, faster (docs/moe.md); with one decode scale or none, its thresholds read
from a table each CTA fills once (`THRESHOLD_TABLE`). `PAIRED` False launches the value-by-value one."""
import dataclasses
import functools
import struct
from typing import Optional

import cutlass
import cutlass.cute as cute
import torch

from . import moe, moe_tables, submission
from .moe import BLOCK_ROWS, E2M1_STEPS, SF_VEC_SIZE, scale_width

THREADS = 256  # per CTA
CTAS_PER_SM = 8  # the grid: at most this many per SM (grid-stride beyond)
# the same for a paired configuration, as many as fit an SM (47-48 registers a thread; with SwiGLU 53-55)
PAIRED_CTAS_PER_SM, PAIRED_SWIGLU_CTAS_PER_SM = 5, 4
PAIRED = True  # whether `quantize_tokens` compiles paired configurations (TokenQuantizerConfig.paired)
# quantize_tokens' paired configurations of one decode scale (or none) read a block's thresholds from a table in
# shared memory instead of computing them (TokenQuantizerConfig.threshold_table): the same bytes, faster
# (docs/moe.md; scripts/quantizer_bench.py --table times both)
THRESHOLD_TABLE = True
# as many as fit 59 registers a thread, the kernel of one decode scale under DSL 4.8.1 (47 under 4.5.2; ptxas of
# CUDA 13, sm_90a)
TABLE_CTAS_PER_SM = 4
# Not yet timed, so False: quantize_tokens' configurations keep a thread's group in registers, issue the next
# block's loads unconditionally and loop by a plain while (TokenQuantizerConfig.lean_loop;
# scripts/quantizer_bench.py --lean)
LEAN_LOOP = False
LEAN_TABLE_CTAS_PER_SM = 5  # the threshold table's kernel of x's own blocks with a lean loop: 48 registers a thread
TABLE_BYTES = 128  # the E4M3 bytes a block's scale can be: positive (0x08, 2^-6, to 0x7E, 448)
TABLE_WORDS = 8  # an entry: the seven paired thresholds and a word of padding (32 bytes, two 16-byte loads)
MAX_EXPERTS = 1024  # groups a CTA's shared memory holds (8 bytes each)
K_MULTIPLE = 64  # a row's scale bytes fill whole words: the padding words never share one with a token's byte
NO_SCALE, ONE_SCALE, PER_EXPERT = 0, 1, 2  # the decode scale: none, one value, one per expert
assert BLOCK_ROWS == 128 and SF_VEC_SIZE == 16  # blocked_offset's shifts

POINTERS = {"ptr_x": (cutlass.Uint32, 16), "ptr_offs": (cutlass.Int32, 4), "ptr_packed": (cutlass.Uint32, 8),
            "ptr_scales": (cutlass.Uint8, 16), "ptr_global": (cutlass.Float32, 4)}


def ptx(result, args, text: str, constraints: str):
    """Inline PTX with one result of DSL type `result` (cutlass.Float32, Uint32): `text` reads $1.. and writes $0."""
    return result(moe_tables.inline_ptx(result.mlir_type, args, text, constraints))


F32, U32 = cutlass.Float32, cutlass.Uint32


def f32_bits(value: float) -> str:
    """`value` as a PTX fp32 literal (0fXXXXXXXX)."""
    return "0f%08X" % struct.unpack("<I", struct.pack("<f", value))[0]


# One value's E2M1 code from x and its block's scale: q = x / scale (div.rn), then a count of the steps its
# magnitude passes (ties: the even code), and q's sign bit as bit 3
CODE_PTX = ("{\n\t.reg .f32 q, m;\n\t.reg .pred p;\n\t.reg .u32 c, s;\n\t"
            "div.rn.f32 q, $1, $2;\n\tabs.f32 m, q;\n\tmov.u32 c, 0;\n\t"
            + "".join(f"setp.{'ge' if up else 'gt'}.f32 p, m, {f32_bits(step)};\n\t@p add.u32 c, c, 1;\n\t"
                      for step, up in E2M1_STEPS)
            + "mov.b32 s, q;\n\tshr.u32 s, s, 31;\n\tshl.b32 s, s, 3;\n\tor.b32 $0, c, s;\n\t}")


@cute.jit
def e2m1_code(x: cutlass.Float32, scale: cutlass.Float32) -> cutlass.Uint32:
    return ptx(U32, [x, scale], CODE_PTX, "=r,f,f")


def e2m1_boundary(step: float, up_on_tie: bool) -> float:
    """The real quotient q from which fp32's rounding of q counts `step` (`moe.E2M1_STEPS`): the midpoint of
    the step and its fp32 neighbour below (a tie rounds to the step: counted) or above (a tie rounds to the
    step: not counted), exact as a Python float (25 significant bits)."""
    bits = struct.unpack("<I", struct.pack("<f", step))[0]
    neighbour = struct.unpack("<f", struct.pack("<I", bits - 1 if up_on_tie else bits + 1))[0]
    return (step + neighbour) / 2


# Each step's threshold on |x| for a block of scale s: boundary x s, exact in fp64 (25 + 24 bits), rounded to
# fp32 up for a step a tie rounds up on, else down and then to the next fp32 above (|x| > t is |x| >= next(t)):
# fp32's rounding of |x| / s passes a step exactly when |x| >= its threshold, so the codes need no division
THRESHOLD_PTX = {True: "{\n\t.reg .f64 r;\n\tmul.rn.f64 r, $1, %s;\n\tcvt.rp.f32.f64 $0, r;\n\t}",
                 False: ("{\n\t.reg .f64 r;\n\t.reg .f32 f;\n\t.reg .u32 u;\n\tmul.rn.f64 r, $1, %s;\n\t"
                         "cvt.rm.f32.f64 f, r;\n\tmov.b32 u, f;\n\tadd.u32 u, u, 1;\n\tmov.b32 $0, u;\n\t}")}
# One value's E2M1 code from x ($1) and the seven thresholds ($2..$8, ascending): how many |x| reaches, by a
# three-level search (4, 2, 1), and x's sign bit as bit 3. NaN reaches none: code 0, or 8 with its sign bit set
# (div.rn's NaN has none: such a value's zero keeps x's sign here; its block's scale differs from torch's anyway)
THRESHOLD_CODE_PTX = ("{\n\t.reg .f32 a, t, u;\n\t.reg .u32 c, s;\n\t.reg .pred p, q, r;\n\t"
                      "abs.f32 a, $1;\n\tsetp.ge.f32 p, a, $5;\n\tselp.u32 c, 4, 0, p;\n\t"
                      "selp.f32 t, $7, $3, p;\n\tsetp.ge.f32 q, a, t;\n\t@q add.u32 c, c, 2;\n\t"
                      "selp.f32 t, $8, $6, q;\n\tselp.f32 u, $4, $2, q;\n\tselp.f32 t, t, u, p;\n\t"
                      "setp.ge.f32 r, a, t;\n\t@r add.u32 c, c, 1;\n\t"
                      "mov.b32 s, $1;\n\tshr.u32 s, s, 31;\n\tshl.b32 s, s, 3;\n\tor.b32 $0, c, s;\n\t}")


def f64_bits(value: float) -> str:
    """`value` as a PTX fp64 literal (0dXXXXXXXXXXXXXXXX)."""
    return "0d%016X" % struct.unpack("<Q", struct.pack("<d", value))[0]


@cute.jit
def step_thresholds(scale: cutlass.Float32) -> list:
    """The seven step thresholds (`THRESHOLD_PTX`) of a block whose scale is `scale` (positive, finite)."""
    wide = ptx(cutlass.Float64, [scale], "cvt.f64.f32 $0, $1;", "=d,f")
    return [ptx(F32, [wide], THRESHOLD_PTX[up] % f64_bits(e2m1_boundary(step, up)), "=f,d")
            for step, up in E2M1_STEPS]


@cute.jit
def e2m1_code_by_thresholds(x: cutlass.Float32, thresholds: list) -> cutlass.Uint32:
    """`e2m1_code(x, scale)` from `step_thresholds(scale)`: the same code (a NaN's aside), with no division."""
    return ptx(U32, [x] + thresholds, THRESHOLD_CODE_PTX, "=r,f" + ",f" * len(thresholds))


# A word's two values' E2M1 codes (two 16-bit values of the tokens' type) from the block's seven step
# thresholds in that type, each in both halves ($2..$8, ascending): how many of them |x| reaches, by a
# three-level search (4, 2, 1), two values at a time. A compare makes a half 0xFFFF where |x| reaches its
# threshold, and that mask selects the next level's threshold (lop3 0xE4: c ? a : b). Out: value 0's code in
# bits 0-3, value 1's in bits 4-7, x's sign bit as bit 3 of each. A NaN reaches none: the zero of its sign
# (div.rn's NaN has no sign; such a block's scale differs from torch's anyway). |x| is taken here again, not kept
# from the block's amax: fewer live registers.
PAIR_CODE_PTX = ("{\n\t.reg .b32 a, m, n, r, t, u, v, c;\n\tand.b32 a, $1, 0x7FFF7FFF;\n\t"
                 "set.ge.u32.%(t)s m, a, $5;\n\tlop3.b32 t, $7, $3, m, 0xE4;\n\tset.ge.u32.%(t)s n, a, t;\n\t"
                 "lop3.b32 u, $8, $6, n, 0xE4;\n\tlop3.b32 v, $4, $2, n, 0xE4;\n\tlop3.b32 t, u, v, m, 0xE4;\n\t"
                 "set.ge.u32.%(t)s r, a, t;\n\tand.b32 c, m, 0x00040004;\n\tand.b32 t, n, 0x00020002;\n\t"
                 "or.b32 c, c, t;\n\tand.b32 t, r, 0x00010001;\n\tor.b32 c, c, t;\n\tshr.b32 t, $1, 12;\n\t"
                 "and.b32 t, t, 0x00080008;\n\tor.b32 c, c, t;\n\tshr.b32 t, c, 12;\n\tor.b32 $0, c, t;\n\t}")
# A step threshold (fp32, positive) as the smallest value of the tokens' type at or above it, in both halves of
# a word: for a value x of that type, x >= t exactly when x >= that ceiling (bf16: fp32's upper half, rounded
# up by adding 0xFFFF to the bits; fp16: cvt.rp). Above the type's largest finite value it is inf.
PAIRED_THRESHOLD_PTX = {False: "{\n\t.reg .b32 u;\n\tmov.b32 u, $1;\n\tadd.u32 u, u, 0xFFFF;\n\t"
                               "prmt.b32 $0, u, u, 0x3232;\n\t}",
                        True: "{\n\t.reg .b16 h;\n\tcvt.rp.f16.f32 h, $1;\n\tmov.b32 $0, {h, h};\n\t}"}


def token_type(fp16: bool) -> str:
    """The PTX type of a word of two tokens."""
    return "f16x2" if fp16 else "bf16x2"


@cute.jit
def paired_thresholds(thresholds: list, fp16: cutlass.Constexpr[bool]) -> list:
    """`step_thresholds` as words of the tokens' type (`PAIRED_THRESHOLD_PTX`)."""
    return [ptx(U32, [t], PAIRED_THRESHOLD_PTX[fp16], "=r,f") for t in thresholds]


@cute.jit
def pair_codes(word: cutlass.Uint32, paired: list, fp16: cutlass.Constexpr[bool]) -> cutlass.Uint32:
    """The two codes of a word of tokens, in its low byte (`PAIR_CODE_PTX`); for a positive finite block scale,
    the same as `e2m1_code(x, scale)` of each value (a NaN's aside), with no division."""
    return ptx(U32, [word] + paired, PAIR_CODE_PTX % {"t": token_type(fp16)}, "=r,r" + ",r" * len(paired))


@cute.jit
def magnitude(word: cutlass.Uint32) -> cutlass.Uint32:
    """A word of two tokens without their sign bits: |x| of each."""
    return ptx(U32, [word], "and.b32 $0, $1, 0x7FFF7FFF;", "=r,r")


@cute.jit
def words_amax(magnitudes: list, fp16: cutlass.Constexpr[bool]) -> cutlass.Float32:
    """The largest of a block's 8 words of |x| (`magnitude`; packed max: a NaN counts only where every value is
    one, and then as 0, as fp32's max.f32 from 0 takes it), as an fp32 (exact)."""
    kind = token_type(fp16)
    text = "{\n\t.reg .b32 a<8>;\n\t.reg .f32 l, h;\n\t"
    text += "".join(f"mov.b32 a{i}, ${i + 1};\n\t" for i in range(8))
    text += "".join(f"max.{kind} a{i}, a{i}, a{i + j};\n\t" for j in (4, 2, 1) for i in range(j))
    if cutlass.const_expr(fp16):
        text += "{\n\t.reg .b16 x, y;\n\tmov.b32 {x, y}, a0;\n\tcvt.f32.f16 l, x;\n\tcvt.f32.f16 h, y;\n\t}\n\t"
    else:
        text += "shl.b32 a1, a0, 16;\n\tand.b32 a2, a0, 0xFFFF0000;\n\tmov.b32 l, a1;\n\tmov.b32 h, a2;\n\t"
    text += f"max.f32 l, l, h;\n\tmax.f32 $0, l, {f32_bits(0.0)};\n\t}}"
    return ptx(F32, magnitudes, text, "=f" + ",r" * 8)


@cute.jit
def fill_threshold_table(table, byte, decode: cutlass.Float32, fp16: cutlass.Constexpr[bool]) -> None:
    """Entry `byte` of the threshold table: the paired thresholds (`paired_thresholds`) of a block whose scale
    byte it is, with the kernel's decode scale (1 without one); whatever they come to where that block scale is
    not positive and finite (never read: such a block's codes are computed by division)."""
    words = paired_thresholds(step_thresholds(e4m3_value(byte) * decode), fp16)
    for i in cutlass.range_constexpr(len(E2M1_STEPS)):
        table[byte * TABLE_WORDS + i] = words[i]


def table_entry(table, byte):
    """The threshold table's entry for scale byte `byte` (< TABLE_BYTES: a clamped scale's): its 8 words, two
    16-byte loads."""
    return shared_words(table.iterator.toint() + byte * (TABLE_WORDS * 4), TABLE_WORDS, 32)


@cute.jit
def pack_pair_codes(codes, words, paired: list, fp16: cutlass.Constexpr[bool]) -> None:
    """The 16 codes of a block's 8 words into the two words of `codes` (value i at bits 4 (i % 8) of word
    i // 8): each word's two codes (`pair_codes`) as one byte, four bytes gathered by prmt."""
    for half in cutlass.range_constexpr(2):
        pairs = [pair_codes(words[4 * half + i], paired, fp16) for i in range(4)]
        low = ptx(U32, [pairs[0], pairs[1]], "prmt.b32 $0, $1, $2, 0x0040;", "=r,r,r")
        high = ptx(U32, [pairs[2], pairs[3]], "prmt.b32 $0, $1, $2, 0x0040;", "=r,r,r")
        codes[half] = ptx(U32, [low, high], "prmt.b32 $0, $1, $2, 0x5410;", "=r,r,r")


def pack_codes(codes, values: list, code_of) -> None:
    """The 16 values' 4-bit codes (`code_of`) into the two words of `codes`, value i at bits 4 (i % 8) of word
    i // 8 (Python loops: unrolled where traced)."""
    for half in range(2):
        word = cutlass.Uint32(0)
        for i in range(8):
            word = word | (code_of(values[8 * half + i]) << (4 * i))
        codes[half] = word


@cute.jit
def positive_finite(value: cutlass.Float32) -> cutlass.Uint32:
    """1 where 0 < value < inf, else 0 (NaN too)."""
    return ptx(U32, [value], f"{{\n\t.reg .pred p;\n\tsetp.gt.f32 p, $1, {f32_bits(0.0)};\n\t"
               f"@p setp.lt.f32 p, $1, {f32_bits(float('inf'))};\n\tselp.u32 $0, 1, 0, p;\n\t}}", "=r,f")


@cute.jit
def div_rn(x: cutlass.Float32, y: cutlass.Float32) -> cutlass.Float32:
    """x / y rounded to nearest (IEEE), as torch divides."""
    return ptx(F32, [x, y], "div.rn.f32 $0, $1, $2;", "=f,f,f")


@cute.jit
def e4m3_round(value: cutlass.Float32) -> cutlass.Uint32:
    """`value` (in [2^-6, 448]) rounded to E4M3 (nearest, ties to even): its byte, in the low 8 bits."""
    return ptx(U32, [value], f"{{\n\t.reg .b16 h;\n\t.reg .f32 z;\n\tmov.f32 z, {f32_bits(0.0)};\n\t"
               "cvt.rn.satfinite.e4m3x2.f32 h, z, $1;\n\tcvt.u32.u16 $0, h;\n\tand.b32 $0, $0, 255;\n\t}", "=r,f")


@cute.jit
def e4m3_value(byte: cutlass.Uint32) -> cutlass.Float32:
    """The E4M3 byte's value (exact in fp32)."""
    return ptx(F32, [byte], "{\n\t.reg .b16 h, l;\n\t.reg .b32 w;\n\tcvt.u16.u32 h, $1;\n\t"
               "cvt.rn.f16x2.e4m3x2 w, h;\n\tmov.b32 {l, h}, w;\n\tcvt.f32.f16 $0, l;\n\t}", "=f,r")


@cute.jit
def token_values(word: cutlass.Uint32, fp16: cutlass.Constexpr[bool]):
    """The two fp32 values of a 32-bit word of bf16 or fp16 tokens (low half first)."""
    if cutlass.const_expr(fp16):
        half = "{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, $1;\n\tcvt.f32.f16 $0, %s;\n\t}"
        return ptx(F32, [word], half % "l", "=f,r"), ptx(F32, [word], half % "h", "=f,r")
    return ptx(F32, [word], "shl.b32 $0, $1, 16;", "=f,r"), ptx(F32, [word], "and.b32 $0, $1, 0xFFFF0000;", "=f,r")


@dataclasses.dataclass(frozen=True)
class TokenQuantizerConfig:
    """What a compiled quantizer is specific to: the tokens' type, the decode scale's kind, whether it
    quantizes x itself or SwiGLU of x (`activation`: gate and up in halves or interleaved; `limit`: clamped),
    and `paired`: a block's amax and codes two values at a time, on words of the tokens' type (`quantize_block`),
    its loads issued a block ahead, the one decode scale read once, instead of value by value in fp32.
    `threshold_table` (paired, one decode scale or none): a block's seven paired thresholds are a function of its
    scale byte alone, so each CTA computes them once for every byte into shared memory (`fill_threshold_table`)
    and a block reads its entry (two 16-byte loads) where it computed them (about 40 instructions).
    `lean_loop`: a thread's group's end row and the shift from a row to its scale row stay in registers, looked
    up in shared memory again only where a block's row is past that end (each block looked up its group's end,
    first row and P_g), and a paired configuration issues the next block's loads whether there is one or not (the
    last block again past the end), so that no branch keeps its words apart from where the next block reads them;
    the loop over a thread's items is a plain while (the range loop's step, of a sign unknown to the compiler,
    holds more registers). Fewer instructions a block, and the threshold table's kernel of x's own blocks fits
    one CTA more an SM (`LEAN_TABLE_CTAS_PER_SM`; the SASS counts are in docs/moe.md)."""
    fp16: bool = False
    scale_kind: int = NO_SCALE
    activation: str = ""
    limit: bool = False
    paired: bool = False
    threshold_table: bool = False
    lean_loop: bool = False

    def __post_init__(self):
        if self.threshold_table and (not self.paired or self.scale_kind == PER_EXPERT):
            raise ValueError(f"{self.name}: the threshold table is for paired configurations of one decode scale "
                             "or none (a block's thresholds then follow from its scale byte alone)")

    @property
    def name(self) -> str:
        return ("quantize-tokens-" + ("fp16" if self.fp16 else "bf16")
                + ("", "-scale", "-expert-scales")[self.scale_kind]
                + (f"-swiglu-{self.activation}" + ("-limit" if self.limit else "") if self.activation else "")
                + ("-paired" if self.paired else "") + ("-table" if self.threshold_table else "")
                + ("-lean" if self.lean_loop else ""))


def shared_storage(config: TokenQuantizerConfig):
    """The kernel's shared memory for `config`: the groups' end rows and first scale rows; the threshold table
    where it has one."""
    fields = {"ends": cute.struct.MemRange[cutlass.Int32, MAX_EXPERTS + 1],
              "scale_rows": cute.struct.MemRange[cutlass.Int32, MAX_EXPERTS + 1]}
    if config.threshold_table:
        fields["thresholds"] = cute.struct.Align[cute.struct.MemRange[cutlass.Uint32, TABLE_BYTES * TABLE_WORDS], 32]
    return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))


class TokenQuantizer:
    """The kernel and its host function (`__call__`) for one `TokenQuantizerConfig`."""

    def __init__(self, config: TokenQuantizerConfig):
        self.config = config

    @cute.jit
    def __call__(self, ptr_x: cute.Pointer, ptr_offs: cute.Pointer, ptr_packed: cute.Pointer,
                 ptr_scales: cute.Pointer, ptr_global: cute.Pointer, tokens: cutlass.Int32, k: cutlass.Int32,
                 experts: cutlass.Int32, rows: cutlass.Int32, ctas: cutlass.Int32, alpha_bits: cutlass.Int32,
                 beta_bits: cutlass.Int32, limit_bits: cutlass.Int32, stream):
        """x (T, K) bf16 / fp16 as 32-bit words ((T, 2K) with an activation: K its output's columns), offs (E,),
        packed (T, K/2) as words, the scale buffer (`rows` blocked rows of K/16 bytes), the decode scale(s) (read
        only where the configuration has them); `ctas` CTAs of THREADS threads; SwiGLU's alpha, beta and limit
        as the bits of fp32 values (read only with an activation)."""

        self.shared_storage = shared_storage(self.config)
        x = cute.make_tensor(ptr_x, cute.make_layout(tokens * (k if cutlass.const_expr(self.config.activation)
                                                             else k // 2)))
        offs = cute.make_tensor(ptr_offs, cute.make_layout(experts))
        packed = cute.make_tensor(ptr_packed, cute.make_layout(tokens * (k // 8)))
        scales = cute.make_tensor(ptr_scales, cute.make_layout(rows * (k // SF_VEC_SIZE)))
        global_scale = cute.make_tensor(ptr_global, cute.make_layout(experts))
        swiglu = (alpha_bits, beta_bits, limit_bits)
        self.kernel(x, offs, packed, scales, global_scale, tokens, k, experts, rows, swiglu).launch(
            grid=(ctas, 1, 1), block=(THREADS, 1, 1), smem=self.shared_storage.size_in_bytes(), stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, offs: cute.Tensor, packed: cute.Tensor, scales: cute.Tensor,
               global_scale: cute.Tensor, tokens: cutlass.Int32, k: cutlass.Int32, experts: cutlass.Int32,
               rows: cutlass.Int32, swiglu: tuple):
        """The groups into shared memory (`find_groups`, one warp), then, grid-stride, the token blocks
        (`quantize_block`) and after them the scale buffer's words (`zero_padding`)."""
        storage = submission.SmemAllocator().allocate(self.shared_storage)
        ends, scale_rows = storage.ends.get_tensor(cute.make_layout(MAX_EXPERTS + 1)), \
            storage.scale_rows.get_tensor(cute.make_layout(MAX_EXPERTS + 1))
        tidx, _, _ = cute.arch.thread_idx()
        block, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        # paired, without an activation: each block's two loads are issued one block ahead (`ahead`), so that a
        # thread has a load in flight while it converts; the first before the groups are found (it needs none)
        ahead = cute.make_rmem_tensor((8,), cutlass.Uint32) if cutlass.const_expr(self.config.paired) else None
        if cutlass.const_expr(self.config.paired and not self.config.activation):
            if block * THREADS + tidx < tokens * (k // SF_VEC_SIZE):
                cute.autovec_copy(token_words(x, block * THREADS + tidx), ahead)
        decode = cutlass.Float32(1.0)  # a paired configuration's one decode scale, read once
        table = None
        if cutlass.const_expr(self.config.threshold_table):
            if cutlass.const_expr(self.config.scale_kind == ONE_SCALE):
                decode = global_scale[0]
            table = storage.thresholds.get_tensor(cute.make_layout(TABLE_BYTES * TABLE_WORDS))
            if tidx >= THREADS - TABLE_BYTES:  # the warps that do not find the groups
                fill_threshold_table(table, tidx - (THREADS - TABLE_BYTES), decode, self.config.fp16)
        if tidx < 32:
            self.find_groups(offs, experts, tokens, ends, scale_rows)
        cute.arch.sync_threads()
        blocks_per_row = k // SF_VEC_SIZE
        token_blocks = tokens * blocks_per_row
        words_per_row = blocks_per_row // 4
        work = token_blocks + rows * words_per_row
        stride = grid * THREADS
        first = block * THREADS + tidx
        # a thread's token blocks come in row order: each one's row, column and group follow from the one
        # before (no division or search per block; ends[E] is past every row); with a lean loop its group's end
        # row and scale shift too, looked up again only where a block's row is past that end
        lean = self.config.lean_loop
        row = first // blocks_per_row
        column = first - row * blocks_per_row
        step_rows = stride // blocks_per_row
        step_columns = stride - step_rows * blocks_per_row
        group = self.group_of(ends, experts, row)
        group_end, scale_shift = cutlass.Int32(0), cutlass.Int32(0)
        if cutlass.const_expr(lean):
            group_end, scale_shift = ends[group], self.scale_shift(ends, scale_rows, group)
        if cutlass.const_expr(self.config.paired and self.config.scale_kind == ONE_SCALE
                              and not self.config.threshold_table):
            decode = global_scale[0]
        layout = (experts, token_blocks, blocks_per_row, words_per_row, stride)
        tensors = (x, packed, scales, global_scale, ends, scale_rows, table)
        if cutlass.const_expr(lean):  # a plain while: the range loop's step of either sign holds more registers
            at = first  # (not `item`: DSL 4.5.2 refuses a name bound here and as the other branch's loop target)
            while at < work:
                group, group_end, scale_shift = self.take_item(tensors, layout, decode, swiglu, ahead, at, row,
                                                               column, group, group_end, scale_shift)
                row, column = next_place(row, column, step_rows, step_columns, blocks_per_row)
                at += stride
        else:
            for item in cutlass.range(first, work, stride, unroll=1):
                group, group_end, scale_shift = self.take_item(tensors, layout, decode, swiglu, ahead, item, row,
                                                               column, group, group_end, scale_shift)
                row, column = next_place(row, column, step_rows, step_columns, blocks_per_row)

    @cute.jit
    def take_item(self, tensors, layout, decode, swiglu, ahead, item, row, column, group, group_end, scale_shift):
        """A thread's item `item` (at `row`, `column`, in `group`): a token block (`quantize_block`) or a word of
        the scale buffer's padding (`zero_padding`); returns its group, with a lean loop that group's end row and
        scale shift (`scale_shift`)."""
        x, packed, scales, global_scale, ends, scale_rows, table = tensors
        experts, token_blocks, blocks_per_row, words_per_row, stride = layout
        lean = self.config.lean_loop
        if item < token_blocks:
            if cutlass.const_expr(lean):
                if row >= group_end:
                    while ends[group] <= row:
                        group += 1
                    group_end, scale_shift = ends[group], self.scale_shift(ends, scale_rows, group)
            else:
                while ends[group] <= row:
                    group += 1
            if cutlass.const_expr(self.config.paired):
                words = cute.make_rmem_tensor((8,), cutlass.Uint32)
                if cutlass.const_expr(not self.config.activation):
                    words.store(ahead.load())
                    if cutlass.const_expr(lean):  # whatever the next block is (past the end: the last again)
                        later = item + stride
                        if later >= token_blocks:
                            later = token_blocks - 1
                        cute.autovec_copy(token_words(x, later), ahead)
                    elif item + stride < token_blocks:
                        cute.autovec_copy(token_words(x, item + stride), ahead)
                else:
                    values = self.block_values(x, item, row, column, blocks_per_row, swiglu)
                    pair = "cvt.rn.%s.f32 $0, $2, $1;" % token_type(self.config.fp16)  # exact: of the type
                    for i in cutlass.range_constexpr(8):
                        words[i] = ptx(U32, [values[2 * i], values[2 * i + 1]], pair, "=r,f,f")
            else:
                words = None
            self.quantize_block(x, packed, scales, global_scale, decode, ends, scale_rows, scale_shift, experts,
                                item, row, column, group, blocks_per_row, swiglu, words, table)
        else:
            self.zero_padding(scales, ends, scale_rows, experts, item - token_blocks, words_per_row)
        return group, group_end, scale_shift

    @cute.jit
    def find_groups(self, offs, experts, tokens, ends, scale_rows):
        """One warp: each group's end row (`moe_tables.clamped_bounds`: at most T, never before an earlier
        group's) into ends[g], its first scale row P_g into scale_rows[g], and P_E (the rows the groups' blocks
        take) into scale_rows[E]."""
        lane = cute.arch.lane_idx()
        carried, carried_rows = cutlass.Int32(0), cutlass.Int32(0)
        for first in cutlass.range(0, experts, 32, unroll=1):
            g = first + lane
            begin, end = moe_tables.clamped_bounds(offs, g, experts, tokens, carried)
            first_scale_row, carried_rows = moe_tables.first_scale_rows(begin, end, carried_rows)
            if g < experts:
                ends[g] = end
                scale_rows[g] = first_scale_row
            carried = cute.arch.shuffle_sync(end, 31)
        if lane == 0:
            scale_rows[experts] = carried_rows
            ends[experts] = cutlass.Int32(2 ** 31 - 1)  # past every row: a forward search for a row's group ends

    @cute.jit
    def group_of(self, table, experts, value):
        """The first group whose entry in `table` (non-decreasing, E entries) exceeds `value` (E: none)."""
        low, high = cutlass.Int32(0), experts
        while low < high:
            middle = (low + high) // 2
            if table[middle] <= value:
                low = middle + 1
            else:
                high = middle
        return low

    @cute.jit
    def scale_shift(self, ends, scale_rows, group):
        """What a row of group `group` adds to become its scale row: P_g less the group's first row."""
        first = cutlass.Int32(0)
        if group > 0:
            first = ends[group - 1]
        return scale_rows[group] - first

    @cute.jit
    def quantize_block(self, x, packed, scales, global_scale, decode, ends, scale_rows, scale_shift, experts, item,
                       row, column, group, blocks_per_row, swiglu, words, table):
        """16 values of x (or of SwiGLU of x: `block_values`), block `item` (row `row`, column `column`, in
        group `group`: E for a row past offs[-1]): their scale (to its blocked place, for a row of a group; with a
        lean loop its scale row is `row` + `scale_shift`) and their codes. A paired configuration has them as
        `words`, 8 words of the tokens' type (its amax and codes two values at a time), and its one decode scale in
        `decode`, read before the loop; with a threshold table (shared memory, `fill_threshold_table`), its
        thresholds from there."""
        fp16 = self.config.fp16
        if cutlass.const_expr(self.config.paired):
            amax = words_amax([magnitude(words[i]) for i in range(8)], fp16)
        else:
            values = self.block_values(x, item, row, column, blocks_per_row, swiglu)
            amax = cutlass.Float32(0.0)
            for v in values:
                amax = ptx(F32, [amax, v], "{\n\t.reg .f32 a;\n\tabs.f32 a, $2;\n\tmax.f32 $0, $1, a;\n\t}",
                           "=f,f,f")
        scale = div_rn(amax, cutlass.Float32(6.0))
        if cutlass.const_expr(self.config.scale_kind == ONE_SCALE and not self.config.paired):
            decode = global_scale[0]
        if cutlass.const_expr(self.config.scale_kind == PER_EXPERT):
            expert = group
            if expert >= experts:
                expert = experts - 1
            decode = global_scale[expert]
        if cutlass.const_expr(self.config.scale_kind != NO_SCALE):
            scale = div_rn(scale, decode)
        clamp = "{\n\t.reg .f32 t;\n\tmax.f32 t, $1, 0f3C800000;\n\tmin.f32 $0, t, 0f43E00000;\n\t}"
        scale = ptx(F32, [scale], clamp, "=f,f")  # to [2^-6, 448]
        byte = e4m3_round(scale)
        block_scale = e4m3_value(byte)
        if cutlass.const_expr(self.config.scale_kind != NO_SCALE):
            block_scale = block_scale * decode
        codes = cute.make_rmem_tensor((2,), cutlass.Uint32)
        if positive_finite(block_scale) != 0:  # every block but one of a decode scale <= 0, inf or NaN
            if cutlass.const_expr(self.config.threshold_table):
                entry = cute.make_rmem_tensor((TABLE_WORDS,), cutlass.Uint32)
                cute.autovec_copy(table_entry(table, byte), entry)
                pack_pair_codes(codes, words, [entry[i] for i in range(len(E2M1_STEPS))], fp16)
            elif cutlass.const_expr(self.config.paired):
                pack_pair_codes(codes, words, paired_thresholds(step_thresholds(block_scale), fp16), fp16)
            else:
                thresholds = step_thresholds(block_scale)
                pack_codes(codes, values, lambda v: e2m1_code_by_thresholds(v, thresholds))
        else:  # fp32's division itself, whatever it makes of such a scale
            if cutlass.const_expr(self.config.paired):
                pack_codes(codes, word_values(words, fp16), lambda v: e2m1_code(v, block_scale))
            else:
                pack_codes(codes, values, lambda v: e2m1_code(v, block_scale))
        cute.autovec_copy(codes, global_words(packed.iterator.toint() + cutlass.Int64(item) * 8, 2, 8))
        if group < experts:
            if cutlass.const_expr(not self.config.lean_loop):  # a lean loop holds its group's shift
                scale_shift = self.scale_shift(ends, scale_rows, group)
            scales[blocked_offset(row + scale_shift, column, blocks_per_row)] = cutlass.Uint8(byte)

    @cute.jit
    def block_values(self, x, item, row, column, blocks_per_row, swiglu):
        """The 16 fp32 values of block `item`: x's (two 16-byte loads); with an activation, SwiGLU of the
        row's gate and up (`swiglu_value`, from four 16-byte loads: the two halves' blocks, or 32 interleaved
        values), rounded to the tokens' type as torch's composition stores them."""
        fp16 = self.config.fp16
        values = []
        if cutlass.const_expr(not self.config.activation):
            words = cute.make_rmem_tensor((8,), cutlass.Uint32)
            cute.autovec_copy(global_words(x.iterator.toint() + cutlass.Int64(item) * 32, 8, 16), words)
            for i in cutlass.range_constexpr(8):
                low, high = token_values(words[i], fp16)
                values += [low, high]
        else:
            alpha, beta, limit = (ptx(F32, [bits], "mov.b32 $0, $1;", "=f,r") for bits in swiglu)
            row_words = x.iterator.toint() + cutlass.Int64(row) * cutlass.Int64(blocks_per_row * 16 * 4)
            gates, ups = [], []
            if cutlass.const_expr(self.config.activation == "halves"):  # gate columns, then up columns
                for half, out in ((0, gates), (1, ups)):
                    words = cute.make_rmem_tensor((8,), cutlass.Uint32)
                    start = row_words + (cutlass.Int64(half * blocks_per_row * 8) + column * 8) * 4
                    cute.autovec_copy(global_words(start, 8, 16), words)
                    for i in cutlass.range_constexpr(8):
                        low, high = token_values(words[i], fp16)
                        out += [low, high]
            else:  # gate, up, gate, up, ...: a 32-bit word is one (gate, up) pair
                words = cute.make_rmem_tensor((16,), cutlass.Uint32)
                cute.autovec_copy(global_words(row_words + cutlass.Int64(column) * 64, 16, 16), words)
                for i in cutlass.range_constexpr(16):
                    gate, up = token_values(words[i], fp16)
                    gates.append(gate)
                    ups.append(up)
            for gate, up in zip(gates, ups):
                values.append(swiglu_value(gate, up, alpha, beta, limit, self.config.limit, fp16))
        return values

    @cute.jit
    def zero_padding(self, scales, ends, scale_rows, experts, word, words_per_row):
        """One 4-byte word of the scale buffer: zero where its row is no token's (past a group's rows within its
        128-row block, or past P_E)."""
        row = word // words_per_row
        column = (word - row * words_per_row) * 4
        group = self.group_of(scale_rows, experts + 1, row) - 1  # the last group whose P_g <= row (E: past P_E)
        tokens_in_block = cutlass.Int32(0)
        if group < experts:
            first = cutlass.Int32(0)
            if group > 0:
                first = ends[group - 1]
            tokens_in_block = ends[group] - first
        if row - scale_rows[group] >= tokens_in_block:
            offset = blocked_offset(row, column, words_per_row * 4)
            zero = cute.make_rmem_tensor((1,), cutlass.Uint32)
            zero[0] = cutlass.Uint32(0)
            cute.autovec_copy(zero, global_words(scales.iterator.toint() + offset, 1, 4))


@cute.jit
def next_place(row, column, step_rows, step_columns, blocks_per_row):
    """The row and column of a thread's next block, a grid stride on (`step_rows` rows and `step_columns`
    columns, carrying into the next row)."""
    row += step_rows
    column += step_columns
    if column >= blocks_per_row:
        column -= blocks_per_row
        row += 1
    return row, column


def global_words(address, count: int, align: int, space=cute.AddressSpace.gmem):
    """`count` 32-bit words of global memory (or of `space`) at `address` (aligned to `align` bytes): one vector
    access."""
    return cute.make_tensor(cute.make_ptr(cutlass.Uint32, address, space, assumed_align=align),
                            cute.make_layout(count))


def shared_words(address, count: int, align: int):
    """`global_words` of shared memory."""
    return global_words(address, count, align, cute.AddressSpace.smem)


def word_values(words, fp16: bool) -> list:
    """The 16 fp32 values of 8 words of tokens (`token_values`, low half first)."""
    values = []
    for i in range(8):
        values += list(token_values(words[i], fp16))
    return values


def token_words(x, item):
    """Block `item`'s 8 words of x (32 bytes: two 16-byte loads)."""
    return global_words(x.iterator.toint() + cutlass.Int64(item) * 32, 8, 16)


@cute.jit
def swiglu_value(gate, up, alpha, beta, limit, clamped: cutlass.Constexpr[bool], fp16: cutlass.Constexpr[bool]):
    """`mlp.swiglu` of one (gate, up) pair as torch's ops compute it, each op rounded to fp32 on its own (explicit
    .rn PTX: nothing contracted across them): gate clamped to at most `limit` and up to [-limit, limit] where
    `clamped`; gate * sigmoid(alpha * gate) * (up + beta), the sigmoid as torch's kernel writes it
    (1 / (1 + exp(-x)), libdevice's expf); then rounded to the tokens' type and back (exact)."""
    if cutlass.const_expr(clamped):
        gate = ptx(F32, [gate, limit], "min.f32 $0, $1, $2;", "=f,f,f")
        up = ptx(F32, [up, limit], "{\n\t.reg .f32 t, n;\n\tmin.f32 t, $1, $2;\n\tneg.f32 n, $2;\n\t"
                                   "max.f32 $0, t, n;\n\t}", "=f,f,f")
    scaled = ptx(F32, [alpha, gate], "mul.rn.f32 $0, $1, $2;", "=f,f,f")
    sigmoid = cutlass.Float32(1.0) / (cutlass.Float32(1.0) + cute.math.exp(-scaled, fastmath=False))
    product = ptx(F32, [gate, sigmoid], "mul.rn.f32 $0, $1, $2;", "=f,f,f")
    shifted = ptx(F32, [up, beta], "add.rn.f32 $0, $1, $2;", "=f,f,f")
    value = ptx(F32, [product, shifted], "mul.rn.f32 $0, $1, $2;", "=f,f,f")
    to_type = ("cvt.rn.f16.f32 h, $1;\n\tcvt.f32.f16 $0, h;" if cutlass.const_expr(fp16) else
               "cvt.rn.bf16.f32 h, $1;\n\tmov.b16 z, 0;\n\tmov.b32 w, {z, h};\n\tmov.b32 $0, w;")
    return ptx(F32, [value], "{\n\t.reg .b16 h, z;\n\t.reg .b32 w;\n\t" + to_type + "\n\t}", "=f,f")


@cute.jit
def blocked_offset(row, column, width):
    """The byte of scale row `row`, column `column` in the 128x4-blocked layout `width` bytes a row
    (`moe.scale_offsets`). Row and column are never negative, so shifts and masks compute it, without signed
    division's corrections (30 fewer instructions a block)."""
    return (cutlass.Int64(row >> 7) * (BLOCK_ROWS * width) + (column >> 2) * 512 + (row & 31) * 16
            + ((row >> 5) & 3) * 4 + (column & 3))


ARGUMENTS = submission.argument_spec(TokenQuantizer.__call__, POINTERS)


@functools.lru_cache(maxsize=None)
def compiled(config: TokenQuantizerConfig, arch: str):
    """The quantizer's host function for `config` on `arch` (`submission.target_arch`), compiled once."""
    return submission.compile_with_placeholders(TokenQuantizer(config).__call__, ARGUMENTS)


class QuantizerLaunch:
    """What calls of one kind (`quantize_tokens`' key) share on one stream: the cells the launch reads the
    call's arguments from (`moe.CallCells`, ARGUMENTS' order), SwiGLU's options as the kernel takes them, and the
    launch, bound at the first call (`moe.ChangingLaunch`)."""

    def __init__(self, host, stream: int, options: tuple):
        self.cells = moe.CallCells(ARGUMENTS.names)
        self.options = options  # alpha_bits, beta_bits, limit_bits
        self.changing, self.launch = moe.ChangingLaunch(host, {}, stream, self.cells), None

    def __call__(self, values: tuple) -> None:
        self.cells.write(values)
        if self.launch is None:
            self.launch = self.changing.bind()
        self.launch()


# (dtype, scale kind, swiglu options, paired, threshold table, lean loop, device index, stream) -> its launch
_launches = {}


@functools.lru_cache(maxsize=None)
def kernel_device(index: int) -> bool:
    """Whether CUDA device `index` is one the kernel is built for (sm_90, sm_100)."""
    return torch.cuda.get_device_capability(index) in ((9, 0), (10, 0))


def runs_on(x: torch.Tensor, offs: torch.Tensor, global_scale: Optional[torch.Tensor],
            swiglu: bool = False) -> bool:
    """Whether the kernel takes this call: a CUDA Hopper or B200, bf16 / fp16 tokens, K a multiple of
    K_MULTIPLE (with `swiglu`: K / 2, the output's), aligned contiguous tensors, at most MAX_EXPERTS experts."""
    if not x.is_cuda or x.dtype not in (torch.bfloat16, torch.float16) or x.dim() != 2:
        return False
    if not kernel_device(moe.cuda_index(x)):
        return False
    if (x.shape[1] % (K_MULTIPLE * (2 if swiglu else 1)) or not x.is_contiguous() or x.data_ptr() % 16
            or offs.numel() > MAX_EXPERTS):
        return False
    if x.numel() >= 2 ** 31:  # the kernel counts x's 32-bit words and blocks in Int32
        return False
    return global_scale is None or global_scale.is_contiguous()


@functools.lru_cache(maxsize=256)
def f32_as_int32(value: float) -> int:
    """The bits of `value` as an fp32, as a signed 32-bit integer (a host function's Int32 argument); a layer
    passes the same few options every call."""
    return struct.unpack("<i", struct.pack("<f", value))[0]


def configuration_label() -> str:
    """What `quantize_tokens` compiles for x's own blocks, in words: the settings `PAIRED`, `THRESHOLD_TABLE`
    (where a decode scale is one value or none) and `LEAN_LOOP`."""
    lean = ", lean loop" if LEAN_LOOP else ""
    if not PAIRED:
        return "value by value" + lean
    return "paired" + (", threshold table" if THRESHOLD_TABLE else "") + lean


def grid_per_sm(swiglu: bool, table: bool = False, lean: bool = False) -> int:
    """The grid's CTAs an SM at most, for the configurations `PAIRED`, `THRESHOLD_TABLE` and `LEAN_LOOP` pick."""
    if table:
        return LEAN_TABLE_CTAS_PER_SM if lean and not swiglu else TABLE_CTAS_PER_SM
    if not PAIRED:
        return CTAS_PER_SM
    return PAIRED_SWIGLU_CTAS_PER_SM if swiglu else PAIRED_CTAS_PER_SM


def quantize_tokens(x: torch.Tensor, offs: torch.Tensor, global_scale: Optional[torch.Tensor], rows: int,
                    swiglu: Optional[tuple] = None):
    """The kernel's (packed, scales) for a call `runs_on` takes (the caller checked the arguments): new tensors,
    launched on the current stream, nothing read on the host. `swiglu` (layout, alpha, beta, limit or None):
    quantize `mlp.swiglu` of x ((T, 2K): gate and up) instead of x, in the same kernel. A (configuration, device,
    stream) keeps its launch, whose arguments each call writes to its cells (`QuantizerLaunch`)."""
    tokens, k = x.shape[0], x.shape[1] // (2 if swiglu else 1)
    experts = offs.numel()
    packed = torch.empty(tokens, k // 2, dtype=torch.uint8, device=x.device)
    blocked = torch.empty(rows, scale_width(k), dtype=torch.uint8, device=x.device)
    kind = NO_SCALE if global_scale is None else ONE_SCALE if global_scale.numel() == 1 else PER_EXPERT
    work = tokens * (k // SF_VEC_SIZE) + rows * scale_width(k) // 4
    if work:
        index = moe.cuda_index(x)
        stream = submission.current_stream_handle(index)
        table = THRESHOLD_TABLE and PAIRED and kind != PER_EXPERT
        key = (x.dtype, kind, swiglu, PAIRED, table, LEAN_LOOP, index, stream)
        entry = _launches.get(key)
        if entry is None:
            layout, alpha, beta, limit = swiglu if swiglu else ("", 1.0, 0.0, None)
            config = TokenQuantizerConfig(fp16=x.dtype == torch.float16, scale_kind=kind, activation=layout,
                                          limit=limit is not None, paired=PAIRED, threshold_table=table,
                                          lean_loop=LEAN_LOOP)
            with torch.cuda.device(index):
                host = submission.HostFunction(compiled(config, submission.target_arch()), ARGUMENTS, index)
            entry = _launches.setdefault(key, QuantizerLaunch(host, stream, (
                f32_as_int32(alpha), f32_as_int32(beta), f32_as_int32(limit if limit is not None else 0.0))))
        offs32 = offs if offs.dtype == torch.int32 and offs.is_contiguous() else offs.to(torch.int32).contiguous()
        scale = (global_scale if global_scale.dtype == torch.float32 else global_scale.float()) if (
            global_scale is not None) else None
        # ARGUMENTS' order: ptr_x, ptr_offs, ptr_packed, ptr_scales, ptr_global, tokens, k, experts, rows, ctas,
        # alpha_bits, beta_bits, limit_bits
        ctas = min(-(-work // THREADS), grid_per_sm(swiglu is not None, table, LEAN_LOOP)
                   * submission.sm_count(index))
        values = (x.data_ptr(), offs32.data_ptr(), packed.data_ptr(), blocked.data_ptr(),
                  scale.data_ptr() if scale is not None else 0, tokens, k, experts, rows, ctas) + entry.options
        if index == torch.cuda.current_device():
            entry(values)
        else:
            with torch.cuda.device(index):
                entry(values)
    return packed, blocked.view(torch.float8_e4m3fn)
