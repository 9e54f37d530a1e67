"""NVFP4 block-scaled grouped GEMM for Hopper (sm_90a): the same operation and
input contract as `submission.py` (docs/contract.md), for the H100 and H200.
Importing this module makes it custom_kernel's path on sm_90
(`launch.register_path`, from hopper_policy.py).

Hopper has no FP4 tensor-core instruction, so the kernel dequantizes:

    C[m, n] = fp16( sum_k a(m,k) sfa(m,k/16) b(n,k) sfb(n,k/16) )

One kernel per call (the form "weights in registers"), in two phases:

- Tokens, once per call: after griddepcontrol.wait the MMA warps of all CTAs
  convert every group's A (the tokens, M <= a few hundred rows) to fp16,
  scaled, into the plan's scratch (`scratch_address`, sized by
  `Sm90TileConfig.plan_words` on the host): each warp claims units (one row's
  stage of tile_k K) from a counter in the plan's memory until none is left,
  stages a claim's units in its rows of the token stages (shared memory no
  token load fills before every unit is converted), stores them to the
  scratch, where they are contiguous, 512 bytes per instruction, and counts
  them (`convert_token_share`). The producer requests
  its first stages' weights at once and their tokens once every unit is
  converted (`wait_for_tokens`). Claims, not fixed shares: no CTA waits for
  one that has not started; the last CTA past the wait sets the counters back
  to zero (`pass_token_counters`). Launches of one plan must be ordered (one
  stream, or events between streams): unordered ones would share the counters.
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
  (`stage_k_order`) that the token conversion stores the tokens in.

- The conversion: an E2M1 nibble n placed as the fp16 bit pattern
  (n & 8) << 12 | (n & 7) << 9 is value * 2^-14 (zero, subnormal 0.5 and
  normal values alike), and one `mul.rn.f16x2` by fp16(scale) * 2^7 makes
  value * scale * 2^-7, exactly (at most 5 significant bits, magnitudes
  2^-17 .. 21). The product of two such operands is the true product * 2^-14;
  the epilogue multiplies the fp32 accumulator by 2^14 (exact) and rounds to
  fp16. Each packed 32-bit word (8 consecutive K) yields its fp16 pairs
  (0,4), (1,5), (2,6), (3,7) with shifts by constants (`dequant_word`). Both
  operands (the weights' fragments and the converted tokens) hold the same
  physical K at each of wgmma's K positions (`stage_k_order`), which leaves
  every dot product unchanged.

Persistent: at most one CTA (or pair) per SM walks the tiles of all groups
with the B200 kernel's scheduler (`submission.TileScheduler`), on the same
run-time tables and host path (`submission.GroupedGemmLauncher`). Per shape set
custom_kernel picks the form (`hopper_policy.sm90_choice`, a cost model fitted to H200
timings) and the schedule (`sm90_schedule`) unless `hopper_policy.CONFIG_ENV` names them.
The pair forms (cta_group 2) run each tile of tile_m tokens x 256 weight rows
on a (2,1,1) cluster: each CTA converts and multiplies its 128 weight rows,
and loads half of each token stage into both CTAs (TMA multicast), so that the
tokens, four fifths of a CTA's bytes per stage, are read from the L2 once per
pair. Token widths: a tile's wgmma N is the narrowest of its form's
`token_widths` (at most three: one mainloop each, as ptxas serializes every
wgmma from four on) that holds the tile's rows, so that a group of 16 tokens
multiplies 16 rows, not tile_m (each width's accumulators its own registers,
`token_tile`); token rows past a group's end are not loaded (TMA's bounds)
except in the MoE form (the next group's, never stored). With narrow_tokens,
a group's last token tile of at most that many rows comes after all others
(`NarrowLastScheduler`), so that the CTAs that run one run fewer full tiles.

Warps and pipelines (`WarpRoles`, checked at import):
  warps 0-7   MMA warpgroups 0 and 1: their share of the tokens first; then
              convert B rows 64w .. 64w + 63, wgmma, epilogue (C staged through shared memory per warpgroup, then
              16-byte stores); 232 registers each (setmaxnreg)
  warps 8-11  producer warpgroup, 40 registers each: warp 8 TMAs tokens and B
              and bulk-copies SFB, warps 9-11 only give their registers back
  ab  PipelineTmaAsync, `num_ab_stages` stages: producer (1 arrive + the
      stage's transaction bytes) -> consumers (one arrive per MMA warp, lane 0,
      once the wgmma reading the stage is done; in a pair lanes 0 and 1, one
      at each CTA's barrier: `ab_consumer_arrives`)
  WarpRoles.tokens_ready_barrier (named): each MMA warp arrives once it claims no more
      token units, the producer warp waits there before polling the count

Configurations (`SM90_CONFIGS`): the forms that were the fastest on at least
one benchmark in a same-run H200 measurement; docs/hopper.md has the figures
and the forms that were tried and removed (git has their code).

The MoE op's forms (`SM90_MOE_CONFIGS`, `device_offsets`; `hopper_policy.moe_forms` picks
one from T, E, N, K, or two that the device chooses between from the routing):
the same kernel, one launch per form, with the group sizes on the device.
After griddepcontrol.wait, warp 0 of every CTA computes each group's end row,
its first scale row P_g and the tile count from offs into shared memory
(`fill_offset_tables`, `OffsetTables`), which every role then reads as it
reads the leaderboard's tables. Its two descriptors are
kernel parameters that its host function (`moe_call`) makes on every call:
the converted tokens, stacked in T order in the plan's scratch, and B, the
experts stacked as E x N rows; a tile loads the tokens from its group's first
row on (rows past the group's end are the next group's, loaded and never
stored) and B from the expert's first row block. Each group's fp32 sums are
scaled by its alpha (global scales) before the one rounding, C in bf16 where
`bf16_output` (docs/moe.md).
"""
import dataclasses
import enum
from typing import NamedTuple, Optional

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup

from . import launch, moe_tables, submission
from .submission import (K_MULTIPLE, PTR_ALIGN_BYTES, SF_VEC_SIZE, GroupTensormaps,
                        TileConfig, TileScheduler, WorkTile, ceil_div, check_budget)

# =============================================================================
# Configuration
# =============================================================================
OperandMajorMode = submission.undeprecated(warpgroup, "OperandMajorMode", cute.nvgpu.OperandMajorMode)
WEIGHT_ROWS = 128  # B rows (weights' N) per tile: two MMA warpgroups, wgmma M = 64 each
SF_BLOCK_BYTES = 512  # blocked layout: the scale factors of 128 rows x 64 K


class Diagnostic(enum.Enum):
    """Timing experiments only (`eval.py sweep --diagnose`; wrong results): each leaves one part of the
    default form's work out, to see what it costs. A part whose results feed nothing else (wgmma, the
    epilogue) stays in the code behind a branch no run takes, so that ptxas keeps the work before it."""
    SKIP_CONVERT = "skip-convert"  # the weights' fragments stay unconverted
    SKIP_MMA = "skip-mma"  # no wgmma run (the weights still converted)
    SKIP_TOKENS = "skip-tokens"  # no tokens loaded
    SKIP_WEIGHTS = "skip-weights"  # no weights or their scale factors loaded (converted from stale stages)
    SKIP_TOKEN_CONVERSION = "skip-token-conversion"  # no tokens converted (and none waited for)
    SKIP_EPILOGUE = "skip-epilogue"  # no C stored (the wgmma and conversions still run)
    # neither the weights loaded nor converted: what a stage costs without either (each alone hides the other)
    SKIP_WEIGHTS_AND_CONVERT = "skip-weights-and-convert"

    @property
    def loads_weights(self) -> bool:
        return self not in (Diagnostic.SKIP_WEIGHTS, Diagnostic.SKIP_WEIGHTS_AND_CONVERT)

    @property
    def converts_weights(self) -> bool:
        return self not in (Diagnostic.SKIP_CONVERT, Diagnostic.SKIP_WEIGHTS_AND_CONVERT)


@dataclasses.dataclass(frozen=True)
class Sm90TileConfig(launch.PlannedMemory, TileConfig):
    """The launcher's TileConfig (tile_m: tokens per tile, wgmma's N; tile_n:
    weight rows per tile) plus the Hopper kernel's K per stage, narrow last
    tiles and a timing diagnostic. cta_group 2: a (2,1,1) cluster takes each
    tile, tile_n = 2 x WEIGHT_ROWS, each CTA WEIGHT_ROWS of its weight rows, and
    the two CTAs share the tile's token stages (each loads half of a stage into
    both by TMA multicast)."""
    tile_k: int = 128  # 64 or 128: one or two 512-byte scale-factor blocks per stage
    # > 0: a group's last token tile with at most this many rows is "narrow": its wgmma has N =
    # narrow_tokens (half the work), and the narrow tiles come after all others (`NarrowLastScheduler`)
    narrow_tokens: int = 0
    # wgmma N a token tile may run with below tile_m, ascending (`token_widths`): a tile runs the narrowest that
    # holds its rows, so that it multiplies fewer padding rows (its weights' conversion is the same at every width)
    widths: tuple = ()
    diagnostic: Optional[Diagnostic] = None  # only `SM90_DIAGNOSTICS` (the sweep's) set one

    @property
    def tile_name(self) -> str:
        """"sm90-TMxTN-kTK-wr", then -pair, -narrow, the narrower widths (-n16-64), the diagnostic and -no-pdl
        where they apply."""
        narrow = "" if not self.narrow_tokens else (
            "-narrow" if self.narrow_tokens == self.tile_m // 2 else f"-narrow{self.narrow_tokens}")
        widths = "".join(f"-{w}" for w in self.widths).replace("-", "-n", 1)
        return (f"sm90-{self.tile_m}x{self.tile_n}-k{self.tile_k}-wr" + ("-pair" if self.cta_group == 2 else "")
                + narrow + widths + (f"-{self.diagnostic.value}" if self.diagnostic else "")
                + ("" if self.pdl else "-no-pdl") + ("-offs" if self.device_offsets else "")
                + ("-bf16" if self.bf16_output else ""))

    @property
    def base_form(self) -> "Sm90TileConfig":
        """The leaderboard form this one varies (not the MoE op's, fp16 output, the default schedule): what
        SM90_CONFIGS and the cost tables (hopper_policy) name."""
        return dataclasses.replace(self, device_offsets=False, bf16_output=False, schedule=submission.Schedule())

    @property
    def moe_form(self) -> "Sm90TileConfig":
        """This form as the MoE op runs it: its groups from offs on the device (`moe_call`)."""
        return dataclasses.replace(self, device_offsets=True)

    @property
    def token_widths(self) -> tuple:
        """The wgmma N a token tile may run with, ascending, tile_m last: a tile of r rows runs the first
        width >= r (`widths`, else narrow_tokens, then tile_m)."""
        return tuple(self.widths or ([self.narrow_tokens] if self.narrow_tokens else [])) + (self.tile_m,)

    @property
    def tile_mnk(self):
        return (self.tile_m, self.tile_n, self.tile_k)

    def make_kernel(self):
        return Sm90GroupedGemmKernel(self)

    def scratch_bytes(self, problem_sizes) -> int:
        """The converted fp16 A of every group, back to back (`scratch_address`, `group_tokens`), after the
        descriptor table and the token counters (SM90_PLAN_LAYOUT)."""
        return sum(m * k * 2 for m, _, k, _ in problem_sizes)


# Each form is the fastest somewhere in a same-run measurement: the default on benchmarks 2 and 3, the pair with
# narrow last token tiles on benchmark 0, the 192-token pair on benchmark 1 (H200); the first two with token
# widths 16 and 64, equal on the benchmarks and faster at 16 tokens a group; the 32- and 64-token forms at 16
# and 64 tokens a group (H100; docs/hopper.md).
SM90_CONFIGS = {c.tile_name: c for c in (
    Sm90TileConfig(128, WEIGHT_ROWS, tile_k=128, widths=(16, 64)),
    # (2,1,1) clusters: each CTA reads half of each token stage from the L2 and multicasts it to both
    Sm90TileConfig(128, 2 * WEIGHT_ROWS, tile_k=128, cta_group=2, narrow_tokens=64, widths=(16, 64)),
    Sm90TileConfig(192, 2 * WEIGHT_ROWS, tile_k=64, cta_group=2),
    # decode (few tokens a group): narrow token stages leave room for deep weight pipelines (12 and 8 stages
    # against the default's 5), so more of the weights' bytes are in flight per SM
    Sm90TileConfig(32, WEIGHT_ROWS, tile_k=128, widths=(16,)),
    Sm90TileConfig(64, WEIGHT_ROWS, tile_k=128, widths=(16,)),
)}
# Forms not yet timed (none now; docs/hopper.md has those timed and not kept): CONFIG_ENV and `eval.py sweep
# --candidates` name them, `eval.py compile` compiles them; custom_kernel's choice (hopper_policy.SM90_TILE_COST_NS)
# and the MoE op never take one
SM90_CANDIDATES = {}
SM90_CONFIG = SM90_CONFIGS["sm90-128x128-k128-wr-n16-64"]  # the default form (`sm90_choice` may take a pair form)
# The default form launched without programmatic dependent launch: exact, a setting CONFIG_ENV may name
SM90_NO_PDL = dataclasses.replace(SM90_CONFIG, pdl=False)
# The MoE op's forms (moe.py): these, each CTA computing the groups from their end rows on the device
SM90_MOE_CONFIGS = {c.tile_name: c for c in (f.moe_form for f in SM90_CONFIGS.values())}
SM90_MOE_DEFAULT = SM90_CONFIG.moe_form  # the default form's (`moe_forms`)


def diagnostics_of(config: Sm90TileConfig) -> tuple:
    """What `eval.py sweep --diagnose` adds for a form: it under each Diagnostic, and without PDL."""
    return (tuple(dataclasses.replace(config, diagnostic=d) for d in Diagnostic)
            + (dataclasses.replace(config, pdl=False),))


SM90_DIAGNOSTICS = diagnostics_of(SM90_CONFIG)  # the default form's

# A form's token widths (`Sm90TileConfig.token_widths`), one mainloop each: from four on, ptxas (CUDA 13.0 and
# the DSL's) serializes every wgmma "for insufficient register resources" (C7512)
MAX_TOKEN_WIDTHS = 3
MMA_WARPGROUPS = WEIGHT_ROWS // 64  # warpgroups 0 and 1: wgmma M = 64 each
# Token conversion (`convert_token_share`): a unit is one row's stage (tile_k K) of one group's A; a warp
# claims 32 * TOKEN_UNITS_PER_LANE consecutive units at a time, each lane converting TOKEN_UNITS_PER_LANE.
# One per lane: twice as many warps share the work as with two, which was 2-18 % slower on the H200
# (docs/hopper.md).
TOKEN_UNITS_PER_LANE = 1
TOKEN_CHUNK_K = 32  # logical K per 64-byte piece of a converted unit (`token_pair`)
# A warp's converted units go to the scratch through shared memory (the token stages, unused until the
# tokens are complete): each lane writes its unit as a staged row (`token_staging_stride`: 16 bytes of
# padding, so the 8 lanes of each 128-byte phase of a 16-byte store hit different banks), then the warp
# stores the claim's consecutive units (contiguous in the scratch) 512 contiguous bytes per instruction
# (`staged_chunk`) instead of 32 lanes' 16 bytes 256 bytes apart.
TOKEN_STAGING_PAD = 16
# The plan's token counters (`convert_token_share`, `wait_for_tokens`, `pass_token_counters`), after its
# descriptor table, before its scratch: each counter on its own 128-byte line (0.2-1.7 % faster on the H200
# than three sectors of one line: the producers' polls of CONVERTED meet no claims).
COUNTER_BYTES = 384
CLAIMED, CONVERTED, PASSED = 0, 128, 256  # byte offsets: units claimed, units converted, CTAs past the wait
# A plan's memory: the descriptor table, the token counters, then the converted tokens (`Sm90TileConfig.scratch_bytes`)
SM90_PLAN_LAYOUT = launch.PlanLayout(fixed_bytes=COUNTER_BYTES)
Sm90TileConfig.plan_layout = SM90_PLAN_LAYOUT
NUM_REGISTER_BUFFERS = 2  # weights' fragments: one converted while the other's wgmma runs
MAX_AB_STAGES = 16  # the 32-token form's 12 stages fit
SMEM_CAPACITY = 232448  # sm_90: 227 KiB per block
SMEM_RESERVED = 1024  # per CTA
REGISTERS_PER_SM = 65536
SCHEDULERS_PER_SM = 4  # warp schedulers, each with a quarter of the register file
SM90_TENSORMAPS = 2  # A (the converted tokens), B: slots 0 and 1 of each group's five in the descriptor table
ACC_SCALE = 16384.0  # 2^14: undoes the 2^-7 of each dequantized operand
# Epilogue: each MMA warpgroup stages C^T's values through shared memory, EPILOGUE_TOKENS tokens at a time,
# as rows of C (64 weight columns, 128 contiguous bytes), then stores them 16 bytes per thread.
EPILOGUE_TOKENS = 64
EPILOGUE_ROW_HALVES = 72  # a staged row's stride in fp16: 144 bytes, so the 4 lanes of a quad hit different banks

F16X2_128 = 0x58005800  # fp16 128.0 in both halves
A_FRAGMENT_LAYOUT = "((4,8,4),(2,2,2)):((128,1,16),(64,8,512))"  # wgmma m64k16 A in registers, (m + 64 k)
# The MoE form's groups per CTA (`OffsetTables`, 8 bytes a group in shared memory, within what the default
# form's five stages leave); the op runs more experts by the portable computation.
MOE_MAX_EXPERTS = 256


class WarpRoles(NamedTuple):
    """Warps of the kernel and its named barriers (0 is the CTA's): the MMA
    warpgroups first, then the producer warpgroup, whose first warp issues the
    copies (the other three only give their registers back). The ab pipeline's
    arrive count derives from it (`ab_consumer_arrives`); `check_sm90_warp_roles`
    runs at import."""
    consumer_warps: int  # warps 0 .. consumer_warps - 1
    producer_warp: int  # the first warp of the producer warpgroup
    threads: int
    ab_consumer_arrives: int  # PipelineTmaAsync, per CTA whose stages a load fills: one per consumer warp
    tokens_ready_threads: int  # tokens_ready_barrier: the MMA warps (arrive) and the producer warp (sync)
    b_rows: tuple  # per MMA warpgroup: (first, count) of the tile's weight rows
    producer_registers: int  # setmaxnreg: per thread of the producer warpgroup
    consumer_registers: int  # setmaxnreg: per thread of each MMA warpgroup
    epilogue_barrier: int  # named barriers epilogue_barrier + w: MMA warpgroup w's C staging
    tokens_ready_barrier: int  # MMA warps arrive once they claim no more units, the producer waits


WARP_ROLES = WarpRoles(4 * MMA_WARPGROUPS, 4 * MMA_WARPGROUPS, 128 * (MMA_WARPGROUPS + 1), 4 * MMA_WARPGROUPS,
                       32 * (4 * MMA_WARPGROUPS + 1), tuple((64 * w, 64) for w in range(MMA_WARPGROUPS)),
                       producer_registers=40, consumer_registers=232, epilogue_barrier=1,
                       tokens_ready_barrier=1 + MMA_WARPGROUPS)


def ab_consumer_arrives(config: "Sm90TileConfig") -> int:
    """Arrivals that free one CTA's stage of the ab pipeline: one per MMA warp
    of every CTA its producer's loads fill (PipelineTmaAsync.consumer_release:
    lane r of each consumer warp arrives at cluster rank r's barrier, r below
    the cluster's size); a pair's token loads fill both CTAs' stages."""
    return WARP_ROLES.ab_consumer_arrives * config.cta_group


def check_ab_arrivals(config: "Sm90TileConfig", cluster_vmnk: tuple) -> None:
    """Trace time: PipelineTmaAsync's consumer_release (mcast_mode_mn (1, 1), as the kernel creates it) has
    lane r < cluster size of each consumer warp arrive at rank r's empty barrier when the two CTAs share
    their (V, M, L) or (V, N, L) coordinates. Every CTA's barrier must then hear exactly
    `ab_consumer_arrives` arrivals per stage, among them those of every CTA its token loads fill (the
    CTAs of its M row)."""
    def coord(rank):  # column-major, as cute.make_layout(shape)
        out = []
        for extent in cluster_vmnk:
            out.append(rank % extent)
            rank //= extent
        return out
    size = 1
    for extent in cluster_vmnk:
        size *= extent
    for me in map(coord, range(size)):
        others = list(map(coord, range(size)))
        row = [c for c in others if (c[0], c[1], c[3]) == (me[0], me[1], me[3])]
        heard = [c for c in others if c in row or (c[0], c[2], c[3]) == (me[0], me[2], me[3])]
        if ab_consumer_arrives(config) != WARP_ROLES.ab_consumer_arrives * len(heard) or len(row) != size:
            raise ValueError(f"{config.name}: cluster {cluster_vmnk}: ab consumers {ab_consumer_arrives(config)}, "
                             f"arrivals {WARP_ROLES.ab_consumer_arrives} x {len(heard)} CTAs, token loads reach "
                             f"{len(row)} of {size}")


def check_sm90_warp_roles() -> None:
    """Arrive counts, row splits, register shares and tile sizes against the
    warp layout, at import (a mismatch would hang a GPU, so it must fail here)."""
    roles = WARP_ROLES
    assert roles.producer_warp == roles.consumer_warps and roles.threads == 32 * (roles.consumer_warps + 4)
    assert roles.ab_consumer_arrives == roles.consumer_warps  # every consumer warp releases its stage
    # every MMA warp arrives at the tokens' barrier, the producer warp waits there (named barriers count warps)
    assert roles.tokens_ready_threads == 32 * (roles.consumer_warps + 1)
    assert len({0, roles.tokens_ready_barrier, *(roles.epilogue_barrier + w for w in range(MMA_WARPGROUPS))}) == \
        2 + MMA_WARPGROUPS <= 16  # barrier 0 is the CTA's; all distinct
    covered = sorted(r for first, count in roles.b_rows for r in range(first, first + count))
    assert covered == list(range(WEIGHT_ROWS))  # every weight row converted once
    # setmaxnreg: multiples of 8 in 24 .. 256; the shares after it fit the register file, and the
    # producer gives registers back (dec) while the MMA warpgroups take them (inc) from the launch's budget
    for count in (roles.producer_registers, roles.consumer_registers):
        assert count % 8 == 0 and 24 <= count <= 256, roles
    assert 128 * (roles.producer_registers + MMA_WARPGROUPS * roles.consumer_registers) <= REGISTERS_PER_SM
    assert roles.producer_registers <= register_budget() <= roles.consumer_registers
    for config in SM90_CONFIGS.values():
        # the tokens are wgmma's N: a multiple of 8 up to 256 (the token conversion works row by row)
        assert config.cta_group in (1, 2) and config.tile_n == WEIGHT_ROWS * config.cta_group, config
        assert config.tile_m % 8 == 0 and 8 <= config.tile_m <= 256, config
        # a narrow tile's wgmma N: a multiple of 8 below tile_m (its accumulators are the first of the tile's)
        assert config.narrow_tokens % 8 == 0 and 0 <= config.narrow_tokens < config.tile_m, config
        # token widths likewise (each wgmma's N), at most MAX_TOKEN_WIDTHS, a narrow tile's among them
        widths = config.token_widths
        assert list(widths) == sorted(set(widths)) and all(w % 8 == 0 and w >= 8 for w in widths), config
        assert config.narrow_tokens in (0, *widths) and len(widths) <= MAX_TOKEN_WIDTHS, config
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
SELECT_LUT = 0xE4  # lop3's table for (a & c) | (b & ~c): bits of a where c has ones, of b elsewhere
PAIR_MASK = "0x8E008E00"  # an fp16 pair's sign and E2M1 magnitude bits: 15, 11..9 and 31, 27..25


def _dequant_word_ptx() -> str:
    """PTX for `dequant_word`: the fp16 pairs (j, j + 4) of the eight E2M1 nibbles of $4 (n_j at bits 4j..4j+3)
    times the f16x2 scale $5, into $0..$3. In the fp16 pattern a nibble's sign bit is 4 places above its top
    magnitude bit (15 and 11..9), in the word 1 place (3 and 2..0). So two words are built first, each one
    select from the word and the word shifted left by 3 (which moves each sign 3 places up):
    e = the magnitudes of the even nibbles (each byte's bits 0..2) with their signs at bit 6, and f = the odd
    nibbles' magnitudes (bits 4..6) with their signs at bit 10 (the next byte's bit 2). Then one left shift
    and one mask make a pair: (0, 4) is e << 9, (2, 6) is e << 1, (1, 5) is f << 5; the bits a mask drops are
    the other nibbles'. (3, 7) would need n_7's sign shifted past bit 31, so it keeps the two masks of the
    word and the word shifted right by 3. Left shifts can go to the multiply-add pipe; the integer pipe,
    which the conversion otherwise fills first, takes two selects, five masks and one right shift a word."""
    pair = lambda j, source, shift: (f"shl.b32 x, {source}, {shift};\n\tand.b32 x, x, {PAIR_MASK};\n\t"
                                     f"mul.rn.f16x2 ${j}, x, $5;\n\t")
    return ("{\n\t.reg .b32 s, e, f, a, b, x;\n\t"
            "shl.b32 s, $4, 3;\n\t"
            f"lop3.b32 e, $4, s, 0x07070707, {SELECT_LUT:#x};\n\t"
            f"lop3.b32 f, $4, s, 0x70707070, {SELECT_LUT:#x};\n\t"
            + pair(0, "e", 9) + pair(1, "f", 5) + pair(2, "e", 1)
            + "shr.b32 b, $4, 3;\n\tand.b32 a, $4, 0x80008000;\n\tand.b32 b, b, 0x0E000E00;\n\t"
            "or.b32 x, a, b;\n\tmul.rn.f16x2 $3, x, $5;\n\t}")


DEQUANT_WORD_PTX = _dequant_word_ptx()


@cute.jit
def scale_f16x2(scales: cutlass.Uint32, index: int) -> cutlass.Uint32:
    """fp16(E4M3 scale) * 2^7 in both halves of a 32-bit word, for byte
    `index` (0..3) of `scales` (a word of four scale factors, or one in byte 0)."""
    selector = index | (index << 4)  # byte `index` into bytes 0 and 1
    return cutlass.Uint32(moe_tables.inline_ptx(
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
    (`_dequant_word_ptx`)."""
    out = moe_tables.inline_ptx(llvm.StructType.get_literal([cutlass.Uint32.mlir_type] * 4), [packed, scale],
                                DEQUANT_WORD_PTX, "=r,=r,=r,=r,r,r")
    return tuple(cutlass.Uint32(llvm.extractvalue(cutlass.Uint32.mlir_type, out, [i])) for i in range(4))


# =============================================================================
# Token counters: inline PTX for the CTAs' shared conversion of the tokens
# =============================================================================
_ptx_memory = moe_tables.inline_ptx_memory


def atomic_add_relaxed(address, value) -> cutlass.Int32:
    """atom.add at GPU scope, relaxed: the counter's old value (claims order nothing else)."""
    return cutlass.Int32(_ptx_memory(cutlass.Int32.mlir_type, [cutlass.Int64(address), cutlass.Int32(value)],
                                     "atom.relaxed.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r"))


def atomic_add_acq_rel(address, value) -> cutlass.Int32:
    """atom.add at GPU scope, acquire and release: the counter's old value."""
    return cutlass.Int32(_ptx_memory(cutlass.Int32.mlir_type, [cutlass.Int64(address), cutlass.Int32(value)],
                                     "atom.acq_rel.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r"))


def add_release(address, value) -> None:
    """red.add at GPU scope, release: what this thread wrote (and saw) before is visible to an acquire of the sum."""
    _ptx_memory(None, [cutlass.Int64(address), cutlass.Int32(value)], "red.release.gpu.global.add.u32 [$0], $1;",
                "l,r")


def load_acquire(address) -> cutlass.Int32:
    """ld at GPU scope, acquire."""
    return cutlass.Int32(_ptx_memory(cutlass.Int32.mlir_type, [cutlass.Int64(address)],
                                     "ld.acquire.gpu.global.u32 $0, [$1];", "=r,l"))


def store_relaxed(address, value) -> None:
    _ptx_memory(None, [cutlass.Int64(address), cutlass.Int32(value)], "st.relaxed.gpu.global.u32 [$0], $1;", "l,r")


def fence_generic_async(space: str = "") -> None:
    """fence.proxy.async{space}: orders this thread's generic accesses to `space` (".global", ".shared::cta";
    "" for every state space) with async-proxy ones (TMA)."""
    _ptx_memory(None, [], f"fence.proxy.async{space};", "")


def nanosleep(ns: int) -> None:
    _ptx_memory(None, [], f"nanosleep.u32 {ns};", "")


def counters_address(tensormaps: cute.Tensor, num_groups):
    """Where a plan's token counters are (COUNTER_BYTES; SM90_PLAN_LAYOUT's fixed region): right after its
    (G, 5, 16) descriptor table in the plan's memory (`submission.LaunchPlan`)."""
    return tensormaps.iterator.toint() + SM90_PLAN_LAYOUT.fixed_offset(cutlass.Int64(num_groups))


def scratch_address(tensormaps: cute.Tensor, num_groups):
    """Where a plan's scratch (the converted tokens) starts: after its token
    counters, 128-byte aligned (SM90_PLAN_LAYOUT)."""
    return counters_address(tensormaps, num_groups) + SM90_PLAN_LAYOUT.fixed_bytes  # = scratch_offset(G)


def token_scale_offset(row, kb, k):
    """Byte offset, in a group's reordered SFA (K = k), of the scale factor of
    `row` and 16-K block `kb` (0 .. k/16 - 1)."""
    return (row // 128 * (k // 64) + kb // 4) * SF_BLOCK_BYTES + sf_offset(row % 128, kb % 4)


def lane_words(tile_k: int) -> int:
    """Packed 32-bit words (8 K each) of one row and stage that each lane of a
    quad converts: a quarter of the row."""
    return tile_k // 32


def token_staging_stride(tile_k: int) -> int:
    """Bytes between two lanes' staged units: a unit's tile_k fp16, then TOKEN_STAGING_PAD."""
    return tile_k * 2 + TOKEN_STAGING_PAD


def staged_chunk(c, lane, tile_k: int):
    """Store c (0 .. 32 TOKEN_UNITS_PER_LANE tile_k 2 / 512 - 1) of lane `lane`: the claim's bytes
    512 c + 16 lane .. + 15, which are (staged row, byte offset) of unit row (tile_k 2 bytes, a power of
    two) of the claim. Host ints or device Int32."""
    offset = 512 * c + 16 * lane
    shift = (tile_k * 2).bit_length() - 1
    return offset >> shift, offset & (tile_k * 2 - 1)


def fragment_word(dr: int, t: int) -> int:
    """Where pair t (0 .. 2 tile_k/32 - 1) of a lane's quarter row goes in its
    fragment (A_FRAGMENT_LAYOUT recast to 32-bit words: (row + 8, K + 8, kb)):
    rows `row` + 8 dr, 16-K block t // 2, K + 8 for odd t."""
    return dr + 2 * (t % 2) + 4 * (t // 2)


def token_pair(q: int, jj: int) -> int:
    """Where the token conversion puts pair jj of quarter q's word among a
    32-K chunk's 16 fp16 pairs: the pair wgmma's K order (`stage_k_order`)
    has there."""
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


def width_index(rows, widths: tuple, integer=int):
    """The index in `widths` (`Sm90TileConfig.token_widths`) of the narrowest that holds a token tile of `rows`
    rows (the widest: more, the rows of later tiles). Host ints, or device Int32 with `integer` cutlass.Int32."""
    index = integer(0)
    for width in widths[:-1]:  # unrolled while tracing
        index += integer(rows > width)
    return index


# =============================================================================
# Narrow tiles last: the tile order of forms with `narrow_tokens`
# =============================================================================
def wide_m_tiles(m, tile_m: int, narrow: int):
    """Token tiles of a group of m rows that are not narrow: all but a last one
    of at most `narrow` rows. Host ints or device Int32."""
    return (m + tile_m - 1 - narrow) // tile_m


def narrow_last_tiles(problem_sizes, tile_m: int, tile_n: int, narrow: int) -> list:
    """The host's twin of `NarrowLastScheduler`: (group, m_tile, n_tile,
    narrow) of each linear tile. Two sweeps over the groups: every group's
    wide token tiles (M tiles fastest, as `submission.locate_tile` numbers
    them), then every group's narrow one, if it has one."""
    tiles = []
    for narrow_sweep in (False, True):
        for g, (m, n, _, _) in enumerate(problem_sizes):
            wide = wide_m_tiles(m, tile_m, narrow)
            m_tiles = ([ceil_div(m, tile_m) - 1] if ceil_div(m, tile_m) > wide else []) if narrow_sweep \
                else list(range(wide))
            tiles += [(g, m_tiles[i % len(m_tiles)], i // len(m_tiles), narrow_sweep)
                      for i in range(len(m_tiles) * ceil_div(n, tile_n))]
    return tiles


@cute.jit
def sweep_m_tiles(m, tile_m: cutlass.Constexpr[int], narrow: cutlass.Constexpr[int], sweep):
    """A group of M rows: its M tiles in sweep 0 (the wide ones) or sweep 1 (the narrow last one, if any)."""
    tiles_m = wide_m_tiles(m, tile_m, narrow)
    if sweep == 1:
        tiles_m = ceil_div(m, tile_m) - tiles_m
    return tiles_m


@cute.jit
def locate_narrow_last(problem_sizes: cute.Tensor, num_groups, tile_m: cutlass.Constexpr[int],
                       tile_n: cutlass.Constexpr[int], narrow: cutlass.Constexpr[int], tile, group, group_first_tile,
                       sweep):
    """Linear tile -> (group, its first linear tile, sweep, m-tile, n-tile) in
    the order of `narrow_last_tiles`; the search resumes at the previous
    tile's group and sweep (a CTA's tiles only increase) and turns to the
    narrow sweep past the last group's wide tiles, so it reads the sizes only
    as far as `submission.locate_tile` does."""
    m = problem_sizes[group, 0]
    tiles_m = sweep_m_tiles(m, tile_m, narrow, sweep)
    group_end = submission.group_tiles_end(problem_sizes, group, group_first_tile, tiles_m, tile_n)
    while tile >= group_end:
        group_first_tile = group_end
        group = group + 1
        if group == num_groups:  # past every wide tile (a tile below the total is a narrow one)
            group = cutlass.Int32(0)
            sweep = cutlass.Int32(1)
        m = problem_sizes[group, 0]
        tiles_m = sweep_m_tiles(m, tile_m, narrow, sweep)
        group_end = submission.group_tiles_end(problem_sizes, group, group_first_tile, tiles_m, tile_n)
    index = tile - group_first_tile
    m_tile = index % tiles_m
    if sweep == 1:
        m_tile = ceil_div(m, tile_m) - 1
    return group, group_first_tile, sweep, m_tile, index // tiles_m


class NarrowLastScheduler(TileScheduler):
    """`submission.TileScheduler` (the same CTA shares of the linear tiles) over
    the order of `narrow_last_tiles`: under round-robin the narrow tiles, half
    the work of a wide one, are the last tiles of the CTAs that get one more
    tile than others. Carries the sweep with the search state."""

    def __init__(self, problem_sizes, tile_mnk, narrow, num_groups, stride, start, end, tile, group,
                 group_first_tile, sweep):
        super().__init__(problem_sizes, tile_mnk, stride, start, end, tile, group, group_first_tile)
        self.narrow, self.num_groups, self.sweep = narrow, num_groups, sweep

    @staticmethod
    def create(problem_sizes: cute.Tensor, num_groups, total_tiles, tile_mnk, contiguous: bool,
               narrow: int) -> "NarrowLastScheduler":
        base = TileScheduler.create(problem_sizes, total_tiles, tile_mnk, contiguous)
        return NarrowLastScheduler(problem_sizes, tile_mnk, narrow, num_groups, base.stride, base.start, base.end,
                                   base.tile, base.group, base.group_first_tile, cutlass.Int32(0))

    def _locate(self, tile, group, group_first_tile, sweep):
        return locate_narrow_last(self.problem_sizes, self.num_groups, self.tile_mnk[0], self.tile_mnk[1],
                                  self.narrow, tile, group, group_first_tile, sweep)

    def current(self) -> WorkTile:
        self.group, self.group_first_tile, self.sweep, m_tile, n_tile = self._locate(
            self.tile, self.group, self.group_first_tile, self.sweep)
        return WorkTile(self.group, m_tile, n_tile, self.tile == self.start, self.problem_sizes, self.tile_mnk[2])

    def group_at(self, tile, resume: bool):
        start = (self.group, self.group_first_tile, self.sweep) if resume else (cutlass.Int32(0),) * 3
        group, _, _, _, _ = self._locate(tile, *start)
        return group

    def __get_mlir_types__(self):
        return [self.tile.type, self.group.type, self.group_first_tile.type, self.sweep.type]

    def __extract_mlir_values__(self):
        return [x.ir_value() for x in (self.tile, self.group, self.group_first_tile, self.sweep)]

    def __new_from_mlir_values__(self, values):
        return NarrowLastScheduler(self.problem_sizes, self.tile_mnk, self.narrow, self.num_groups, self.stride,
                                   self.start, self.end, *(cutlass.Int32(v) for v in values))


# =============================================================================
# The MoE form: each CTA's groups from offs, in shared memory
# =============================================================================
@dataclasses.dataclass(frozen=True)
class OffsetTables:
    """The MoE form's groups (`device_offsets`): every CTA computes them from offs after its
    griddepcontrol.wait (`fill_offset_tables`) into shared memory, `bounds` (E + 2,) Int32 (0, each group's
    end row in A, then the tile count) and `scale_rows` (E,) Int32 (each group's first row P_g in the
    blocked SFA), and reads the leaderboard's tables as views of them (`sizes`, `abc`, `sf`: table[g, column]
    as the (G, 4), (G, 3) and (G, 2) tensors are read): A, C and SFA from a group's first rows, B and SFB from
    the expert's index. Frozen: read-only in dynamic loops."""
    bounds: cute.Tensor
    scale_rows: cute.Tensor
    n: cutlass.Int32
    k: cutlass.Int32
    a: cutlass.Int64
    c: cutlass.Int64
    sfa: cutlass.Int64
    sfb: cutlass.Int64
    globals_: tuple  # ((address, per group), ...) of a_global and b_global: address 0 none, per group 0 or 1

    def first_row(self, group):
        return self.bounds[group]

    def rows(self, group):
        return self.bounds[group + 1] - self.bounds[group]

    def tile_count(self, num_groups):
        return self.bounds[num_groups + 1]

    def scale_width(self):
        return self.k // SF_VEC_SIZE  # bytes of a blocked scale row (K a multiple of 64)

    def _size(self, group, column: int):
        if column == 0:
            return self.rows(group)
        return (None, self.n, self.k, cutlass.Int32(1))[column]

    def _abc(self, group, column: int):
        if column == 1:
            raise ValueError("the MoE form reads B through its stacked descriptor, not by address")
        row_bytes = cutlass.Int64(self.k // 2) if column == 0 else cutlass.Int64(self.n) * 2
        return (self.a if column == 0 else self.c) + cutlass.Int64(self.first_row(group)) * row_bytes

    def _sf(self, group, column: int):
        if column == 0:
            return self.sfa + cutlass.Int64(self.scale_rows[group]) * cutlass.Int64(self.scale_width())
        return self.sfb + cutlass.Int64(group) * cutlass.Int64(self.n) * cutlass.Int64(self.scale_width())

    @property
    def sizes(self):
        return TableView(self._size)

    @property
    def abc(self):
        return TableView(self._abc)

    @property
    def sf(self):
        return TableView(self._sf)

    def alpha(self, group):
        """The group's global scales' product (1 without them)."""
        return moe_tables.global_scales_product(self.globals_, group)

    @cute.jit
    def group_of_row(self, row, num_groups):
        """The group holding row `row` of A (< the last group's end): the last group whose first row is at
        most `row` (a binary search of `bounds`; the empty groups before a group share its first row)."""
        low, high = cutlass.Int32(0), num_groups
        while high - low > 1:
            middle = (low + high) // 2
            if self.bounds[middle] <= row:
                low = middle
            else:
                high = middle
        return low


@dataclasses.dataclass(frozen=True)
class TableView:
    """table[group, column] read through a function (OffsetTables' views)."""
    read: object

    def __getitem__(self, index):
        group, column = index
        return self.read(group, column)


# Which calls a launch of a MoE form takes (`moe_kernel`'s `one_wave_rule`): where the host launches two forms
# per call (`moe_forms`), the device chooses between them from the routing, and the other exits after its wait.
MOE_EVERY_CALL = 0
MOE_IN_ONE_WAVE = 1  # the calls whose default-form tiles fit the default form's grid in one wave
MOE_PAST_ONE_WAVE = 2  # the others


@cute.jit
def fill_offset_tables(offs: cute.Tensor, tables: OffsetTables, num_groups, tokens, tile_m: cutlass.Constexpr[int],
                       tiles_n, one_wave_ctas, one_wave_rule):
    """One warp (after griddepcontrol.wait): each group's end row (`moe_tables.clamped_bounds`: whatever offs
    holds, no group reaches past row T), its first scale row P_g (a scan of the groups' rows, each rounded up
    to 128) and the tile count (ceil(m / tile_m) x `tiles_n` per group) into `tables`' shared memory; the
    tile count is 0 where `one_wave_rule` leaves the call to the other form (the default form's tiles, 128 x
    WEIGHT_ROWS, against `one_wave_ctas`, its grid)."""
    lane = cute.arch.lane_idx()
    carried, carried_scale_rows, tiles = cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(0)
    wave_tiles = cutlass.Int32(0)  # the default form's
    for first in cutlass.range(0, num_groups, 32, unroll=1):
        g = first + lane
        begin, end = moe_tables.clamped_bounds(offs, g, num_groups, tokens, carried)
        m = end - begin
        first_scale_row, carried_scale_rows = moe_tables.first_scale_rows(begin, end, carried_scale_rows)
        if g < num_groups:
            tables.bounds[g + 1] = end
            tables.scale_rows[g] = first_scale_row
        tiles += (m + tile_m - 1) // tile_m * tiles_n
        wave_tiles += (m + SM90_CONFIG.tile_m - 1) // SM90_CONFIG.tile_m
        carried = cute.arch.shuffle_sync(end, 31)
    tiles = cute.arch.warp_reduction(tiles, lambda x, y: x + y)
    wave_tiles = cute.arch.warp_reduction(wave_tiles, lambda x, y: x + y) * ceil_div(tables.n, SM90_CONFIG.tile_n)
    if one_wave_rule == MOE_IN_ONE_WAVE:
        if wave_tiles > one_wave_ctas:
            tiles = cutlass.Int32(0)
    if one_wave_rule == MOE_PAST_ONE_WAVE:
        if wave_tiles <= one_wave_ctas:
            tiles = cutlass.Int32(0)
    if lane == 0:
        tables.bounds[0] = 0
        tables.bounds[num_groups + 1] = tiles


@dataclasses.dataclass(frozen=True)
class ParamDescriptors:
    """The MoE form's descriptors: kernel parameters (its host function makes them per call from the scratch
    and B, stacked), so no table to fetch from (GroupTensormaps' interface, doing nothing)."""

    def fetch_early(self, scheduler, plan_ready) -> None:
        pass

    def fetch_ahead(self, work, scheduler, plan_ready) -> None:
        pass

    def descriptor(self, group, i: int):
        return None  # the copy atom's own


# =============================================================================
# The kernel
# =============================================================================
class TokenWork(NamedTuple):
    """What the token conversion reads: the plan's tables, its memory (the
    descriptor table, then the counters and the scratch), the group count, and
    whether the tables were complete before the launch (`plan_ready`); the MoE
    form: its `OffsetTables` (and their views as the tables)."""
    problem_sizes: cute.Tensor
    abc_ptrs: cute.Tensor
    sf_ptrs: cute.Tensor
    tensormaps: cute.Tensor
    num_groups: cutlass.Int32
    plan_ready: cutlass.Int32
    offsets: Optional[OffsetTables] = None


class Sm90SmemLayouts(NamedTuple):
    tokens: cute.ComposedLayout  # (tile_m, tile_k, STAGE) fp16, wgmma's K-major swizzle (TMA stages)
    b_packed: cute.Layout  # (WEIGHT_ROWS, K/2 bytes, STAGE)
    sf: cute.Layout  # (sf_stage_bytes, STAGE) of SFB


class Sm90GroupedGemmKernel(submission.DescriptorBuilder):
    """Persistent grouped NVFP4 GEMM for sm_90a (see the module docstring)."""

    def __init__(self, config: Sm90TileConfig = SM90_CONFIG):
        if config.bf16_output and not config.device_offsets:
            raise ValueError(f"{config.name}: bf16 output is the MoE op's (device_offsets forms); custom_kernel's C "
                             "is fp16")
        self.config = config
        self.c_dtype = cutlass.BFloat16 if config.bf16_output else cutlass.Float16
        self.tile_k = config.tile_k
        self.tile_mnk = config.tile_mnk
        self.tile_m, self.tile_n = config.tile_m, config.tile_n  # the scheduler's tile of C (M x N)
        self.packed_k_bytes = self.tile_k // 2  # per row and stage
        self.sf_stage_bytes = SF_BLOCK_BYTES * self.tile_k // 64  # per stage
        self.roles = WARP_ROLES
        self.convert_tokens = config.diagnostic is not Diagnostic.SKIP_TOKEN_CONVERSION
        self.pair = config.cta_group == 2  # a (2,1,1) cluster per tile, the token stages multicast to both

    def cluster_shape(self) -> tuple:
        """(V, M, N, L) shape of a tile's CTAs: the pair side by side along the
        weights (N), so that a token load (M side) reaches both."""
        return (1, 1, self.config.cta_group, 1)

    def make_ab_pipeline(self, barriers):
        """Producer warp -> MMA warps over the token and weight stages: one arrive plus a stage's bytes fills
        a stage (a pair: the tokens come half from each CTA, every byte landing in both); it is free once
        every MMA warp of every CTA it fills releases it (`ab_consumer_arrives`, checked here against the
        cluster: a mismatch would hang). The pipeline's cluster-wide sync publishes the barriers before
        either CTA's first load."""
        shape = self.cluster_shape()
        check_ab_arrivals(self.config, shape)
        # Diagnostic.SKIP_TOKENS loads no tokens, SKIP_WEIGHTS (and SKIP_WEIGHTS_AND_CONVERT) no weights
        diagnostic, skipped = self.config.diagnostic, 0
        if diagnostic is Diagnostic.SKIP_TOKENS:
            skipped = self.tile_m * self.tile_k * 2
        elif diagnostic is not None and not diagnostic.loads_weights:
            skipped = WEIGHT_ROWS * self.packed_k_bytes + self.sf_stage_bytes
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=barriers,
            num_stages=self.num_ab_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, ab_consumer_arrives(self.config)),
            tx_count=self.stage_bytes() - skipped,
            cta_layout_vmnk=cute.make_layout(shape),
            mcast_mode_mn=(1, 1),  # which CTAs a release reaches: `check_ab_arrivals`
        )

    def _setup_attributes(self):
        mbarriers = 2 * 8 * MAX_AB_STAGES  # full and empty, 8 bytes each, for as many stages as there can be
        free = (SMEM_CAPACITY - SMEM_RESERVED - mbarriers - cute.cosize(self.epilogue_layout()) * 2
                - self.offset_table_bytes())
        self.num_ab_stages = min(MAX_AB_STAGES, free // self.stage_bytes())
        check_budget(self.config.name, "A/B stages (at least 2)", 2, self.num_ab_stages)

    def make_tiled_mma(self, tokens: int = 0):
        """wgmma's B (its 128 weight rows: wgmma's A, from registers) x A (the
        tokens: wgmma's N, tile_m or `tokens`, from the shared-memory stage)."""
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            cutlass.Float16, cutlass.Float16, OperandMajorMode.K, OperandMajorMode.K,
            cutlass.Float32, (WEIGHT_ROWS // 64, 1, 1), tiler_mn=(64, tokens or self.tile_m),
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
            tokens=sm90_utils.make_smem_layout_a(submission.LayoutEnum.ROW_MAJOR, self.tile_mnk, cutlass.Float16,
                                                 stages),
            b_packed=b_packed,
            sf=cute.make_layout((self.sf_stage_bytes, stages)))

    @staticmethod
    def epilogue_layout() -> cute.Layout:
        """(tokens, weight columns, warpgroup) fp16: each MMA warpgroup's staging of EPILOGUE_TOKENS rows of C."""
        return cute.make_layout((EPILOGUE_TOKENS, 64, MMA_WARPGROUPS),
                                stride=(EPILOGUE_ROW_HALVES, 1, EPILOGUE_TOKENS * EPILOGUE_ROW_HALVES))

    def offset_table_bytes(self) -> int:
        """Shared memory of the MoE form's `OffsetTables` (none in the leaderboard's forms)."""
        return (2 * MOE_MAX_EXPERTS + 2) * 4 if self.config.device_offsets else 0

    def shared_storage(self, layouts: Sm90SmemLayouts):
        """The CTA's shared memory: the pipeline's barriers, the token, weight and SFB stages, the epilogue's
        staging, and the MoE form's `OffsetTables`."""
        moe = self.config.device_offsets

        @cute.struct
        class SharedStorage:
            ab_mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.num_ab_stages]
            tokens: cute.struct.Align[cute.struct.MemRange[cutlass.Float16, cute.cosize(layouts.tokens)], 1024]
            b_packed: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, cute.cosize(layouts.b_packed)], 1024]
            sfb: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, cute.cosize(layouts.sf)], 128]
            epilogue: cute.struct.Align[cute.struct.MemRange[self.c_dtype, cute.cosize(self.epilogue_layout())],
                                        16]
            if moe:
                bounds: cute.struct.MemRange[cutlass.Int32, MOE_MAX_EXPERTS + 2]
                scale_rows: cute.struct.MemRange[cutlass.Int32, MOE_MAX_EXPERTS]

        self.shared_storage_type = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()
        check_budget(self.config.name, "bytes of shared memory", self.smem_bytes, SMEM_CAPACITY)
        check_budget(self.config.name, "bytes of token staging in the token stages",
                     self.roles.consumer_warps * self.token_staging_bytes(), cute.cosize(layouts.tokens) * 2)
        return SharedStorage

    def token_staging_bytes(self) -> int:
        """Shared memory of one MMA warp's staged units (`convert_token_units`)."""
        return 32 * TOKEN_UNITS_PER_LANE * token_staging_stride(self.tile_k)

    def stage_bytes(self) -> int:
        """Bytes one TMA stage receives (its transaction count): fp16 tokens, packed B, SFB."""
        return self.tile_m * self.tile_k * 2 + WEIGHT_ROWS * self.packed_k_bytes + self.sf_stage_bytes

    @staticmethod
    def _placeholder(dtype):
        """A (rows, K) global tensor of `dtype` from which a TMA atom is built
        (packed B as bytes, or the converted fp16 tokens): the template the
        descriptor builder fills in for each group."""
        rows, width = cutlass.Int32(128), cutlass.Int32(128)
        return cute.make_tensor(
            cute.make_ptr(dtype, 0, cute.AddressSpace.gmem, assumed_align=PTR_ALIGN_BYTES),
            cute.make_layout((rows, width), stride=(width, 1)))

    def make_tma_atoms(self, tokens=None, weights=None):
        """The TMA atoms of the tokens and the packed weights (descriptor slots
        0 and 1) with their placeholder tensors, the same in the GEMM and the
        descriptor builder; the MoE form's, of its stacked `tokens` and
        `weights` themselves."""
        self._setup_attributes()
        layouts = self.make_layouts()
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        # a pair: each CTA loads half of a token stage into both (the descriptor's box is that half)
        tokens_op = cpasync.CopyBulkTensorTileG2SMulticastOp() if self.pair else g2s
        one_stage = lambda layout: cute.slice_(layout, (None, None, 0))
        return layouts, (
            cpasync.make_tiled_tma_atom(tokens_op, self._placeholder(cutlass.Float16) if tokens is None else tokens,
                                        one_stage(layouts.tokens), (self.tile_m, self.tile_k),
                                        num_multicast=self.config.cta_group),
            cpasync.make_tiled_tma_atom(g2s, self._placeholder(cutlass.Uint8) if weights is None else weights,
                                        one_stage(layouts.b_packed), (WEIGHT_ROWS, self.packed_k_bytes)))

    # ---- The descriptor builder's part (submission.DescriptorBuilder): two descriptors per group ----------------
    def descriptor_atoms(self):
        """The converted tokens (A, from the plan's scratch) and the packed weights (B)."""
        _, ((atom_a, _), (atom_b, _)) = self.make_tma_atoms()
        return atom_a, atom_b

    @cute.jit
    def group_descriptor_tensors(self, tables, group):
        problem_sizes, abc_ptrs, _, tensormaps, num_groups = tables
        return (self.group_tokens(problem_sizes, group, scratch_address(tensormaps, num_groups)),
                self.group_weights(problem_sizes, group, abc_ptrs))

    @cute.jit
    def after_descriptors(self, tables, group):
        """After write_group_tensormaps's griddepcontrol.wait (the plan's memory may have been an earlier
        kernel's): the token counters start at zero, and each GEMM leaves them so (`pass_token_counters`)."""
        _, _, _, tensormaps, num_groups = tables
        if group == 0:
            if cute.arch.lane_idx() == 0:
                counters = counters_address(tensormaps, num_groups)
                for offset in (CLAIMED, CONVERTED, PASSED):  # unrolled while tracing
                    store_relaxed(counters + offset, 0)

    @cute.jit
    def __call__(
        self,
        ptr_problem_sizes: cute.Pointer,  # (G, 4) Int32: M, N, K, L
        ptr_abc: cute.Pointer,  # (G, 3) Int64: A, B, C addresses
        ptr_sf: cute.Pointer,  # (G, 2) Int64: SFA, SFB addresses (reordered)
        ptr_tensormaps: cute.Pointer,  # (G, 5, 16) Int64 descriptor table, 128-byte aligned, then the scratch
        num_groups: cutlass.Int32,
        total_tiles: cutlass.Int32,
        num_ctas: cutlass.Int32,  # the persistent grid's CTAs, or pairs (cta_group 2)
        plan_ready: cutlass.Int32,  # the tables and descriptors complete before this launch (LaunchPlan.launch)
        stream,
    ):
        if cutlass.const_expr(self.config.device_offsets):
            raise ValueError(f"{self.config.name}: the MoE form's host function is `moe_call`")
        layouts, ((tma_atom_a, tma_a), (tma_atom_b, tma_b)) = self.make_tma_atoms()
        self.shared_storage(layouts)

        problem_sizes, abc_ptrs, sf_ptrs, tensormaps = submission.host_tables(
            ptr_problem_sizes, ptr_abc, ptr_sf, ptr_tensormaps, num_groups)
        self.launch_cluster = (self.config.cta_group, 1, 1)
        cluster = {"cluster": self.launch_cluster} if cutlass.const_expr(self.pair) else {}
        self.kernel(self.make_tiled_mma(), tma_atom_a, tma_a, tma_atom_b, tma_b, problem_sizes, abc_ptrs, sf_ptrs,
                    tensormaps, num_groups, total_tiles, plan_ready).launch(
            grid=(self.config.cta_group, 1, num_ctas), block=[self.roles.threads, 1, 1], smem=self.smem_bytes,
            stream=stream, use_pdl=self.config.pdl, **cluster)

    def host_functions(self) -> tuple:
        """The leaderboard form's GEMM and descriptor builder; the MoE form's one host function (`moe_call`: it
        computes its groups itself, so no builder)."""
        if self.config.device_offsets:
            return (("gemm", self.moe_call, MOE_GEMM_ARGUMENTS),)
        return super().host_functions()

    @cute.jit
    def moe_call(
        self,
        ptr_offs: cute.Pointer,  # (E,) Int32: each group's end row in A
        ptr_memory: cute.Pointer,  # the plan's memory (SM90_PLAN_LAYOUT: the token counters, the scratch)
        ptr_scratch: cute.Pointer,  # the converted tokens, (T, K) fp16 in the plan's memory
        ptr_b: cute.Pointer,  # B (E, N, K/2), the experts back to back
        num_groups: cutlass.Int32,
        tokens: cutlass.Int32,  # T, this call's rows of A and C
        n: cutlass.Int32,
        k: cutlass.Int32,
        a_address: cutlass.Int64,  # A (T, K/2)
        c_address: cutlass.Int64,  # C (T, N)
        sfa_address: cutlass.Int64,  # blocked, group g's block from row P_g
        sfb_address: cutlass.Int64,  # E blocked blocks
        a_global_address: cutlass.Int64,  # fp32 decode scales (0: none), one or one per group
        b_global_address: cutlass.Int64,
        a_global_per_group: cutlass.Int32,
        b_global_per_group: cutlass.Int32,
        one_wave_ctas: cutlass.Int32,  # the default form's grid (`one_wave_rule`)
        one_wave_rule: cutlass.Int32,  # MOE_EVERY_CALL, or which calls this launch takes of two forms'
        num_ctas: cutlass.Int32,  # the persistent grid's CTAs, or pairs (cta_group 2)
        stream,
    ):
        """The MoE form's host function (`MOE_GEMM_ARGUMENTS`): its two descriptors, of the stacked tokens and
        the stacked weights (E x N rows), made from these addresses on every call, then the kernel
        (`moe_kernel`), which computes every group from offs on the device and takes the call as
        `one_wave_rule` says."""
        mA = cute.make_tensor(ptr_scratch, cute.make_layout((tokens, k), stride=(k, 1)))
        mB = cute.make_tensor(ptr_b, cute.make_layout((num_groups * n, k // 2), stride=(k // 2, 1)))
        layouts, ((tma_atom_a, tma_a), (tma_atom_b, tma_b)) = self.make_tma_atoms(mA, mB)
        self.shared_storage(layouts)
        offs = cute.make_tensor(ptr_offs, cute.make_layout(num_groups))
        memory = submission.plan_memory(ptr_memory, num_groups)
        self.launch_cluster = (self.config.cta_group, 1, 1)
        cluster = {"cluster": self.launch_cluster} if cutlass.const_expr(self.pair) else {}
        self.moe_kernel(self.make_tiled_mma(), tma_atom_a, tma_a, tma_atom_b, tma_b, offs, memory, num_groups,
                        tokens, n, k, a_address, c_address, sfa_address, sfb_address, a_global_address,
                        b_global_address, a_global_per_group, b_global_per_group, one_wave_ctas,
                        one_wave_rule).launch(
            grid=(self.config.cta_group, 1, num_ctas), block=[self.roles.threads, 1, 1], smem=self.smem_bytes,
            stream=stream, use_pdl=self.config.pdl, **cluster)

    # -------------------------------------------------------------------------
    # Device side: the dispatcher
    # -------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tiled_mma: cute.TiledMma, tma_atom_a: cute.CopyAtom, mA: cute.Tensor,
               tma_atom_b: cute.CopyAtom, mB: cute.Tensor, problem_sizes: cute.Tensor, abc_ptrs: cute.Tensor,
               sf_ptrs: cute.Tensor, tensormaps: cute.Tensor, num_groups: cutlass.Int32, total_tiles: cutlass.Int32,
               plan_ready: cutlass.Int32):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()

        storage = submission.SmemAllocator().allocate(self.shared_storage_type)
        ab_pipeline = self.make_ab_pipeline(storage.ab_mbar.data_ptr())
        cute.arch.sync_threads()  # barriers initialized
        self.run_roles(warp_idx, tidx, storage, ab_pipeline, tiled_mma, (tma_atom_a, tma_atom_b), mA, mB,
                       TokenWork(problem_sizes, abc_ptrs, sf_ptrs, tensormaps, num_groups, plan_ready),
                       GroupTensormaps(tensormaps, 0, SM90_TENSORMAPS), total_tiles)

    @cute.kernel
    def moe_kernel(self, tiled_mma: cute.TiledMma, tma_atom_a: cute.CopyAtom, mA: cute.Tensor,
                   tma_atom_b: cute.CopyAtom, mB: cute.Tensor, offs: cute.Tensor, memory: cute.Tensor,
                   num_groups: cutlass.Int32, tokens: cutlass.Int32, n: cutlass.Int32, k: cutlass.Int32,
                   a_address: cutlass.Int64, c_address: cutlass.Int64, sfa_address: cutlass.Int64,
                   sfb_address: cutlass.Int64, a_global_address: cutlass.Int64, b_global_address: cutlass.Int64,
                   a_global_per_group: cutlass.Int32, b_global_per_group: cutlass.Int32,
                   one_wave_ctas: cutlass.Int32, one_wave_rule: cutlass.Int32):
        """The MoE form: after griddepcontrol.wait (offs may be the router's output; the scratch, counters and
        output the previous kernel's) warp 0 computes the groups from offs into shared memory
        (`fill_offset_tables`), then the roles run as the leaderboard's do, on those tables. A call with no
        tiles (no rows, or left to the other form by `one_wave_rule`) ends there: nothing is read, converted
        or counted. The first of two forms lets the second launch before its wait (griddepcontrol), so that
        the call's second launch overlaps its first."""
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()

        storage = submission.SmemAllocator().allocate(self.shared_storage_type)
        ab_pipeline = self.make_ab_pipeline(storage.ab_mbar.data_ptr())
        tables = OffsetTables(storage.bounds.get_tensor(cute.make_layout(MOE_MAX_EXPERTS + 2)),
                              storage.scale_rows.get_tensor(cute.make_layout(MOE_MAX_EXPERTS)), n, k, a_address,
                              c_address, sfa_address, sfb_address,
                              ((a_global_address, a_global_per_group), (b_global_address, b_global_per_group)))
        if one_wave_rule == MOE_PAST_ONE_WAVE:
            # the first of two forms: the second may launch now. Its CTAs take SMs only as this grid's leave,
            # and read nothing before their own wait, which waits for this grid: so when this one leaves the
            # call to it (no tiles), its launch has overlapped this one instead of following it
            cute.arch.griddepcontrol_launch_dependents()
        cute.arch.griddepcontrol_wait()
        if warp_idx == 0:
            fill_offset_tables(offs, tables, num_groups, tokens, self.tile_m, ceil_div(n, self.tile_n), one_wave_ctas,
                               one_wave_rule)
        cute.arch.sync_threads()  # barriers initialized, the tables complete
        total_tiles = tables.tile_count(num_groups)
        if total_tiles > 0:  # the same in every CTA (of a pair too)
            self.run_roles(warp_idx, tidx, storage, ab_pipeline, tiled_mma, (tma_atom_a, tma_atom_b), mA, mB,
                           TokenWork(tables.sizes, tables.abc, tables.sf, memory, num_groups, cutlass.Int32(0),
                                     tables),
                           ParamDescriptors(), total_tiles)

    @cute.jit
    def run_roles(self, warp_idx, tidx, storage, ab_pipeline, tiled_mma, atoms, mA, mB, tokens: TokenWork,
                  producer_maps, total_tiles):
        """Each warp's role (WarpRoles), over the tiles and tables in `tokens`."""
        problem_sizes = tokens.problem_sizes
        layouts = self.make_layouts()
        # an MMA warp's staged token units: its rows in the token stages, which no token load fills before
        # every unit is converted (`wait_for_tokens`)
        token_staging = storage.tokens.data_ptr().toint() + warp_idx * self.token_staging_bytes()
        rank = cutlass.Int32(0)  # in the pair (block x): which half of each tile's weight rows
        if cutlass.const_expr(self.pair):
            bidx, _, _ = cute.arch.block_idx()
            rank = cute.arch.make_warp_uniform(bidx)
        if warp_idx >= self.roles.producer_warp:
            cute.arch.setmaxregister_decrease(self.roles.producer_registers)
            if warp_idx == self.roles.producer_warp:
                self.producer(layouts, storage, ab_pipeline, problem_sizes, tokens.sf_ptrs,
                              self.make_scheduler(tokens, total_tiles), producer_maps, tokens, atoms, mA, mB, rank)
        if warp_idx < self.roles.producer_warp:
            cute.arch.setmaxregister_increase(self.roles.consumer_registers)
            # A may be the previous kernel's output, C and the scratch its input
            units = self.wait_counting_units(tokens)
            if cutlass.const_expr(self.convert_tokens):
                self.convert_token_share(tokens, units, token_staging)
                # this warp claims no more units: the producer may count the CTA as past the conversion
                cute.arch.barrier_arrive(barrier_id=self.roles.tokens_ready_barrier,
                                         number_of_threads=self.roles.tokens_ready_threads)
            self.weights_consumer(layouts, storage, ab_pipeline, tiled_mma, tokens,
                                  self.make_scheduler(tokens, total_tiles), tidx, rank)
        if cutlass.const_expr(self.pair):
            # neither CTA of a pair leaves while the other may still arrive at its barriers
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    @cute.jit
    def make_scheduler(self, tokens: TokenWork, total_tiles):
        """A role's walk over the tiles (every role walks the same ones, each with its own copy of the state),
        made after the role's register reallocation: the MoE form reads its tile count again from shared
        memory there, instead of keeping it live across (where ptxas spilled it)."""
        if cutlass.const_expr(self.config.device_offsets):
            total_tiles = tokens.offsets.tile_count(tokens.num_groups)
        if cutlass.const_expr(self.config.narrow_tokens):
            return NarrowLastScheduler.create(tokens.problem_sizes, tokens.num_groups, total_tiles, self.tile_mnk,
                                              self.config.schedule.contiguous, self.config.narrow_tokens)
        return TileScheduler.create(tokens.problem_sizes, total_tiles, self.tile_mnk, self.config.schedule.contiguous)

    def weight_tile(self, work, rank):
        """This CTA's 128-row block of the group's weights in `work` (the pair's
        tile holds two; past the group's N for rank 1 where N / 128 is odd)."""
        return work.n_tile * self.config.cta_group + rank if cutlass.const_expr(self.pair) else work.n_tile

    @cute.jit
    def group_tokens(self, problem_sizes: cute.Tensor, group, scratch):
        """The converted fp16 A (M, K) of `group`: groups back to back in `scratch`."""
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
    def producer(self, layouts, storage, ab_pipeline, problem_sizes, sf_ptrs, scheduler, tensormaps, tokens,
                 atoms, mA, mB, rank):
        """Per stage: TMA the tile's fp16 tokens (converted by the MMA warps of
        all CTAs into the plan's scratch; a pair's CTA its half, into both) and
        this CTA's packed B, bulk-copy its SFB; the first tile's first stages'
        weights as soon as griddepcontrol.wait returns, their tokens once every
        unit of the tokens is converted."""
        tma_atom_a, tma_atom_b = atoms
        sA = storage.tokens.get_tensor(layouts.tokens.outer, swizzle=layouts.tokens.inner)
        sB = storage.b_packed.get_tensor(layouts.b_packed)
        sSFB = storage.sfb.get_tensor(layouts.sf)
        # ((ATOM_V, REST_V), STAGE) and ((ATOM_V, REST_V), ROW_TILES, K_TILES); a pair's CTA: its half of each
        cluster_vmnk = cute.make_layout(self.cluster_shape())
        tAsA, tAgA = self.token_partition(tma_atom_a, sA, mA, rank)
        token_mask = None  # alone: no multicast
        if cutlass.const_expr(self.pair):
            token_mask = cpasync.create_tma_multicast_mask(cluster_vmnk, cluster_vmnk.get_flat_coord(rank),
                                                           mcast_mode=2)
        tBsB, tBgB = cpasync.tma_partition(
            tma_atom_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 2),
            cute.group_modes(cute.local_tile(mB, (WEIGHT_ROWS, self.packed_k_bytes), (None, None)), 0, 2))
        bulk = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), cutlass.Uint8, num_bits_per_copy=self.sf_stage_bytes * 8)

        # ((ATOM_V, REST_V), STAGE) destinations and their sources, for `load_stage`; the MoE form's tokens
        # start at a group's first row (its sources are made per tile from mA and sA)
        copies = (tma_atom_a, tAgA, tAsA, token_mask, tma_atom_b, tBgB, tBsB, bulk, sSFB, (mA, sA, tokens.offsets))
        if cutlass.const_expr(self.config.device_offsets):  # the descriptors are parameters: fetch them now
            cpasync.prefetch_descriptor(tma_atom_a)
            cpasync.prefetch_descriptor(tma_atom_b)

        # Only the plan's own tables and descriptors are read before griddepcontrol.wait, and only once they
        # are complete (`plan_ready`): the inputs may be the previous kernel's output.
        tensormaps.fetch_early(scheduler, tokens.plan_ready)
        units = self.wait_counting_units(tokens)
        # the first tile's first stages of weights, then their tokens once they are all converted
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_ab_stages)
        early = cutlass.Int32(0)
        if scheduler.has_work():
            first = scheduler.current()
            sfb_first = self.sfb_tile_address(first, problem_sizes, sf_ptrs, rank)
            early = first.k_tiles
            if early > self.num_ab_stages:
                early = cutlass.Int32(self.num_ab_stages)
            for k_tile in cutlass.range(0, early, 1, unroll=1):
                ab_pipeline.producer_acquire(state)
                self.load_stage("weights", copies, first, k_tile, ab_pipeline.producer_get_barrier(state),
                                state.index, tensormaps, sfb_first, rank)
                state.advance()
        if cutlass.const_expr(self.convert_tokens):
            self.wait_for_tokens(tokens, units)
        if early > 0:
            first = scheduler.current()
            token_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_ab_stages)
            for k_tile in cutlass.range(0, early, 1, unroll=1):
                self.load_stage("tokens", copies, first, k_tile, ab_pipeline.producer_get_barrier(token_state),
                                token_state.index, tensormaps, None, rank)
                ab_pipeline.producer_commit(token_state)
                token_state.advance()
        while scheduler.has_work():
            work = scheduler.current()
            tensormaps.fetch_ahead(work, scheduler, tokens.plan_ready)
            sfb_tile = self.sfb_tile_address(work, problem_sizes, sf_ptrs, rank)
            for k_tile in cutlass.range(early, work.k_tiles, 1, unroll=1):
                ab_pipeline.producer_acquire(state)
                barrier = ab_pipeline.producer_get_barrier(state)
                for what in ("tokens", "weights"):  # unrolled while tracing
                    self.load_stage(what, copies, work, k_tile, barrier, state.index, tensormaps, sfb_tile, rank)
                ab_pipeline.producer_commit(state)
                state.advance()
            early = cutlass.Int32(0)
            scheduler.advance()
        cute.arch.griddepcontrol_launch_dependents()  # the last loads are issued: the next kernel may start
        if cutlass.const_expr(self.convert_tokens):
            self.pass_token_counters(tokens)
        ab_pipeline.producer_tail(state)

    def token_partition(self, tma_atom_a, sA, mA, rank):
        """((ATOM_V, REST_V), STAGE) and ((ATOM_V, REST_V), ROW_TILES, K_TILES): this CTA's TMA of the token stages
        (a pair's CTA: its half of each) and the tiles of `mA` it loads them from."""
        return cpasync.tma_partition(
            tma_atom_a, rank, cute.make_layout(self.config.cta_group), cute.group_modes(sA, 0, 2),
            cute.group_modes(cute.local_tile(mA, (self.tile_m, self.tile_k), (None, None)), 0, 2))

    @cute.jit
    def sfb_tile_address(self, work, problem_sizes, sf_ptrs, rank):
        """Where this CTA's SFB of `work` starts: its 128-row block (`weight_tile`) of the group's blocked
        scale factors, (K/64) blocks of 512 bytes each (read once per tile; `load_stage` adds the stage's
        offset). A pair's block past the group's N reads the group's last block instead (its results are
        not stored; a bulk copy, unlike TMA, has no bounds)."""
        block = self.weight_tile(work, rank)
        if cutlass.const_expr(self.pair):
            last = problem_sizes[work.group, 1] // WEIGHT_ROWS - 1
            if block > last:
                block = last
        return sf_ptrs[work.group, 1] + block * (problem_sizes[work.group, 2] // 64) * SF_BLOCK_BYTES

    @cute.jit
    def load_stage(self, what: cutlass.Constexpr, copies, work, k_tile, barrier, stage, tensormaps, sfb_tile,
                   rank):
        """Stage `stage` of `work`'s K tile `k_tile`: its "tokens" (TMA, from the plan's scratch; a pair's
        CTA its half, into both CTAs) or this CTA's "weights" (packed B by TMA, zeros past the group's N;
        SFB by a bulk copy from `sfb_tile`, `sfb_tile_address`), arriving on `barrier`."""
        tma_atom_a, tAgA, tAsA, token_mask, tma_atom_b, tBgB, tBsB, bulk, sSFB, (mA, sA, offsets) = copies
        if cutlass.const_expr(what == "tokens"):
            if cutlass.const_expr(self.config.diagnostic is not Diagnostic.SKIP_TOKENS):
                if cutlass.const_expr(offsets is not None):  # the stacked tokens, from the group's first row
                    _, tAgA = self.token_partition(tma_atom_a, sA, cute.domain_offset(
                        (offsets.first_row(work.group), 0), mA), rank)
                multicast = {} if cutlass.const_expr(token_mask is None) else {"mcast_mask": token_mask}
                cute.copy(tma_atom_a, tAgA[(None, work.m_tile, k_tile)], tAsA[(None, stage)],
                          tma_bar_ptr=barrier, tma_desc_ptr=tensormaps.descriptor(work.group, 0), **multicast)
        elif cutlass.const_expr(self.config.diagnostic is None or self.config.diagnostic.loads_weights):
            weight_tile = self.weight_tile(work, rank)
            if cutlass.const_expr(offsets is not None):  # the stacked weights: the expert's blocks first
                weight_tile += work.group * (offsets.n // WEIGHT_ROWS)
            cute.copy(tma_atom_b, tBgB[(None, weight_tile, k_tile)], tBsB[(None, stage)],
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
        wgmma's K order of `stage_k_order`; the token conversion stores the tokens in
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
    def weights_consumer(self, layouts, storage, ab_pipeline, tiled_mma, tokens: TokenWork, scheduler, tidx, rank):
        """Warpgroup w dequantizes rows 64w .. 64w + 63 of each TMA stage's B
        (packed weights and SFB) into wgmma A fragments and multiplies them by
        the stage's fp16 tokens: the C^T tile. Two register buffers: a stage is
        converted while the previous stage's wgmma runs; a TMA stage goes back
        to the producer once the wgmma reading it is done (wait_group 1 after
        the next one is issued; a pair's stage, once both CTAs' wgmmas are)."""
        wg = tidx // 128
        wg_tidx = tidx % 128
        sB = storage.b_packed.get_tensor(layouts.b_packed)
        sSFB = storage.sfb.get_tensor(layouts.sf)
        sTokens = storage.tokens.get_tensor(layouts.tokens.outer, swizzle=layouts.tokens.inner)
        sC = storage.epilogue.get_tensor(self.epilogue_layout())  # (EPILOGUE_TOKENS, 64, MMA_WARPGROUPS)
        thr_mma = tiled_mma.get_slice(tidx)
        w_shape = thr_mma.partition_shape_A((WEIGHT_ROWS, self.tile_k))  # (MMA, MMA_M, MMA_K)
        tCrW = (cute.make_rmem_tensor(w_shape, cutlass.Float16), cute.make_rmem_tensor(w_shape, cutlass.Float16))
        w_row = 64 * wg + 16 * (wg_tidx // 32) + (wg_tidx % 32) // 4  # A_FRAGMENT_LAYOUT
        # (the weights' fragments and their row, the weights' stages) for `mainloop`
        weights = (tCrW, w_row, wg_tidx % 4, sB, sSFB)
        # one MMA per token width (`token_widths`): wgmma's N is the width, the stage's first token rows
        mmas = []
        for width in self.config.token_widths:  # unrolled while tracing
            tiled_mma_w = self.make_tiled_mma(width)
            thr_mma_w = tiled_mma_w.get_slice(tidx)
            sTokens_w = cute.composition(sTokens, (cute.make_layout(width), cute.make_layout(self.tile_k),
                                                   cute.make_layout(self.num_ab_stages)))
            tiled_mma_w.set(warpgroup.Field.ACCUMULATE, True)
            mmas.append((tiled_mma_w,
                         tiled_mma_w.make_fragment_B(thr_mma_w.partition_B(sTokens_w)),  # (MMA, MMA_N, MMA_K, STAGE)
                         thr_mma_w.partition_C(cute.make_identity_tensor((WEIGHT_ROWS, width)))))  # (n, m) of each
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_ab_stages)
        release_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_ab_stages)
        while scheduler.has_work():
            work = scheduler.current()
            # the epilogue's table entries, read now: their DRAM round trip (the tables leave the L2 between
            # calls) overlaps the mainloop instead of following it
            output = self.output_of(tokens, work)
            m, _, _, _ = output
            rows = m - work.m_tile * self.tile_m  # this tile's rows: the rest (past tile_m) are later tiles'
            width = self.width_index(rows)
            for w in cutlass.range_constexpr(len(self.config.token_widths)):
                if width == w:
                    state, release_state = self.token_tile(mmas[w], ab_pipeline, weights, work, state,
                                                           release_state, output, rows, sC[(None, None, wg)], tidx,
                                                           rank)
            scheduler.advance()

    @cute.jit
    def token_tile(self, mma, ab_pipeline, weights, work, state, release_state, output, rows, staging, tidx,
                   rank):
        """One tile of `rows` tokens at one token width (`mma`: its tiled MMA, token fragments and accumulator
        coordinates): its accumulators, which live only here (each width's own registers), the mainloop and the
        epilogue; returns the pipeline states."""
        tiled_mma, tCsT, tCcC = mma
        acc = cute.make_rmem_tensor(tCcC.shape, cutlass.Float32)
        acc.fill(0.0)
        state, release_state = self.mainloop(ab_pipeline, (tiled_mma, acc, tCsT), weights, work, state,
                                             release_state)
        epilogue = (acc, tCcC, output, self.weight_tile(work, rank), work.m_tile, rows, staging, tidx // 128,
                    tidx % 128)
        if cutlass.const_expr(self.config.diagnostic is Diagnostic.SKIP_EPILOGUE):
            # only where K < 0, never at run time: left out altogether, the epilogue would take with it the wgmma
            # and conversions whose results only it reads (ptxas removes them; `rows` would not do: the compiler
            # knows the token width's bounds on it)
            if work.k_tiles < 0:
                self.epilogue(*epilogue)
        else:
            self.epilogue(*epilogue)
        return state, release_state

    def width_index(self, rows):
        """`width_index` of this form, on the device."""
        return width_index(rows, self.config.token_widths, cutlass.Int32)

    @cute.jit
    def mainloop(self, ab_pipeline, mma, weights, work, state, release_state):
        """`work`'s K stages into the accumulators of `mma` (tiled MMA,
        accumulators, the token stages' fragments); returns the pipeline
        states past them."""
        tiled_mma, acc, tCsT = mma
        tCrW, w_row, q, sB, sSFB = weights
        # K is a multiple of 256, so stages come in pairs: register buffer 0, then 1
        for k_pair in cutlass.range(0, work.k_tiles // NUM_REGISTER_BUFFERS, 1, unroll=1):
            for buffer in cutlass.range_constexpr(NUM_REGISTER_BUFFERS):
                ab_pipeline.consumer_wait(state)
                # the timing diagnostics (Diagnostic) leave out a part
                if cutlass.const_expr(self.config.diagnostic is None or self.config.diagnostic.converts_weights):
                    self.dequantize_a_fragment(sB, sSFB, tCrW[buffer], state.index, w_row, q)
                if cutlass.const_expr(self.config.diagnostic is Diagnostic.SKIP_MMA):
                    # only where K < 0, never at run time: left out altogether, the wgmma would take with it the
                    # conversions that feed it (ptxas removes them)
                    if work.k_tiles < 0:
                        self.issue_wgmma(tiled_mma, acc, tCrW[buffer], tCsT, state.index)
                else:
                    self.issue_wgmma(tiled_mma, acc, tCrW[buffer], tCsT, state.index)
                warpgroup.wait_group(1)  # the previous stage's wgmma is done: release its stage
                if buffer == 1 or k_pair > 0:
                    # this thread's generic reads of the stage (packed B, SFB) ordered before the next TMA
                    # write to it (async proxy): PTX's memory model asks for the proxy fence, the barrier
                    # alone does not order across proxies
                    fence_generic_async(".shared::cta")
                    ab_pipeline.consumer_release(release_state)
                    release_state.advance()
                state.advance()
        warpgroup.wait_group(0)
        fence_generic_async(".shared::cta")
        ab_pipeline.consumer_release(release_state)
        release_state.advance()
        return state, release_state

    @cute.jit
    def issue_wgmma(self, tiled_mma, acc, tCrW, tCsT, stage):
        """One stage's wgmma (tile_k / 16 of them, one group): the weights' fragments `tCrW` (MMA, MMA_M, MMA_K)
        times token stage `stage` of `tCsT` (MMA, MMA_N, MMA_K, STAGE) into `acc`."""
        warpgroup.fence()
        for kb in cutlass.range_constexpr(self.tile_k // 16):
            cute.gemm(tiled_mma, acc, tCrW[(None, None, kb)], tCsT[(None, None, kb, stage)], acc)
        warpgroup.commit_group()

    @cute.jit
    def output_of(self, tables: TokenWork, work):
        """(M, N, C's address, the accumulators' factor) of `work`'s group: 2^14 (`ACC_SCALE`), times the
        group's alpha in the MoE form (`OffsetTables.alpha`, its global scales' product)."""
        scale = ACC_SCALE
        if cutlass.const_expr(self.config.device_offsets):
            scale = tables.offsets.alpha(work.group) * ACC_SCALE
        problem_sizes = tables.problem_sizes
        return problem_sizes[work.group, 0], problem_sizes[work.group, 1], tables.abc_ptrs[work.group, 2], scale

    @cute.jit
    def epilogue(self, acc, tCcC, output, weight_tile, m_tile, rows_in_tile, staging, wg, wg_tidx):
        """acc times `output_of`'s factor (2^14; times alpha in the MoE form) to fp16 (bf16 in a -bf16 form)
        into C (`output`: M, N, address, factor) at token tile
        `m_tile` and weight rows 128 `weight_tile` ..; `tCcC` holds each
        value's (n, m) in the tile C^T. Warpgroup wg owns the tile's weight
        columns 64 wg .. 64 wg + 63 of C: EPILOGUE_TOKENS tokens at a time its
        threads put their values in `staging` (rows of C), then each thread
        stores 16-byte pieces of them, 8 threads per row of C (128 contiguous
        bytes), rows past M or past the tile (and a pair's columns past N) left out."""
        m, n, address, scale = output
        first_row = m_tile * self.tile_m
        first_col = weight_tile * WEIGHT_ROWS + 64 * wg
        rows_stored = m  # alone, every tile lies within N (a multiple of 128)
        if cutlass.const_expr(self.pair):
            if first_col >= n:  # a pair's half past the group's N
                rows_stored = cutlass.Int32(0)
        values = EPILOGUE_TOKENS // 2  # per pass and thread: 4 of each 8 tokens' block (the last pass: what is left)
        # 16-byte pieces per thread and pass: of the pass's tokens, at most the tile's (a tile of fewer than
        # EPILOGUE_TOKENS stores only its own rows: the rows after it are the next tile's)
        pieces = min(EPILOGUE_TOKENS, self.tile_m) * 64 // 8 // 128
        for rows in cutlass.range_constexpr(ceil_div(cute.size(acc), values)):
            if EPILOGUE_TOKENS * rows < rows_in_tile:  # a pass with a token of the tile (a narrower tile: the first)
                # acc's value i: token (m) + i % 2 + 8 (i // 4), weight (n) + 8 (i // 2 % 2) (make_tiled_mma's C)
                for i in cutlass.range_constexpr(min(values, cute.size(acc) - values * rows)):
                    col, row = tCcC[values * rows + i]
                    staging[row - EPILOGUE_TOKENS * rows, col - 64 * wg] = (
                        acc[values * rows + i] * scale).to(self.c_dtype)
                cute.arch.barrier(barrier_id=self.roles.epilogue_barrier + wg, number_of_threads=128)
                for r in cutlass.range_constexpr(pieces):
                    piece = wg_tidx + 128 * r
                    token = piece // 8
                    row = first_row + EPILOGUE_TOKENS * rows + token
                    if row < rows_stored:
                        col = first_col + 8 * (piece % 8)
                        src = cute.make_tensor(  # 16-byte aligned: the staging's rows are 144 bytes apart
                            cute.make_ptr(cutlass.Uint32, staging.iterator.toint() + (
                                token * EPILOGUE_ROW_HALVES + 8 * (piece % 8)) * 2, cute.AddressSpace.smem,
                                          assumed_align=16), cute.make_layout(4))
                        dst = cute.make_tensor(  # 16-byte aligned: C's address, N a multiple of 128, col of 8
                            cute.make_ptr(cutlass.Uint32, address + (cutlass.Int64(row) * n + col) * 2,
                                          cute.AddressSpace.gmem, assumed_align=16), cute.make_layout(4))
                        cute.autovec_copy(src, dst)
                # the staging free again
                cute.arch.barrier(barrier_id=self.roles.epilogue_barrier + wg, number_of_threads=128)

    # -------------------------------------------------------------------------
    # The tokens: converted once per call by the MMA warps of all CTAs
    # -------------------------------------------------------------------------
    @cute.jit
    def token_units(self, tokens: TokenWork):
        """Units of the token conversion, every group's: one per row and stage (tile_k K) of A (the MoE form:
        the rows up to the last group's end)."""
        units = cutlass.Int32(0)
        if cutlass.const_expr(tokens.offsets is not None):
            units = tokens.offsets.first_row(tokens.num_groups) * (tokens.offsets.k // self.tile_k)
        else:
            for g in cutlass.range(0, tokens.num_groups, 1, unroll=1):
                units += tokens.problem_sizes[g, 0] * (tokens.problem_sizes[g, 2] // self.tile_k)
        return units

    @cute.jit
    def wait_counting_units(self, tokens: TokenWork):
        """griddepcontrol.wait; the token units (`token_units`), counted before
        it where the tables were complete before this launch (`plan_ready`:
        their DRAM round trip overlaps the previous kernel), else after it.
        The MoE form waited before it made its tables: the units alone."""
        units = cutlass.Int32(0)
        if cutlass.const_expr(tokens.offsets is not None):
            units = self.token_units(tokens)
        else:
            if tokens.plan_ready != 0:
                units = self.token_units(tokens)
            cute.arch.griddepcontrol_wait()
            if tokens.plan_ready == 0:
                units = self.token_units(tokens)
        return units

    @cute.jit
    def convert_token_share(self, tokens: TokenWork, units, staging):
        """An MMA warp's part of the token conversion: it claims 32
        TOKEN_UNITS_PER_LANE consecutive units at a time (CLAIMED) until none
        is left, converts them (`convert_token_units`, through its rows of
        `staging`, the shared-memory address of the warp's first staged row)
        and adds them to CONVERTED (release, after each lane's proxy fence: the
        producers read the scratch by TMA). Claims, not shares: a CTA that
        starts late (its SM still busy with an earlier kernel) leaves its part
        to the running ones, and no CTA waits for one that has not started."""
        counters = counters_address(tokens.tensormaps, tokens.num_groups)
        per_claim = 32 * TOKEN_UNITS_PER_LANE
        first = self.claim_token_units(counters, per_claim)
        while first < units:
            self.convert_token_units(tokens, first, units, staging)
            # the scratch (global), which the producers read by TMA, and the staged rows (shared), which
            # token loads (this CTA's and the pair's peer's) overwrite once every unit is counted
            fence_generic_async()
            cute.arch.sync_warp()
            if cute.arch.lane_idx() == 0:
                count = units - first
                if count > per_claim:
                    count = cutlass.Int32(per_claim)
                add_release(counters + CONVERTED, count)
            first = self.claim_token_units(counters, per_claim)

    @cute.jit
    def claim_token_units(self, counters, count: int):
        """The first of `count` units this warp claims (lane 0's atomic, broadcast)."""
        first = cutlass.Int32(0)
        if cute.arch.lane_idx() == 0:
            first = atomic_add_relaxed(counters + CLAIMED, count)
        return cute.arch.shuffle_sync(first, 0)

    @cute.jit
    def convert_token_units(self, tokens: TokenWork, first, units, staging):
        """Lane l converts units first + l + 32 i (i < TOKEN_UNITS_PER_LANE):
        one row's stage of packed A (tile_k / 2 bytes: its 4 quarters, one
        vector load each) and its scale factors (a word per 64 K) in; tile_k
        fp16 in wgmma's K order (`stage_k_order`), scaled as `dequant_word`
        does, out to its staged row (32-K piece g holds word g of each quarter
        q, pair jj of it at `token_pair(q, jj)`). Then the warp stores the
        claim's units below `units` from the staging to the scratch, where
        unit u's fp16 are bytes u tile_k 2 .. (groups back to back, each
        row-major: `group_tokens`), 512 contiguous bytes per instruction
        (`staged_chunk`). All loads first, then the conversions."""
        words = lane_words(self.tile_k)
        lane = cute.arch.lane_idx()
        stride = token_staging_stride(self.tile_k)
        loaded = []
        for i in cutlass.range_constexpr(TOKEN_UNITS_PER_LANE):
            unit = first + lane + 32 * i
            if unit >= units:  # past the last unit: convert the last one again, store nothing
                unit = units - 1
            packed, sfa = self.locate_unit(tokens, unit)
            quarters = [cute.make_rmem_tensor((words,), cutlass.Uint32) for _ in range(4)]
            for q in cutlass.range_constexpr(4):
                cute.autovec_copy(cute.make_tensor(
                    cute.make_ptr(cutlass.Uint32, packed + q * words * 4, cute.AddressSpace.gmem,
                                  assumed_align=4 * words), cute.make_layout(words)), quarters[q])
            scale_words = cute.make_rmem_tensor((self.tile_k // 64,), cutlass.Uint32)
            for b in cutlass.range_constexpr(self.tile_k // 64):  # the scale factors of a row's 64 K: 4 bytes
                scale_words[b] = cute.make_tensor(
                    cute.make_ptr(cutlass.Uint32, sfa + b * SF_BLOCK_BYTES, cute.AddressSpace.gmem, assumed_align=4),
                    cute.make_layout(1))[0]
            loaded.append((quarters, scale_words))
        for i in cutlass.range_constexpr(TOKEN_UNITS_PER_LANE):
            quarters, scale_words = loaded[i]
            scales = [scale_f16x2(scale_words[b // 4], b % 4) for b in range(self.tile_k // 16)]
            row = staging + (lane + 32 * i) * stride
            for g in cutlass.range_constexpr(words):
                piece = cute.make_rmem_tensor((16,), cutlass.Uint32)
                for q in cutlass.range_constexpr(4):
                    word = q * words + g  # physical K 8 word .. 8 word + 7 of the stage
                    pairs = dequant_word(quarters[q][g], scales[word // 2])
                    for jj in cutlass.range_constexpr(4):
                        piece[token_pair(q, jj)] = pairs[jj]
                cute.autovec_copy(piece, cute.make_tensor(
                    cute.make_ptr(cutlass.Uint32, row + g * 64, cute.AddressSpace.smem, assumed_align=16),
                    cute.make_layout(16)))
        cute.arch.sync_warp()  # every lane's row staged
        claim = scratch_address(tokens.tensormaps, tokens.num_groups) + cutlass.Int64(first) * (self.tile_k * 2)
        for c in cutlass.range_constexpr(32 * TOKEN_UNITS_PER_LANE * self.tile_k * 2 // 512):
            staged_row, byte = staged_chunk(c, lane, self.tile_k)
            if first + staged_row < units:
                cute.autovec_copy(
                    cute.make_tensor(cute.make_ptr(cutlass.Uint32, staging + staged_row * stride + byte,
                                                   cute.AddressSpace.smem, assumed_align=16), cute.make_layout(4)),
                    cute.make_tensor(cute.make_ptr(cutlass.Uint32, claim + 512 * c + 16 * lane,
                                                   cute.AddressSpace.gmem, assumed_align=16), cute.make_layout(4)))

    @cute.jit
    def locate_unit(self, tokens: TokenWork, unit):
        """`locate_token_unit`, or the MoE form's `locate_stacked_token_unit`."""
        if cutlass.const_expr(tokens.offsets is not None):
            packed, sfa = self.locate_stacked_token_unit(tokens.offsets, tokens.num_groups, unit)
        else:
            packed, sfa = self.locate_token_unit(tokens, unit)
        return packed, sfa

    @cute.jit
    def locate_token_unit(self, tokens: TokenWork, unit):
        """Unit `unit` (numbered group by group, row-major over (row, stage)):
        the addresses of its packed A and of its first 64 K's scale factors in
        the reordered SFA (the next 64 K's are SF_BLOCK_BYTES further)."""
        problem_sizes = tokens.problem_sizes
        group = cutlass.Int32(0)
        group_first = cutlass.Int32(0)  # the group's first unit
        m = problem_sizes[0, 0]
        k = problem_sizes[0, 2]
        while unit >= group_first + m * (k // self.tile_k):
            group_first += m * (k // self.tile_k)
            group += 1
            m = problem_sizes[group, 0]
            k = problem_sizes[group, 2]
        local = unit - group_first
        row = local // (k // self.tile_k)
        stage_k = local % (k // self.tile_k) * self.tile_k
        packed = tokens.abc_ptrs[group, 0] + cutlass.Int64(row) * (k // 2) + stage_k // 2
        sfa = tokens.sf_ptrs[group, 0] + token_scale_offset(row, stage_k // 16, k)
        return packed, sfa

    @cute.jit
    def locate_stacked_token_unit(self, offsets: OffsetTables, num_groups, unit):
        """The MoE form's `locate_token_unit`: units in row order over the stacked A (row-major over (row,
        stage)); the row's group (`OffsetTables.group_of_row`) places its scale factors' block."""
        stages = offsets.k // self.tile_k
        row = unit // stages
        stage_k = unit % stages * self.tile_k
        group = offsets.group_of_row(row, num_groups)
        scale_row = offsets.scale_rows[group] + row - offsets.first_row(group)
        packed = offsets.a + cutlass.Int64(row) * cutlass.Int64(offsets.k // 2) + stage_k // 2
        sfa = offsets.sfa + token_scale_offset(cutlass.Int64(scale_row), stage_k // 16, offsets.k)
        return packed, sfa

    @cute.jit
    def wait_for_tokens(self, tokens: TokenWork, units):
        """The producer's wait before its first token load: this CTA's MMA warps
        have claimed their last units (WarpRoles.tokens_ready_barrier), then every unit
        is converted (CONVERTED, acquire), then the proxy fence that orders
        those generic stores before this thread's TMA reads."""
        cute.arch.barrier(barrier_id=self.roles.tokens_ready_barrier, number_of_threads=self.roles.tokens_ready_threads)
        counters = counters_address(tokens.tensormaps, tokens.num_groups)
        converted = load_acquire(counters + CONVERTED)
        while converted < units:
            nanosleep(100)
            converted = load_acquire(counters + CONVERTED)
        fence_generic_async(".global")

    @cute.jit
    def pass_token_counters(self, tokens: TokenWork):
        """The producer, past its wait for the tokens: the CTA counts itself in
        PASSED; the last CTA to do so (every CTA's MMA warps have stopped
        claiming and every producer has stopped reading CONVERTED) sets the
        three counters back to zero for the next launch, which reads them only
        after its griddepcontrol.wait, hence after this grid's end."""
        if cute.arch.lane_idx() == 0:
            grid_x, _, grid_z = cute.arch.grid_dim()  # (cta_group, 1, CTAs or pairs)
            counters = counters_address(tokens.tensormaps, tokens.num_groups)
            if atomic_add_acq_rel(counters + PASSED, 1) == grid_x * grid_z - 1:
                for offset in (CLAIMED, CONVERTED, PASSED):  # unrolled while tracing
                    store_relaxed(counters + offset, 0)


# =============================================================================
# Compile and launch
# =============================================================================
# What moe_call's pointer parameters point to, beside the descriptor builders' (`submission.argument_spec`)
MOE_POINTERS = {**submission.POINTER_PARAMETERS, "ptr_memory": (cutlass.Int64, submission.BYTES_PER_TENSORMAP),
                "ptr_scratch": (cutlass.Float16, PTR_ALIGN_BYTES), "ptr_b": (cutlass.Uint8, PTR_ALIGN_BYTES)}
MOE_GEMM_ARGUMENTS = submission.argument_spec(Sm90GroupedGemmKernel.moe_call, MOE_POINTERS)
