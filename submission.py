"""NVFP4 block-scaled grouped GEMM for NVIDIA B200 (GPU MODE `nvfp4_group_gemm`; the contract: docs/contract.md).

For each group (sizes M, N, K, L=1 from `data`):

    C[m, n] = fp16( sum_k a(m, k) * sfa(m, k // 16) * b(n, k) * sfb(n, k // 16) )

a, b FP4 E2M1 (two per byte, K-major), sfa, sfb FP8 E4M3 in the tcgen05 "blocked" layout
(`sfasfb_reordered_tensors`), fp32 accumulation, fp16 C in place. Checked before any launch (`validate_input`:
ValueError naming the group): the four lists of one length >= 1, L == 1, M >= 1, N a multiple of 128, K of 256,
the leaderboard's dtypes, shapes and strides, one CUDA device, 16-byte alignment. On sm_100 `custom_kernel` runs
the kernel below; other GPUs get the paths other modules register in EXTRA_PATHS (hopper.py, portable.py).

The B200 kernel (`Sm100GroupedGemmKernel`) computes per group D' = A' B'^T, A' (M' x K) and B' (N' x K) K-major
FP4 with blocked scale factors, D' fp16. A configuration (`TileConfig`, chosen per shape set by a cost model
fitted to public B200 results, `choose_config`, unless CONFIG_POLICY names one) fixes the CTA tile (tile_m x
tile_n, K = 256 per stage), how the CTAs share the tiles (`Schedule`) and whether A and B are swapped:
- not swapped: A' = a, B' = b, D' = C (row-major), M' = M, N' = N;
- swapped: A' = b, B' = a, D' = C^T (column-major view of C), M' = N, N' = M: the weights' N is the MMA's M
  side and the tokens' M its N side, so a tile spans up to tile_n tokens and each weight row is read once.

Persistent, warp-specialized, one CTA per SM at most, each MMA one CTA's (tile_m = 128, tcgen05 cta_group::1,
no cluster).
  warps 0-3  epilogue: TMEM -> registers -> fp16 -> shared memory -> TMA store
  warp 4     MMA: scale factors shared -> tensor memory, tcgen05.mma (one thread)
  warp 5     TMA producer: A', B', SFA', SFB' tiles into shared-memory stages
Pipelines (producer -> consumer, arrive counts; `Sm100WarpRoles`, `pipeline_arrive_counts`, each made by a
`make_*_pipeline` method that checks its counts):
  ab   PipelineTmaUmma, `num_ab_stages` stages: TMA warp (1 arrive + transaction bytes of one stage) -> MMA
       warp (1 arrive, tcgen05.commit)
  acc  PipelineUmmaAsync, `num_acc_stages` stages (2 when the accumulator fits twice in TMEM): MMA warp
       (1 arrive, tcgen05.commit) -> epilogue (4 arrives, one elected thread per epilogue warp)
  c    PipelineTmaStore, `num_c_stages` shared-memory buffers, epilogue warps.
Stages: as many A/B/SFA/SFB stages as fit beside the C buffers and barriers (`_compute_stages`).
TMEM (512 columns): `num_acc_stages` x tile_n fp32 accumulator columns, then the SFA, SFB columns of one K stage.
Every role walks the same tiles (`TileScheduler`). Every group's TMA descriptors are built once per input by a
small kernel (`build_tensormaps`) into plan-owned memory; a role fetches a group's a tile ahead (`GroupTensormaps`).
Every launch overlaps the previous kernel's tail (programmatic dependent launch): set-up before
`griddepcontrol.wait`, `launch_dependents` once the last loads are issued. Before its wait a kernel reads
global memory only from the plan's tables, which only host copies on the plan's stream write: the GEMM the
problem sizes (its MMA warp, which never waits, reads nothing else) and, with `plan_ready`, the first
descriptors; the builder the sizes and address tables. Everything else is read after the wait. Sizes, pointers
and counts are run-time: one compile per configuration and architecture serves every shape set
(`compile_grouped_gemm`). The host path (`GroupedGemmLauncher`) checks and tabulates a new input once and
relaunches a known one with one call. Imports only torch, cutlass and `task` (the leaderboard copies only this
file).
"""
import ctypes
import dataclasses
import functools
import gc
import inspect
import itertools
import os
import struct
import warnings
import weakref
from collections import OrderedDict
from typing import Callable, Dict, NamedTuple, Optional, Tuple

import torch

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled_utils
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.cute.runtime import make_fake_stream, make_ptr


def undeprecated(module, name: str, replacement):
    """`module.name`, or `replacement` where this DSL release deprecates the one for the other (older releases
    have only `module.name`, and there the two may be different objects)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(module, name)
    return replacement if any(issubclass(w.category, DeprecationWarning) for w in caught) else value


# Newer releases move these out of cutlass.utils (and deprecate them there); older ones have only those.
tensor_utils = getattr(cutlass, "tensor_utils", utils)
LayoutEnum = tensor_utils.LayoutEnum
SmemAllocator = getattr(cutlass, "memory", utils).SmemAllocator
OperandMajorMode = undeprecated(tcgen05, "OperandMajorMode", cute.nvgpu.OperandMajorMode)

try:  # inside the installed package (nvfp4_group_gemm.task)
    from .task import input_t, output_t
except ImportError:  # a file beside task.py: the leaderboard, the repository root
    from task import input_t, output_t

# ==== Configuration ==================================================================================================
# What the B200 path runs: "model", the cost model's choice of tile configuration and schedule per shape set
# (`choose_config`), or one name of `policy_candidates()` ("128x128/round-robin", "swap-128x256/contiguous",
# ...) for every call. The setting to change first if a configuration fails on a B200 (README).
CONFIG_POLICY = "model"
AB_DTYPE = cutlass.Float4E2M1FN
SF_DTYPE = cutlass.Float8E4M3FN
C_DTYPE = cutlass.Float16
ACC_DTYPE = cutlass.Float32
SF_VEC_SIZE = 16  # K elements per scale factor
MMA_K_BLOCKS_PER_STAGE = 4  # a stage holds 4 MMA instructions' K (4 x 64 = 256)
TMEM_COLUMNS = 512
SMEM_CAPACITY = 232448  # sm_100: 227 KiB of shared memory per block
SMEM_RESERVED = 1024  # barriers, TMEM address, alignment slack
SM_SHARED_MEMORY = 233472  # sm_100: 228 KiB of shared memory per SM, shared by the CTAs resident on it
CTA_SMEM_RESERVED = 1024  # what the runtime keeps of an SM's shared memory per resident CTA
SM100_SM_COUNT = 148  # B200


TENSORMAPS_PER_GROUP = 5  # descriptor table slots per group: A', B', SFA', SFB', D' (hopper.py: A, B)
BYTES_PER_TENSORMAP = 128
TENSORMAP_I64_PER_GROUP = TENSORMAPS_PER_GROUP * BYTES_PER_TENSORMAP // 8
PTR_ALIGN_BYTES = 16  # TMA needs 16-byte aligned global addresses
N_MULTIPLE = 128
K_MULTIPLE = 256

PATH_B200 = "b200-tcgen05"


@dataclasses.dataclass(frozen=True)
class Sm100WarpRoles:
    """The B200 kernel's warps and named barriers (0 is __syncthreads). The pipelines' arrive counts derive from
    it (`pipeline_arrive_counts`), and `check` runs where a kernel is made (a mismatch would hang a B200)."""
    epilogue_warps: Tuple[int, ...] = (0, 1, 2, 3)  # TMEM -> registers -> shared memory -> TMA store
    mma_warp: int = 4  # scale factors to TMEM, tcgen05.mma (one thread)
    tma_warp: int = 5  # A', B', SFA', SFB' into the shared-memory stages
    epilogue_barrier: int = 1  # the epilogue warps among themselves
    tmem_alloc_barrier: int = 2  # the epilogue warps and the MMA warp: the TMEM address published

    @property
    def threads(self) -> int:
        return 32 * (len(self.epilogue_warps) + 2)

    @property
    def epilogue_threads(self) -> int:
        """The epilogue barrier's threads, the c pipeline's producers."""
        return 32 * len(self.epilogue_warps)

    @property
    def acc_consumer_arrives(self) -> int:
        """Arrivals that free an accumulator stage, per CTA: one elected thread per epilogue warp."""
        return len(self.epilogue_warps)

    def check(self) -> None:
        """ValueError where the roles contradict the kernel's assumptions."""
        def require(ok: bool, what: str) -> None:
            if not ok:
                raise ValueError(f"B200 warp roles {self}: {what}")
        require(sorted((*self.epilogue_warps, self.mma_warp, self.tma_warp)) == list(range(self.threads // 32)),
                "each warp has one role")
        # tcgen05.ld: warp w reads TMEM lanes 32 (w % 4) .. + 31: four epilogue warps must cover w % 4 = 0..3
        require(sorted(w % 4 for w in self.epilogue_warps) == [0, 1, 2, 3], "the epilogue warps cover TMEM's lanes")
        require(self.mma_warp > max(self.epilogue_warps) < self.tma_warp,
                "the kernel dispatches the epilogue as warp_idx < mma_warp")
        require(len({0, self.epilogue_barrier, self.tmem_alloc_barrier}) == 3, "named barriers are distinct")


SM100_ROLES = Sm100WarpRoles()


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How the persistent CTAs share the tiles. `contiguous` (compiled in): CTA c of C takes tiles
    c T / C .. (c + 1) T / C - 1 of the T tiles, else (round-robin) c, c + C, c + 2 C, ...; `balanced_ctas` (host):
    the fewest CTAs that take the tiles in as many rounds as one CTA per SM would (`persistent_ctas`);
    `groups_by_m` (host): groups numbered by descending M, the token count (`group_order`)."""
    contiguous: bool = False
    balanced_ctas: bool = False
    groups_by_m: bool = False

    @property
    def name(self) -> str:
        parts = [n for n, on in (("contiguous", self.contiguous), ("balanced", self.balanced_ctas),
                                 ("by-m", self.groups_by_m)) if on]
        return "+".join(parts) or "round-robin"

    @staticmethod
    def from_name(name: str) -> "Schedule":
        """The inverse of `name` ("round-robin", or any of contiguous, balanced, by-m joined by "+")."""
        parts = set(name.split("+")) - {"round-robin", ""}
        unknown = parts - {"contiguous", "balanced", "by-m"}
        if unknown:
            raise ValueError(f"schedule {name!r}: unknown {', '.join(sorted(unknown))} "
                             "(expected round-robin, or contiguous, balanced, by-m joined by '+')")
        return Schedule("contiguous" in parts, "balanced" in parts, "by-m" in parts)


# The schedules a cost model chooses among, by name
SCHEDULES = {s.name: s for s in (Schedule(), Schedule(contiguous=True), Schedule(contiguous=True, balanced_ctas=True),
                                 Schedule(contiguous=True, balanced_ctas=True, groups_by_m=True))}


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """A B200 kernel configuration: the scheduler's (and CTA's MMA) tile of D', whether A, B are swapped, and how
    the CTAs share the tiles. Its name derives from its fields (`tile_name`/`schedule.name`, e.g.
    "swap-128x256/contiguous"); `parse_config` reads one back. The launcher uses only these fields and
    methods, so another architecture's kernel (hopper.py) subclasses it."""
    tile_m: int  # the MMA's tile along M' (128: one CTA's)
    tile_n: int  # CTA tile along N' (128 or 256)
    swap_ab: bool = False  # A' = b, B' = a, D' = C^T
    # CTAs per tile: 1 (this kernel's only), or 2 (a pair: hopper.py's pair forms; the public 2-CTA designs the
    # cost model is fitted to, model_report.public_designs)
    cta_group: int = 1
    pdl: bool = True  # launched with programmatic stream serialization (overlaps the previous kernel's tail)
    schedule: Schedule = Schedule()
    # The MoE op's form: the group sizes follow from the groups' end rows (offs) on the device, so the GEMM
    # reads them, and the tile count, only after griddepcontrol.wait: this kernel's from the tables its builder
    # computes (`moe_tables.OffsetsBuilder`), hopper.py's from what each CTA computes itself (`moe_call`)
    device_offsets: bool = False
    bf16_output: bool = False  # the MoE op's forms only (device_offsets): C in bf16 instead of fp16

    @property
    def tile_name(self) -> str:
        """The tile configuration's name ("128x128", "swap-128x256", "2cta-256x256" for a pair, ...)."""
        return ((f"{self.cta_group}cta-" if self.cta_group > 1 else "") + ("swap-" if self.swap_ab else "")
                + f"{self.tile_m}x{self.tile_n}" + ("" if self.pdl else "-no-pdl")
                + ("-offs" if self.device_offsets else "") + ("-bf16" if self.bf16_output else ""))

    @property
    def name(self) -> str:
        return f"{self.tile_name}/{self.schedule.name}"

    def with_schedule(self, schedule: Schedule) -> "TileConfig":
        return dataclasses.replace(self, schedule=schedule)

    @property
    def compile_key(self) -> "TileConfig":
        """What the compiled code depends on: the configuration less its host-side schedule choices."""
        return self.with_schedule(Schedule(contiguous=self.schedule.contiguous))

    @property
    def tile_mnk(self) -> Tuple[int, int, int]:
        return (self.tile_m, self.tile_n, 64 * MMA_K_BLOCKS_PER_STAGE)

    def make_kernel(self):
        return Sm100GroupedGemmKernel(self)

    def plan_words(self, problem_sizes) -> int:
        """Int64 words of device memory a plan owns: the (G, 5, 16) descriptor table (hopper.py's: more)."""
        return len(problem_sizes) * TENSORMAP_I64_PER_GROUP


TILE_CONFIGS = {c.tile_name: c for c in (TileConfig(128, 128), TileConfig(128, 256, swap_ab=True))}


def parse_config(text: str, tiles: Dict[str, TileConfig], what: str = "configuration") -> TileConfig:
    """The configuration "TILE" or "TILE/SCHEDULE" names (`TileConfig.name`; no schedule: round-robin) among
    `tiles` (by `tile_name`); ValueError naming `what` and the choices. Every knob and command reads names here."""
    tile, _, schedule = text.partition("/")
    if tile not in tiles:
        raise ValueError(f"{what} {text!r}: expected one of {', '.join(tiles)}, optionally with /SCHEDULE "
                         f"({', '.join(SCHEDULES)}, or contiguous, balanced, by-m joined by '+')")
    try:
        return tiles[tile].with_schedule(Schedule.from_name(schedule))
    except ValueError as error:
        raise ValueError(f"{what} {text!r}: {error}") from None


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def check_budget(config_name: str, what: str, needed: int, available: int) -> None:
    """Trace-time check (plain Python, outside the DSL's control flow)."""
    if needed > available:
        raise ValueError(f"{config_name}: {needed} {what} needed, {available} available")


def acc_stages(config: TileConfig) -> int:
    """Accumulator buffers in TMEM: two (epilogue of one tile overlaps the mainloop of the next) unless two
    MMA-N-wide fp32 accumulators and the scale factors exceed the 512 columns (MMA N = 256)."""
    return 2 if config.tile_n <= 128 else 1


def kernel_problem(size, config: TileConfig) -> Tuple[int, int, int, int]:
    """(M', N', K, L) of one group as the kernel sees it."""
    m, n, k, l = size
    return (n, m, k, l) if config.swap_ab else (m, n, k, l)


def tile_count(problem_sizes, config: TileConfig) -> int:
    return sum(ceil_div(mp, config.tile_m) * ceil_div(np_, config.tile_n)
               for mp, np_, _, _ in (kernel_problem(s, config) for s in problem_sizes))


def ctas_per_sm_by_smem(smem_bytes: int) -> int:
    """How many CTAs taking `smem_bytes` of dynamic shared memory fit one SM's shared memory at once."""
    return SM_SHARED_MEMORY // (smem_bytes + CTA_SMEM_RESERVED)


def check_sm_exclusive(config_name: str, smem_bytes: int) -> None:
    """The GEMM's CTAs allocate all TMEM_COLUMNS before `griddepcontrol.wait`. That is safe only while two of
    them cannot share an SM: else a dependent launch's CTA, started early by PDL, could sit in tcgen05.alloc
    beside the CTA it waits for. Shared memory is what keeps them apart (registers would not: 192 threads of
    up to 170 registers fit twice), so a configuration that leaves room for two raises here, at trace time."""
    if ctas_per_sm_by_smem(smem_bytes) > 1:
        raise ValueError(
            f"{config_name}: two CTAs fit one SM ({smem_bytes} bytes of shared memory each, {SM_SHARED_MEMORY} "
            "per SM), and the GEMM allocates TMEM before griddepcontrol.wait: a dependent launch's CTA could "
            "block in tcgen05.alloc beside the one it waits for. Move the allocation after the wait.")


def persistent_ctas(tiles: int, num_sms: int, balanced: bool = False) -> int:
    """The persistent grid: one CTA per SM at most, none idle from the start; `balanced`: the fewest CTAs that
    still take the tiles in ceil(tiles / SMs) rounds (every CTA then has that many tiles or one fewer)."""
    ctas = max(1, min(tiles, num_sms))
    return ceil_div(tiles, ceil_div(tiles, ctas)) if balanced and tiles > 0 else ctas


def group_order(problem_sizes, schedule: Schedule) -> Tuple[int, ...]:
    """The kernel's group numbering: the input's, or by descending M (ties: input order)."""
    order = range(len(problem_sizes))
    return tuple(sorted(order, key=lambda g: -problem_sizes[g][0]) if schedule.groups_by_m else order)


def cta_tiles(cta: int, ctas: int, tiles: int, schedule: Schedule) -> range:
    """The linear tiles CTA `cta` of `ctas` takes (`TileScheduler`, here for the host and the cost model)."""
    if schedule.contiguous:
        return range(cta * tiles // ctas, (cta + 1) * tiles // ctas)
    return range(cta, tiles, ctas)


# ==== Cost model: which configuration and schedule for which problem sizes ==========================================
# Facts (B200 at the problem statement's 1.5 GHz):
MODEL_DRAM_BYTES_PER_S = 7.68e12  # reproduces the statement's four speeds of light
MODEL_FP4_FLOPS_PER_SM = 32768 * 1.5e9  # dense FP4 per SM per second
MODEL_SM_LOAD_BYTES_PER_S = 128 * 1.5e9  # what one SM can take in from L2 (128 B/clock)
# The score is GPU time (docs/contract.md): kernel time plus the GPU-side gap to the previous kernel. Measured on
# the H200 (not a B200 fact): a near-empty kernel costs 1.6 us per call in the leaderboard's loop; launched
# with programmatic dependent launch, half of that is assumed to overlap the previous kernel.
MODEL_NO_PDL_EXTRA_S = 0.8e-6
MODEL_DESCRIPTOR_FETCH_S = 0.3e-6  # a CTA's first descriptors, built once per input (an assumption)


class ModelConstants(NamedTuple):
    """The model's free constants, fitted to public B200 results (`python eval.py model --fit`; the data points
    and how each maps onto a configuration and schedule: eval.py, PUBLIC_B200_BENCHMARK_US)."""
    dram_efficiency: float  # the share of MODEL_DRAM_BYTES_PER_S a grouped GEMM sustains
    latency_s: float  # a TMA load's DRAM round trip, also the pipeline's fill before the first MMA
    tile_overhead_s: float  # per tile and CTA: scheduling, barriers, the accumulator hand-off
    fixed_s: float  # per call: the launch gap (with PDL), the grid's ramp, the last tile's epilogue
    descriptor_rewrite_s: float  # per group change for a design whose GEMM rewrites descriptors (public ones do)


# Fitted by `python eval.py model --fit` (tests/test_compile.py refits them)
# (latency_s at its lower bound: the public points do not constrain it)
MODEL_CONSTANTS = ModelConstants(dram_efficiency=0.712, latency_s=0.2e-6, tile_overhead_s=1.24e-6, fixed_s=3.86e-6,
                                 descriptor_rewrite_s=2.05e-6)
# Operands re-read by several tiles are assumed to hit in L2: DRAM traffic is each input once and C once,
# bounded by the sustained DRAM rate as a whole, while each CTA streams its own tiles at most at its stages in
# flight / latency and at most at the SM's load rate.


# time_us and its parts: dram_us (the unique bytes at the sustained DRAM rate), busiest_cta_us (the CTA with most
# work, its descriptor waits and the latency included), gap_us (to the previous kernel, beyond fixed_s),
# descriptor_us (the busiest CTA's waits)
ModelEstimate = NamedTuple("ModelEstimate", [("config", str), ("tiles", int), ("ctas", int), ("time_us", float),
                                             ("dram_us", float), ("busiest_cta_us", float), ("gap_us", float),
                                             ("descriptor_us", float)])


def model_time_us(problem_sizes, config: TileConfig, num_sms: int = SM100_SM_COUNT,
                  rewrite_descriptors: bool = False, constants: ModelConstants = MODEL_CONSTANTS) -> ModelEstimate:
    """Modeled B200 GPU time of one call: tiles over `persistent_ctas` CTAs (pairs for `cta_group` 2) as the
    schedule deals them (`group_order`, `cta_tiles`), each CTA streaming its K stages at min(stages in flight /
    latency, the SM's load rate), at least its FP4 math time, plus its descriptor waits (`rewrite_descriptors`:
    the design before descriptors were built once per input); the larger of the busiest CTA and the unique bytes'
    time at the sustained DRAM rate, plus the per-call fixed cost."""
    tiles = []  # (K stages, group) of each tile, in the kernel's numbering
    unique_bytes = 0
    for group in group_order(problem_sizes, config.schedule):
        mp, np_, k, _ = kernel_problem(problem_sizes[group], config)
        unique_bytes += (mp + np_) * k // 2 + (mp + np_) * k // SF_VEC_SIZE + 2 * mp * np_
        k_stages = ceil_div(k, config.tile_mnk[2])
        tiles += [(k_stages, group)] * (ceil_div(mp, config.tile_m) * ceil_div(np_, config.tile_n))
    # a tile of a 2-CTA design (public ones, model_report) is one pair's: count pairs as the scheduler's "CTAs"
    units = persistent_ctas(len(tiles), num_sms // config.cta_group, config.schedule.balanced_ctas)
    stages_in_flight = _compute_stages_for_model(config)
    per_cta_bw = min(stages_in_flight * stage_bytes(config) / constants.latency_s, MODEL_SM_LOAD_BYTES_PER_S)
    stage_flops = 2 * config.tile_m * config.tile_n * config.tile_mnk[2] // config.cta_group
    stage_s = max(stage_bytes(config) / per_cta_bw, stage_flops / MODEL_FP4_FLOPS_PER_SM)
    # a wait per group change when rewritten, only before the CTA's first group when built once
    descriptor_wait = constants.descriptor_rewrite_s if rewrite_descriptors else MODEL_DESCRIPTOR_FETCH_S
    work, waits = [0.0] * units, [0.0] * units
    for unit in range(units):
        last_group = -1
        for k_stages, group in (tiles[i] for i in cta_tiles(unit, units, len(tiles), config.schedule)):
            work[unit] += k_stages * stage_s + constants.tile_overhead_s
            if group != last_group and (rewrite_descriptors or last_group < 0):
                waits[unit] += descriptor_wait
            last_group = group
    busiest_unit = max(range(units), key=lambda c: work[c] + waits[c])
    busiest = work[busiest_unit] + waits[busiest_unit] + constants.latency_s
    dram = unique_bytes / (MODEL_DRAM_BYTES_PER_S * constants.dram_efficiency)
    gap = 0.0 if config.pdl else MODEL_NO_PDL_EXTRA_S
    return ModelEstimate(config.name, len(tiles), units * config.cta_group,
                         1e6 * (max(busiest, dram) + constants.fixed_s + gap), 1e6 * dram, 1e6 * busiest, 1e6 * gap,
                         1e6 * waits[busiest_unit])


def model_candidates() -> list:
    """What the model chooses among: every compiled tile configuration under every schedule of SCHEDULES."""
    return [c.with_schedule(s) for c in TILE_CONFIGS.values() for s in SCHEDULES.values()]


def choose_config(problem_sizes, num_sms: int = SM100_SM_COUNT) -> TileConfig:
    """The configuration and schedule CONFIG_POLICY names, or under "model" the one with the smallest modeled time
    on `num_sms` SMs (ties: the first of `model_candidates`)."""
    if CONFIG_POLICY != "model":
        return policy_config(CONFIG_POLICY)
    return _choose_config(tuple(tuple(s) for s in problem_sizes), num_sms)


def policy_candidates() -> list:
    """What CONFIG_POLICY may name: the model's candidates."""
    return model_candidates()


def policy_config(name: str) -> TileConfig:
    """The configuration CONFIG_POLICY names (`parse_config`); ValueError listing the names otherwise."""
    return parse_config(name, TILE_CONFIGS, "CONFIG_POLICY (or \"model\")")


@functools.lru_cache(maxsize=256)
def _choose_config(problem_sizes: tuple, num_sms: int) -> TileConfig:
    # The model walks every tile: remember its answer per shape set.
    return min(model_candidates(), key=lambda c: model_time_us(problem_sizes, c, num_sms).time_us)


NUM_C_STAGES = 2
EPI_TILE_BYTES = 128 * 32 * 2  # epilogue subtile: 128 rows x 32 columns of fp16


def _compute_stages_for_model(config: TileConfig) -> int:
    """The kernel's A/B/SFA/SFB stages from byte counts alone (it counts its layouts; a test checks they agree)."""
    c_bytes = NUM_C_STAGES * EPI_TILE_BYTES
    return (SMEM_CAPACITY - SMEM_RESERVED - c_bytes) // stage_bytes(config)


def stage_bytes(config: TileConfig) -> int:
    """Bytes of one CTA's A/B/SFA/SFB stage: a pair of `cta_group` 2 (a public design's) splits A', B' and SFA'
    rows between its two CTAs, while each holds all of the tile's SFB' (its MMA reads them from its own TMEM);
    scale factors come in whole 128-row blocks."""
    m, n, k = config.tile_mnk
    sf = (ceil_div(m // config.cta_group, 128) * 128 + ceil_div(n, 128) * 128) * k // SF_VEC_SIZE
    return (m + n) // config.cta_group * k // 2 + sf


# ==== Tile scheduler =================================================================================================
@cute.jit
def group_tiles_end(problem_sizes: cute.Tensor, group, group_first_tile, tiles_m, tile_n: cutlass.Constexpr[int]):
    """The linear tile after `group`'s last: its first tile plus its M tiles times its N' tiles (both kernels'
    group walks: `locate_tile`, hopper.locate_narrow_last)."""
    return group_first_tile + tiles_m * ceil_div(problem_sizes[group, 1], tile_n)


@cute.jit
def locate_tile(problem_sizes: cute.Tensor, tile_m: cutlass.Constexpr[int], tile_n: cutlass.Constexpr[int],
                tile: cutlass.Int32, group: cutlass.Int32, group_first_tile: cutlass.Int32):
    """Linear tile -> (group, its first linear tile, m'-tile, n'-tile): tiles numbered group by group, M' tiles
    fastest, over the (G, 4) table M', N', K, L; the search resumes at the previous tile's group."""
    tiles_m = ceil_div(problem_sizes[group, 0], tile_m)
    group_end = group_tiles_end(problem_sizes, group, group_first_tile, tiles_m, tile_n)
    while tile >= group_end:
        group_first_tile = group_end
        group = group + 1
        tiles_m = ceil_div(problem_sizes[group, 0], tile_m)
        group_end = group_tiles_end(problem_sizes, group, group_first_tile, tiles_m, tile_n)
    index_in_group = tile - group_first_tile
    return group, group_first_tile, index_in_group % tiles_m, index_in_group // tiles_m


class WorkTile(NamedTuple):
    """One tile of D': group, M'- and N'-tile, and whether it is the CTA's first (its descriptors not yet fetched)."""
    group: object
    m_tile: object
    n_tile: object
    first: object
    problem_sizes: object
    tile_k: int

    @property
    def k_tiles(self):
        """The group's K stages (K_MULTIPLE divides K, every tile_k divides K_MULTIPLE), read where used."""
        return self.problem_sizes[self.group, 2] // self.tile_k


class TileScheduler:
    """The static persistent walk over the tiles of all groups (`locate_tile`): CTA c of a grid of C takes tiles
    c, c + C, c + 2 C, ... or, `contiguous`, tiles c T / C .. (c + 1) T / C - 1 (`cta_tiles` is the host's twin).
    A kernel's dispatcher creates it once; every warp role walks the same tiles with its own copy of the state
    (`while scheduler.has_work(): work = scheduler.current(); ...; scheduler.advance()`): three Int32 values
    carried through the DSL's dynamic loop, the linear tile and where the group search resumes (group, its first
    tile); the CTA's first tile and end are fixed."""

    def __init__(self, problem_sizes, tile_mnk, stride, start, end, tile, group, group_first_tile):
        self.problem_sizes, self.tile_mnk, self.stride, self.start, self.end = (
            problem_sizes, tile_mnk, stride, start, end)
        self.tile, self.group, self.group_first_tile = tile, group, group_first_tile

    @staticmethod
    def create(problem_sizes: cute.Tensor, total_tiles, tile_mnk, contiguous: bool) -> "TileScheduler":
        _, _, bidz = cute.arch.block_idx()
        _, _, grid_z = cute.arch.grid_dim()
        cta, ctas = cutlass.Int32(bidz), cutlass.Int32(grid_z)
        if cutlass.const_expr(contiguous):
            stride, start, end = cutlass.Int32(1), cta * total_tiles // ctas, (cta + 1) * total_tiles // ctas
        else:
            stride, start, end = ctas, cta, total_tiles
        return TileScheduler(problem_sizes, tile_mnk, stride, start, end, start, cutlass.Int32(0), cutlass.Int32(0))

    def has_work(self):
        return self.tile < self.end

    def current(self) -> WorkTile:
        tile_m, tile_n, tile_k = self.tile_mnk
        self.group, self.group_first_tile, m_tile, n_tile = locate_tile(
            self.problem_sizes, tile_m, tile_n, self.tile, self.group, self.group_first_tile)
        return WorkTile(self.group, m_tile, n_tile, self.tile == self.start, self.problem_sizes, tile_k)

    def group_at(self, tile, resume: bool):
        """The group of linear tile `tile`, searched from the current tile's group (`resume`: a later tile of
        this CTA) or from the first group. A scheduler with another tile order overrides this and `current`."""
        start = (self.group, self.group_first_tile) if resume else (cutlass.Int32(0), cutlass.Int32(0))
        group, _, _, _ = locate_tile(self.problem_sizes, self.tile_mnk[0], self.tile_mnk[1], tile, *start)
        return group

    @cute.jit
    def first_group(self):
        """The group of this CTA's first tile (before `current`)."""
        return self.group_at(self.tile, False)

    @cute.jit
    def upcoming_group(self):
        """The group of this CTA's next tile, or the current tile's group when there is none (after `current`)."""
        upcoming = self.group
        following = self.tile + self.stride
        if following < self.end:
            upcoming = self.group_at(following, True)
        return upcoming

    def advance(self) -> None:
        self.tile = self.tile + self.stride

    # the DSL's protocol for values carried through dynamic loops
    def __get_mlir_types__(self):
        return [self.tile.type, self.group.type, self.group_first_tile.type]

    def __extract_mlir_values__(self):
        return [x.ir_value() for x in (self.tile, self.group, self.group_first_tile)]

    def __new_from_mlir_values__(self, values):
        return TileScheduler(self.problem_sizes, self.tile_mnk, self.stride, self.start, self.end,
                             *(cutlass.Int32(v) for v in values))


# ==== TMA descriptors: every group's, built once per input, fetched by the roles =====================================
def tensormap_manager():
    return tensor_utils.TensorMapManager(tensor_utils.TensorMapUpdateMode.SMEM, BYTES_PER_TENSORMAP)


def tensormap_staging(count: int):
    """The builder kernel's shared memory: `count` descriptors being edited."""
    @cute.struct
    class Staging:
        maps: cute.struct.Align[cute.struct.MemRange[cutlass.Int64, count * BYTES_PER_TENSORMAP // 8],
                                BYTES_PER_TENSORMAP]
    return Staging


@cute.jit
def write_group_tensormaps(atoms, tensors, tensormaps: cute.Tensor, group, staging):
    """Builder kernel body, one warp per group: each of the group's descriptors (slot i: `atoms[i]`'s template
    with `tensors[i]`'s address, sizes and strides: tensormap.replace in shared memory) copied to the
    (G, 5, 16) table with a release fence. Nothing is written before the previous kernel has finished (its
    memory may be what this plan's table now occupies). Before the wait it reads only the plan's size and
    address tables (the caller's `tensors`), which host copies on this stream wrote."""
    cute.arch.griddepcontrol_launch_dependents()  # the GEMM waits for this grid's end before reading the table
    manager = tensormap_manager()
    smem = tuple(staging.maps.data_ptr() + i * (BYTES_PER_TENSORMAP // 8) for i in range(len(atoms)))
    gmem = tuple(manager.get_tensormap_ptr(tensormaps[(group, i, None)].iterator) for i in range(len(atoms)))
    cute.arch.griddepcontrol_wait()
    for atom, smem_map in zip(atoms, smem):  # unrolled while tracing
        manager.init_tensormap_from_atom(atom, smem_map, 0)
    manager.update_tensormap(tuple(tensors), tuple(atoms), gmem, 0, smem)


@dataclasses.dataclass(frozen=True)
class GroupTensormaps:
    """One warp role's view of the plan's descriptor table (G, 5, 16) Int64, slots `first`.. of each group
    (B200 producer: A', B', SFA', SFB'; epilogue: D'; Hopper producer: A, B). A role `fetch`es a group's
    descriptors (acquire fence, then prefetch) before its first copy through them: its first tile's group
    at once, every later one a tile ahead (`TileScheduler.upcoming_group`). Frozen: read-only in dynamic
    loops."""
    table: cute.Tensor
    first: int
    count: int

    def _pointer(self, group, i: int, space):
        return tensormap_manager().get_tensormap_ptr(self.table[(group, self.first + i, None)].iterator, space)

    def fetch(self, group) -> None:
        prefetch = getattr(cute.arch, "prefetch", None)  # a hint DSL 4.3.x, without it, skips
        for i in range(self.count):  # unrolled while tracing
            cpasync.fence_tma_desc_acquire(self._pointer(group, i, cute.AddressSpace.gmem))
            if prefetch is not None:
                prefetch(self._pointer(group, i, cute.AddressSpace.generic).llvm_ptr, tensormap=True)

    @cute.jit
    def fetch_early(self, scheduler: TileScheduler, plan_ready) -> None:
        """Before `griddepcontrol.wait`: the CTA's first group's descriptors, if the plan's tables and descriptors
        were complete before this launch could start (`plan_ready`, LaunchPlan.launch), so that their DRAM
        round trips overlap the previous kernel. Otherwise the first `fetch_ahead` fetches them after the wait
        (its acquire fence is what orders a launch with `plan_ready` 0 after the builder)."""
        if plan_ready != 0:
            if scheduler.has_work():
                self.fetch(scheduler.first_group())

    @cute.jit
    def fetch_ahead(self, work: WorkTile, scheduler: TileScheduler, plan_ready) -> None:
        """At the start of `work`: its group's descriptors if it is the CTA's first tile and `fetch_early` did
        not fetch them, and the next tile's group's if that differs."""
        if work.first:
            if plan_ready == 0:
                self.fetch(work.group)
        upcoming = scheduler.upcoming_group()
        if upcoming != work.group:
            self.fetch(upcoming)

    def descriptor(self, group, i: int):
        """What TMA operation number `i` of this role names as its descriptor for `group`."""
        return self._pointer(group, i, cute.AddressSpace.generic)


def host_tables(ptr_problem_sizes, ptr_abc, ptr_sf, ptr_tensormaps, num_groups):
    """A host function's pointer arguments as tensors (both kernels): (G, 4) Int32 sizes,
    (G, 3) and (G, 2) Int64 abc and sf addresses, (G, 5, 16) Int64 descriptor table."""
    problem_sizes = cute.make_tensor(ptr_problem_sizes, cute.make_layout((num_groups, 4), stride=(4, 1)))
    abc_ptrs = cute.make_tensor(ptr_abc, cute.make_layout((num_groups, 3), stride=(3, 1)))
    sf_ptrs = cute.make_tensor(ptr_sf, cute.make_layout((num_groups, 2), stride=(2, 1)))
    return problem_sizes, abc_ptrs, sf_ptrs, plan_memory(ptr_tensormaps, num_groups)


def plan_memory(ptr_tensormaps, num_groups):
    """A plan's memory as the (G, 5, 16) Int64 descriptor table it begins with (hopper.py's hold more after it)."""
    return cute.make_tensor(
        ptr_tensormaps,
        cute.make_layout((num_groups, TENSORMAPS_PER_GROUP, BYTES_PER_TENSORMAP // 8),
                         stride=(TENSORMAP_I64_PER_GROUP, BYTES_PER_TENSORMAP // 8, 1)))


class DescriptorBuilder:
    """The descriptor builder both kernels share: a small kernel, one warp per group, that writes each group's
    TMA descriptors into the plan's table once per input (`write_group_tensormaps`). A kernel class supplies
    `descriptor_atoms()` (its TMA atoms, in table-slot order) and `group_descriptor_tensors(tables, group)` (the
    group's tensors, one per atom), and may add to `after_descriptors` (runs after the descriptors, once per
    group's warp)."""

    def host_functions(self) -> tuple:
        """(name, host function, ArgumentSpec) of each host function this kernel's configuration compiles: the
        GEMM and the descriptor builder; a MoE form's kernel class says its own (nvfp4_group_gemm/moe_tables.py,
        hopper.py)."""
        if self.config.device_offsets:
            raise ValueError(f"{self.config.name}: a MoE form's kernel class names its host functions")
        return ("gemm", self, GEMM_ARGUMENTS), ("build_tensormaps", self.build_tensormaps, GEMM_ARGUMENTS)

    @cute.jit
    def build_tensormaps(self, ptr_problem_sizes: cute.Pointer, ptr_abc: cute.Pointer, ptr_sf: cute.Pointer,
                         ptr_tensormaps: cute.Pointer, num_groups: cutlass.Int32, total_tiles: cutlass.Int32,
                         num_ctas: cutlass.Int32, plan_ready: cutlass.Int32, stream):
        """The descriptor builder's host function (the GEMM's arguments)."""
        atoms = self.descriptor_atoms()
        self.tensormap_staging = tensormap_staging(len(atoms))
        problem_sizes, abc_ptrs, sf_ptrs, tensormaps = host_tables(
            ptr_problem_sizes, ptr_abc, ptr_sf, ptr_tensormaps, num_groups)
        self.tensormap_builder(atoms, problem_sizes, abc_ptrs, sf_ptrs, tensormaps, num_groups).launch(
            grid=(1, 1, num_groups), block=[32, 1, 1], smem=self.tensormap_staging.size_in_bytes(), stream=stream,
            use_pdl=self.config.pdl)

    @cute.kernel
    def tensormap_builder(self, atoms: tuple, problem_sizes: cute.Tensor, abc_ptrs: cute.Tensor, sf_ptrs: cute.Tensor,
                          tensormaps: cute.Tensor, num_groups: cutlass.Int32):
        _, _, group = cute.arch.block_idx()
        staging = SmemAllocator().allocate(self.tensormap_staging)
        tables = (problem_sizes, abc_ptrs, sf_ptrs, tensormaps, num_groups)
        write_group_tensormaps(atoms, self.group_descriptor_tensors(tables, group), tensormaps, group, staging)
        self.after_descriptors(tables, group)

    def after_descriptors(self, tables, group) -> None:
        """Nothing by default (after write_group_tensormaps's griddepcontrol.wait)."""

# ==== The B200 kernel ================================================================================================
# One CTA's shared-memory tensors (stage-indexed) and the slot where tcgen05.alloc writes the TMEM address.
SmemTensors = NamedTuple("SmemTensors", [(f, object) for f in ("a", "b", "sfa", "sfb", "c", "tmem_holding")])
# Shared-memory layouts as the device code receives them: a, b (MMA, MMA_M/N, MMA_K, STAGE) swizzled, sfa, sfb
# (MMA, MMA_M/N, MMA_K, STAGE), c (EPI_TILE_M, EPI_TILE_N, C_STAGE) swizzled, and the epilogue tile.
Sm100SmemLayouts = NamedTuple("Sm100SmemLayouts", [(f, object) for f in ("a", "b", "sfa", "sfb", "c", "epi_tile")])


class PipelineArrives(NamedTuple):
    """Consumer arrive counts of the B200 kernel's pipelines (`pipeline_arrive_counts`)."""
    ab_consumers: int
    acc_consumers: int


def pipeline_arrive_counts(roles: Sm100WarpRoles = SM100_ROLES) -> PipelineArrives:
    """ab: one tcgen05.commit per stage by the MMA warp (A' and B' are multicast to no other CTA: 1 + 1 - 1); acc:
    one elected thread per epilogue warp."""
    return PipelineArrives(1, roles.acc_consumer_arrives)


class Sm100GroupedGemmKernel(DescriptorBuilder):
    """Persistent warp-specialized grouped NVFP4 GEMM (roles, pipelines, stages, TMEM: the module docstring)."""

    def __init__(self, config: TileConfig, roles: Sm100WarpRoles = SM100_ROLES):
        roles.check()
        self.roles = roles
        if config.cta_group != 1 or config.tile_m != 128:
            raise ValueError(f"{config.name}: an MMA is one CTA's 128 rows of M' (cta_group {config.cta_group}, "
                             f"tile_m {config.tile_m})")
        if config.bf16_output and not config.device_offsets:
            raise ValueError(f"{config.name}: bf16 output is the MoE op's (device_offsets forms); custom_kernel's C "
                             "is fp16")
        self.config, self.tile_mnk = config, config.tile_mnk  # tile_mnk: the MMA's tile, the CTA's
        self.c_dtype = cutlass.BFloat16 if config.bf16_output else C_DTYPE
        # D' is C (row-major, N' contiguous) or C^T (column-major, M' contiguous).
        self.c_layout = LayoutEnum.COL_MAJOR if config.swap_ab else LayoutEnum.ROW_MAJOR
        # known once traced (`_setup_attributes`, `__call__`)
        self.num_ab_stages = self.num_acc_stages = self.num_c_stages = self.smem_bytes = None

    # ---- Host side --------------------------------------------------------------------------------------------------
    def _setup_attributes(self, tiled_mma):
        """Stage counts and shared-memory layouts (trace time)."""
        self.epi_tile = sm100_utils.compute_epilogue_tile_shape(self.tile_mnk, False, self.c_layout, self.c_dtype)
        self.num_acc_stages = acc_stages(self.config)
        self.num_c_stages = NUM_C_STAGES
        self.num_ab_stages = self._compute_stages(tiled_mma)
        (self.a_smem_layout_staged, self.b_smem_layout_staged, self.sfa_smem_layout_staged,
         self.sfb_smem_layout_staged) = self._ab_smem_layouts(tiled_mma, self.num_ab_stages)
        self.c_smem_layout_staged = sm100_utils.make_smem_layout_epi(
            self.c_dtype, self.c_layout, self.epi_tile, self.num_c_stages)

    def _ab_smem_layouts(self, tiled_mma, stages: int):
        """(MMA, MMA_M/N, MMA_K, STAGE) shared-memory layouts of A', B' (swizzled), SFA', SFB'."""
        t = self.tile_mnk
        return (sm100_utils.make_smem_layout_a(tiled_mma, t, AB_DTYPE, stages),
                sm100_utils.make_smem_layout_b(tiled_mma, t, AB_DTYPE, stages),
                blockscaled_utils.make_smem_layout_sfa(tiled_mma, t, SF_VEC_SIZE, stages),
                blockscaled_utils.make_smem_layout_sfb(tiled_mma, t, SF_VEC_SIZE, stages))

    def _compute_stages(self, tiled_mma) -> int:
        """As many A/B/SFA/SFB stages as fit beside the C buffers and barriers;
        `stage_bytes` is also each stage's TMA transaction count."""
        self.stage_bytes = sum(cute.size_in_bytes(dtype, layout) for dtype, layout in zip(
            (AB_DTYPE, AB_DTYPE, SF_DTYPE, SF_DTYPE), self._ab_smem_layouts(tiled_mma, 1)))
        c_bytes = self.num_c_stages * cute.size_in_bytes(
            self.c_dtype, sm100_utils.make_smem_layout_epi(self.c_dtype, self.c_layout, self.epi_tile, 1))
        free = SMEM_CAPACITY - SMEM_RESERVED - c_bytes
        return free // self.stage_bytes

    def make_tiled_mma(self):
        """The block-scaled MMA, one CTA's."""
        return sm100_utils.make_blockscaled_trivial_tiled_mma(
            AB_DTYPE, AB_DTYPE, OperandMajorMode.K, OperandMajorMode.K, SF_DTYPE, SF_VEC_SIZE, tcgen05.CtaGroup.ONE,
            self.tile_mnk[:2])

    @staticmethod
    def cluster_layout(tiled_mma):
        """(V, M, N, L) layout of the cluster's CTAs as the MMA sees them, V the CTAs of one MMA: (1, 1, 1, 1)."""
        return cute.tiled_divide(cute.make_layout((1, 1, 1)), (tiled_mma.thr_id.shape,))

    def make_tma_atoms(self):
        """(tiled MMA, ((TMA atom, its global tensor) for A', B', SFA', SFB', D')), in descriptor-slot order, built
        on placeholders with the right dtypes and majorness (trace time: the GEMM and the descriptor builder
        make the same templates)."""
        tiled_mma = self.make_tiled_mma()
        self._setup_attributes(tiled_mma)
        dim, k = cutlass.Int32(128), cutlass.Int32(256)
        a, b, sfa, sfb = self.operand_tensors(dim, dim, k, 0, 0, 0, 0)
        c = self.output_tensor(dim, dim, 0)
        cluster_shape = self.cluster_layout(tiled_mma).shape

        def load_atom(make, tensor, staged, **kwargs):  # a plain TMA load of one stage of `staged`
            stage = cute.slice_(staged, (None, None, None, 0))
            return make(cpasync.CopyBulkTensorTileG2SOp(tcgen05.CtaGroup.ONE), tensor, stage, self.tile_mnk, tiled_mma,
                        cluster_shape, **kwargs)
        return tiled_mma, (
            load_atom(cute.nvgpu.make_tiled_tma_atom_A, a, self.a_smem_layout_staged),
            load_atom(cute.nvgpu.make_tiled_tma_atom_B, b, self.b_smem_layout_staged),
            load_atom(cute.nvgpu.make_tiled_tma_atom_A, sfa, self.sfa_smem_layout_staged, internal_type=cutlass.Int16),
            load_atom(cute.nvgpu.make_tiled_tma_atom_B, sfb, self.sfb_smem_layout_staged, internal_type=cutlass.Int16),
            cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), c,
                                        cute.slice_(self.c_smem_layout_staged, (None, None, 0)), self.epi_tile))

    # ---- The descriptor builder's part (DescriptorBuilder): five descriptors per group ------------------------------
    def descriptor_atoms(self):
        """A', B', SFA', SFB' (slots 0-3, the producer's) and D' (slot 4, the epilogue's)."""
        _, ((atom_a, _), (atom_b, _), (atom_sfa, _), (atom_sfb, _), (atom_c, _)) = self.make_tma_atoms()
        return atom_a, atom_b, atom_sfa, atom_sfb, atom_c

    @cute.jit
    def group_descriptor_tensors(self, tables, group):
        """A', B', SFA', SFB', D' of `group` from its rows of the tables."""
        problem_sizes, abc_ptrs, sf_ptrs, _, _ = tables
        d = self.output_tensor(problem_sizes[group, 0], problem_sizes[group, 1], abc_ptrs[group, 2])
        return (*self.group_tensors(problem_sizes, group, abc_ptrs, sf_ptrs), d)

    @cute.jit
    def __call__(self, ptr_problem_sizes: cute.Pointer, ptr_abc: cute.Pointer, ptr_sf: cute.Pointer,
                 ptr_tensormaps: cute.Pointer, num_groups: cutlass.Int32, total_tiles: cutlass.Int32,
                 num_ctas: cutlass.Int32, plan_ready: cutlass.Int32, stream):
        """The GEMM's host function: tables (G, 4) Int32 M', N', K, L, (G, 3) Int64 A', B', D' and (G, 2) Int64
        SFA', SFB' addresses, the (G, 5, 16) Int64 descriptor table (`build_tensormaps`), counts, `plan_ready`
        (`LaunchPlan.launch`), stream."""
        tiled_mma, atoms = self.make_tma_atoms()
        (tma_atom_a, tma_a), (tma_atom_b, tma_b), (tma_atom_sfa, tma_sfa), (tma_atom_sfb, tma_sfb), \
            (tma_atom_c, tma_c) = atoms

        @cute.struct
        class SharedStorage:
            ab_mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.num_ab_stages]
            acc_mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.num_acc_stages]
            # 8 bytes that no role uses: the fields after them keep the offsets the reviewed PTX has
            reserved: cute.struct.MemRange[cutlass.Int64, 1]
            # a one-element range: .data_ptr() exists in every supported DSL release
            tmem_holding_buf: cute.struct.MemRange[cutlass.Int32, 1]
            # (EPI_TILE_M, EPI_TILE_N, STAGE)
            sC: cute.struct.Align[cute.struct.MemRange[self.c_dtype, cute.cosize(self.c_smem_layout_staged.outer)],
                                  1024]
            # (MMA, MMA_M, MMA_K, STAGE)
            sA: cute.struct.Align[cute.struct.MemRange[AB_DTYPE, cute.cosize(self.a_smem_layout_staged.outer)], 1024]
            # (MMA, MMA_N, MMA_K, STAGE)
            sB: cute.struct.Align[cute.struct.MemRange[AB_DTYPE, cute.cosize(self.b_smem_layout_staged.outer)], 1024]
            sSFA: cute.struct.Align[cute.struct.MemRange[SF_DTYPE, cute.cosize(self.sfa_smem_layout_staged)], 128]
            sSFB: cute.struct.Align[cute.struct.MemRange[SF_DTYPE, cute.cosize(self.sfb_smem_layout_staged)], 128]

        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()
        check_budget(self.config.name, "bytes of shared memory", self.smem_bytes, SMEM_CAPACITY)
        check_sm_exclusive(self.config.name, self.smem_bytes)

        problem_sizes, abc_ptrs, sf_ptrs, tensormaps = host_tables(
            ptr_problem_sizes, ptr_abc, ptr_sf, ptr_tensormaps, num_groups)

        # num_ctas persistent CTAs (z), each a cluster of one
        cluster = self.launch_cluster = (1, 1, 1)
        self.kernel(
            tiled_mma, tiled_mma, tma_atom_a, tma_a, tma_atom_b, tma_b, tma_atom_sfa, tma_sfa, tma_atom_sfb,
            tma_sfb, tma_atom_c, tma_c, problem_sizes, tensormaps, total_tiles, plan_ready,
            self.a_smem_layout_staged, self.b_smem_layout_staged, self.sfa_smem_layout_staged,
            self.sfb_smem_layout_staged, self.c_smem_layout_staged, self.epi_tile,
        ).launch(grid=(cluster[0], 1, num_ctas), block=[self.roles.threads, 1, 1], cluster=cluster,
                 smem=self.smem_bytes, stream=stream, use_pdl=self.config.pdl)

    # ---- Device side: the dispatcher --------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tiled_mma: cute.TiledMma, tiled_mma_sfb: cute.TiledMma,  # SFB' partition's MMA: tiled_mma
               tma_atom_a: cute.CopyAtom, mA_mkl: cute.Tensor, tma_atom_b: cute.CopyAtom, mB_nkl: cute.Tensor,
               tma_atom_sfa: cute.CopyAtom, mSFA_mkl: cute.Tensor, tma_atom_sfb: cute.CopyAtom, mSFB_nkl: cute.Tensor,
               tma_atom_c: cute.CopyAtom, mC_mnl: cute.Tensor, problem_sizes: cute.Tensor, tensormaps: cute.Tensor,
               total_tiles: cutlass.Int32, plan_ready: cutlass.Int32,
               # layouts built on the host must reach the device code as arguments
               a_smem_layout_staged: cute.ComposedLayout, b_smem_layout_staged: cute.ComposedLayout,
               sfa_smem_layout_staged: cute.Layout, sfb_smem_layout_staged: cute.Layout,
               c_smem_layout_staged: cute.ComposedLayout, epi_tile: cute.Tile):
        layouts = Sm100SmemLayouts(a_smem_layout_staged, b_smem_layout_staged, sfa_smem_layout_staged,
                                   sfb_smem_layout_staged, c_smem_layout_staged, epi_tile)
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        storage = SmemAllocator().allocate(self.shared_storage)
        # Everything the roles use from shared memory, so that no role needs the storage struct itself (older
        # DSL releases cannot carry it into dynamic branches).
        smem = SmemTensors(
            storage.sA.get_tensor(layouts.a.outer, swizzle=layouts.a.inner),
            storage.sB.get_tensor(layouts.b.outer, swizzle=layouts.b.inner),
            storage.sSFA.get_tensor(layouts.sfa), storage.sSFB.get_tensor(layouts.sfb),
            storage.sC.get_tensor(layouts.c.outer, swizzle=layouts.c.inner), storage.tmem_holding_buf.data_ptr())
        cluster_vmnk = self.cluster_layout(tiled_mma)
        ab_pipeline = self.make_ab_pipeline(storage.ab_mbar.data_ptr(), cluster_vmnk)
        acc_pipeline = self.make_acc_pipeline(storage.acc_mbar.data_ptr(), cluster_vmnk)
        # The groups' descriptors: slots 0-3 the producer's, slot 4 the epilogue's
        producer_maps = GroupTensormaps(tensormaps, 0, 4)
        epilogue_maps = GroupTensormaps(tensormaps, 4, 1)
        # (MMA, MMA_M, MMA_N, ACC_STAGE) accumulator layout, address known after allocation
        acc_shape = tiled_mma.partition_shape_C(self.tile_mnk[:2])
        tCtAcc_fake = tiled_mma.make_fragment_C(cute.append(acc_shape, self.num_acc_stages))
        tmem_alloc_barrier = self.make_tmem_alloc_barrier()

        # every role walks the same tiles, each with its own copy of this state
        total_tiles = self.tiles_to_walk(problem_sizes, total_tiles)
        scheduler = TileScheduler.create(problem_sizes, total_tiles, self.tile_mnk,
                                         self.config.schedule.contiguous)
        if warp_idx == self.roles.tma_warp:
            self.tma_producer(smem, ab_pipeline, scheduler, producer_maps, plan_ready, (tiled_mma, tiled_mma_sfb),
                              (tma_atom_a, tma_atom_b, tma_atom_sfa, tma_atom_sfb), mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl)
        if warp_idx == self.roles.mma_warp:
            self.mma_issuer(layouts, smem, ab_pipeline, acc_pipeline, problem_sizes, scheduler, tiled_mma,
                            tCtAcc_fake, tmem_alloc_barrier)
        if warp_idx < self.roles.mma_warp:
            self.epilogue(layouts, smem, acc_pipeline, scheduler, epilogue_maps, plan_ready, tiled_mma,
                          tCtAcc_fake, tmem_alloc_barrier, tma_atom_c, mC_mnl)

    # ---- Pipelines: each made here, its arrive counts derived from the roles and checked ----------------------------
    def make_ab_pipeline(self, barriers, cluster_vmnk):
        """TMA warp -> MMA warp over the A/B/SFA/SFB stages: the producer's one arrive plus a stage's bytes; one
        tcgen05.commit frees a stage."""
        arrives = pipeline_arrive_counts(self.roles)
        reach = cute.size(cluster_vmnk, mode=[1]) + cute.size(cluster_vmnk, mode=[2]) - 1  # CTAs its loads reach
        if arrives.ab_consumers != reach or cute.size(cluster_vmnk, mode=[0]) != 1:
            raise ValueError(f"{self.config.name}: ab consumers {arrives.ab_consumers}, cluster {cluster_vmnk} "
                             f"(loads reach {reach} CTAs)")
        thread = pipeline.Agent.Thread
        return pipeline.PipelineTmaUmma.create(
            barrier_storage=barriers, num_stages=self.num_ab_stages,
            tx_count=self.stage_bytes, producer_group=pipeline.CooperativeGroup(thread),
            consumer_group=pipeline.CooperativeGroup(thread, arrives.ab_consumers), cta_layout_vmnk=cluster_vmnk)

    def make_acc_pipeline(self, barriers, cluster_vmnk):
        """MMA warp -> epilogue warps over the TMEM accumulator stages: one tcgen05.commit fills a stage; one
        elected thread per epilogue warp frees it."""
        arrives = pipeline_arrive_counts(self.roles)
        if arrives.acc_consumers != self.roles.acc_consumer_arrives * cute.size(cluster_vmnk, mode=[0]):
            raise ValueError(f"{self.config.name}: acc consumers {arrives.acc_consumers}, cluster {cluster_vmnk}")
        thread = pipeline.Agent.Thread
        return pipeline.PipelineUmmaAsync.create(
            barrier_storage=barriers, num_stages=self.num_acc_stages, producer_group=pipeline.CooperativeGroup(thread),
            consumer_group=pipeline.CooperativeGroup(thread, arrives.acc_consumers), cta_layout_vmnk=cluster_vmnk)

    def make_tmem_alloc_barrier(self):
        """The epilogue warps (the first allocates TMEM) and the MMA warp: the TMEM address is published."""
        return pipeline.NamedBarrier(barrier_id=self.roles.tmem_alloc_barrier,
                                     num_threads=self.roles.epilogue_threads + 32)

    def make_c_pipeline(self):
        """The epilogue warps' TMA stores from the C buffers: every epilogue thread produces."""
        return pipeline.PipelineTmaStore.create(
            num_stages=self.num_c_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.roles.epilogue_threads))

    # ---- Global tensors: the TMA atoms' placeholders and each group's (the descriptor builder) ----------------------
    @cute.jit
    def operand_tensors(self, mp, np_, k, a_address, b_address, sfa_address, sfb_address):
        """A' (M', K) and B' (N', K), K-major FP4, and their blocked SFA', SFB'."""
        def gmem(dtype, address):  # the host checked the alignment
            return cute.make_ptr(dtype, address, cute.AddressSpace.gmem, assumed_align=PTR_ALIGN_BYTES)

        def kmajor(address, rows):
            return cute.make_tensor(gmem(AB_DTYPE, address), cute.make_layout((rows, k, 1), stride=(k, 1, rows * k)))

        def blocked_sf(address, rows):
            return cute.make_tensor(gmem(SF_DTYPE, address),
                                    blockscaled_utils.tile_atom_to_shape_SF((rows, k, 1), SF_VEC_SIZE))
        return kmajor(a_address, mp), kmajor(b_address, np_), blocked_sf(sfa_address, mp), blocked_sf(sfb_address, np_)

    @cute.jit
    def output_tensor(self, mp, np_, address):
        """D' (M', N'): C row-major, or C^T column-major when swapped."""
        stride = (1, mp, mp * np_) if cutlass.const_expr(self.config.swap_ab) else (np_, 1, mp * np_)
        return cute.make_tensor(
            cute.make_ptr(self.c_dtype, address, cute.AddressSpace.gmem, assumed_align=PTR_ALIGN_BYTES),
            cute.make_layout((mp, np_, 1), stride=stride))

    @cute.jit
    def group_tensors(self, problem_sizes: cute.Tensor, group, abc_ptrs, sf_ptrs):
        k = cute.assume(problem_sizes[group, 2], K_MULTIPLE)  # checked on the host
        return self.operand_tensors(problem_sizes[group, 0], problem_sizes[group, 1], k, abc_ptrs[group, 0],
                                    abc_ptrs[group, 1], sf_ptrs[group, 0], sf_ptrs[group, 1])

    def tiles_to_walk(self, problem_sizes, total_tiles):
        """The linear tile count the CTAs walk: the host's (the MoE form's kernel reads its builder's)."""
        return total_tiles

    def group_alpha(self, problem_sizes, group):
        """What a group's fp32 sums are multiplied by before the output's rounding: nothing (the MoE form's
        kernel: its global scales' product)."""
        return None

    # ---- Warp 5: TMA producer ---------------------------------------------------------------------------------------
    @cute.jit
    def tma_producer(self, smem, ab_pipeline, scheduler, tensormaps, plan_ready, tiled_mmas, atoms,
                     mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl):
        """Per tile, its K stages of A', B', SFA', SFB' into the ab pipeline's stages."""
        tma_atom_a, tma_atom_b, tma_atom_sfa, tma_atom_sfb = atoms
        # (MMA, MMA_M/N, MMA_K, STAGE) shared-memory stages
        sA, sB, sSFA, sSFB = smem.a, smem.b, smem.sfa, smem.sfb
        thr_mma, thr_mma_sfb = (mma.get_slice(0) for mma in tiled_mmas)
        # ((ATOM_V, REST_V), STAGE) and ((ATOM_V, REST_V), REST_M/N, REST_K, REST_L)
        tile_k = cute.slice_(self.tile_mnk, (None, 0, None))
        tile_n = cute.slice_(self.tile_mnk, (0, None, None))

        def partition(atom, smem, global_tensor, tiler, partition_fn, compact):
            g = partition_fn(cute.local_tile(global_tensor, tiler, (None, None, None)))
            s_part, g_part = cpasync.tma_partition(
                atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, 3), cute.group_modes(g, 0, 3))
            if cutlass.const_expr(compact):
                return cute.filter_zeros(s_part), cute.filter_zeros(g_part)
            return s_part, g_part

        tAsA, tAgA = partition(tma_atom_a, sA, mA_mkl, tile_k, thr_mma.partition_A, False)
        tBsB, tBgB = partition(tma_atom_b, sB, mB_nkl, tile_n, thr_mma.partition_B, False)
        tAsSFA, tAgSFA = partition(tma_atom_sfa, sSFA, mSFA_mkl, tile_k, thr_mma.partition_A, True)
        tBsSFB, tBgSFB = partition(tma_atom_sfb, sSFB, mSFB_nkl, tile_n, thr_mma_sfb.partition_B, True)
        producer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_ab_stages)
        # Launched while the previous kernel may still run: the operands and anything an earlier kernel may write
        # are read only past this wait; the plan's own tables and descriptors before it only once they are known
        # complete (`plan_ready`).
        tensormaps.fetch_early(scheduler, plan_ready)
        cute.arch.griddepcontrol_wait()
        while scheduler.has_work():
            work = scheduler.current()
            tensormaps.fetch_ahead(work, scheduler, plan_ready)
            # (source ((ATOM_V, REST_V), REST_K), stage destination) per tensor, in descriptor order
            loads = ((tma_atom_a, tAgA[(None, work.m_tile, None, 0)], tAsA),
                     (tma_atom_b, tBgB[(None, work.n_tile, None, 0)], tBsB),
                     (tma_atom_sfa, tAgSFA[(None, work.m_tile, None, 0)], tAsSFA),
                     (tma_atom_sfb, tBgSFB[(None, work.n_tile, None, 0)], tBsSFB))
            for k_tile in cutlass.range(0, work.k_tiles, 1, unroll=1):
                ab_pipeline.producer_acquire(producer_state)
                for i, (atom, src, dst) in enumerate(loads):
                    cute.copy(atom, src[(None, k_tile)], dst[(None, producer_state.index)],
                              tma_bar_ptr=ab_pipeline.producer_get_barrier(producer_state),
                              tma_desc_ptr=tensormaps.descriptor(work.group, i))
                producer_state.advance()
            scheduler.advance()
        cute.arch.griddepcontrol_launch_dependents()  # the last loads are issued: the next kernel may start
        ab_pipeline.producer_tail(producer_state)

    # ---- Warp 4: MMA issuer -----------------------------------------------------------------------------------------
    @cute.jit
    def mma_issuer(self, layouts, smem, ab_pipeline, acc_pipeline, problem_sizes, scheduler, tiled_mma, tCtAcc_fake,
                   tmem_alloc_barrier):
        """Per tile, its K stages' block-scaled MMAs into a TMEM accumulator buffer."""
        sA, sB, sSFA, sSFB = smem.a, smem.b, smem.sfa, smem.sfb
        # (MMA, MMA_M/N, MMA_K, STAGE) shared-memory descriptors
        tCrA = tiled_mma.make_fragment_A(sA)
        tCrB = tiled_mma.make_fragment_B(sB)
        tmem_alloc_barrier.arrive_and_wait()  # epilogue warp 0 has allocated TMEM
        acc_tmem_ptr, tCtAcc_base = self.tmem_accumulator(smem, tCtAcc_fake)
        # then the scale factors of one K stage
        acc_columns = tcgen05.find_tmem_tensor_col_offset(tCtAcc_base)
        tCtSFA = cute.make_tensor(
            cute.recast_ptr(acc_tmem_ptr + acc_columns, dtype=SF_DTYPE), blockscaled_utils.make_tmem_layout_sfa(
                tiled_mma, self.tile_mnk, SF_VEC_SIZE, cute.slice_(layouts.sfa, (None, None, None, 0))))
        sfa_columns = tcgen05.find_tmem_tensor_col_offset(tCtSFA)
        tCtSFB = cute.make_tensor(
            cute.recast_ptr(acc_tmem_ptr + acc_columns + sfa_columns, dtype=SF_DTYPE),
            blockscaled_utils.make_tmem_layout_sfb(
                tiled_mma, self.tile_mnk, SF_VEC_SIZE, cute.slice_(layouts.sfb, (None, None, None, 0))))
        check_budget(self.config.name, "TMEM columns",
                     acc_columns + sfa_columns + tcgen05.find_tmem_tensor_col_offset(tCtSFB), TMEM_COLUMNS)
        copy_sfa, tCsSFA_s2t, tCtSFA_s2t = self.s2t_copy_and_partition(sSFA, tCtSFA)
        copy_sfb, tCsSFB_s2t, tCtSFB_s2t = self.s2t_copy_and_partition(sSFB, tCtSFB)
        num_kblocks = cute.size(tCrA, mode=[2])
        consumer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_ab_stages)
        acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_acc_stages)
        while scheduler.has_work():
            work = scheduler.current()
            tCtAcc = tCtAcc_base[(None, None, None, acc_state.index)]
            acc_pipeline.producer_acquire(acc_state)  # the epilogue has drained this buffer
            tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
            for k_tile in cutlass.range(0, work.k_tiles, 1, unroll=1):
                ab_pipeline.consumer_wait(consumer_state)
                stage = (None, None, None, None, consumer_state.index)
                cute.copy(copy_sfa, tCsSFA_s2t[stage], tCtSFA_s2t)
                cute.copy(copy_sfb, tCsSFB_s2t[stage], tCtSFB_s2t)
                for kblock in cutlass.range(num_kblocks, unroll_full=True):
                    tiled_mma.set(tcgen05.Field.SFA, tCtSFA[(None, None, kblock)].iterator)
                    tiled_mma.set(tcgen05.Field.SFB, tCtSFB[(None, None, kblock)].iterator)
                    kblock_coord = (None, None, kblock, consumer_state.index)
                    cute.gemm(tiled_mma, tCtAcc, tCrA[kblock_coord], tCrB[kblock_coord], tCtAcc)
                    tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                ab_pipeline.consumer_release(consumer_state)  # frees the stage when the MMAs finish
                consumer_state.advance()
            acc_pipeline.producer_commit(acc_state)  # accumulator full when the MMAs finish
            acc_state.advance()
            scheduler.advance()
        acc_pipeline.producer_tail(acc_state)

    @staticmethod
    def tmem_accumulator(smem, tCtAcc_fake):
        """(TMEM base address, (MMA, MMA_M, MMA_N, ACC_STAGE) accumulators) once TMEM is allocated."""
        acc_tmem_ptr = cute.arch.retrieve_tmem_ptr(ACC_DTYPE, alignment=16,
                                                   ptr_to_buffer_holding_addr=smem.tmem_holding)
        return acc_tmem_ptr, cute.make_tensor(acc_tmem_ptr, tCtAcc_fake.layout)

    def s2t_copy_and_partition(self, sSF, tSF):
        """Shared -> tensor memory copy of one stage of scale factors: (tiled copy, ((ATOM_V, REST_V),
        REST_TILER, MMA_MN, MMA_K, STAGE) source, ((ATOM_V, REST_V), REST_TILER, MMA_MN, MMA_K) destination)."""
        sSF_compact = cute.filter_zeros(sSF)
        tSF_compact = cute.filter_zeros(tSF)
        tiled_copy = tcgen05.make_s2t_copy(
            cute.make_copy_atom(tcgen05.Cp4x32x128bOp(tcgen05.CtaGroup.ONE), SF_DTYPE), tSF_compact)
        thr_copy = tiled_copy.get_slice(0)
        source = tcgen05.get_s2t_smem_desc_tensor(tiled_copy, thr_copy.partition_S(sSF_compact))
        return tiled_copy, source, thr_copy.partition_D(tSF_compact)

    # ---- Warps 0-3: epilogue ----------------------------------------------------------------------------------------
    @cute.jit
    def epilogue(self, layouts, smem, acc_pipeline, scheduler, tensormaps, plan_ready, tiled_mma, tCtAcc_fake,
                 tmem_alloc_barrier, tma_atom_c, mC_mnl):
        """Per tile, the accumulator to fp16 D' (bf16 in a -bf16 form; the MoE form multiplies it by the group's
        alpha first) in 128 x 32 subtiles: TMEM -> registers -> smem -> TMA store."""
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        epilogue_barrier = pipeline.NamedBarrier(barrier_id=self.roles.epilogue_barrier,
                                                 num_threads=self.roles.epilogue_threads)
        leader = warp_idx == self.roles.epilogue_warps[0]
        if leader:
            cute.arch.alloc_tmem(TMEM_COLUMNS, smem.tmem_holding)
        tmem_alloc_barrier.arrive_and_wait()
        acc_tmem_ptr, tCtAcc_base = self.tmem_accumulator(smem, tCtAcc_fake)
        sC = smem.c  # (EPI_TILE_M, EPI_TILE_N, STAGE)
        # (MMA, MMA_M, MMA_N, REST_M, REST_N, REST_L) over the placeholder D'
        tCgC = tiled_mma.get_slice(0).partition_C(
            cute.local_tile(mC_mnl, cute.slice_(self.tile_mnk, (None, None, 0)), (None, None, None)))
        # TMEM -> registers: (T2R, T2R_M, T2R_N, EPI_M, EPI_N, ACC_STAGE)
        copy_t2r = tcgen05.make_tmem_copy(
            sm100_utils.get_tmem_load_op(self.tile_mnk, self.c_layout, self.c_dtype, ACC_DTYPE, layouts.epi_tile,
                                         False),
            cute.flat_divide(tCtAcc_base[((None, None), 0, 0, None)], layouts.epi_tile)[(None, None, 0, 0, 0)])
        thr_t2r = copy_t2r.get_slice(tidx)
        tTR_tAcc_base = thr_t2r.partition_S(cute.flat_divide(tCtAcc_base[((None, None), 0, 0, None)], layouts.epi_tile))
        gC_epi = cute.flat_divide(tCgC[((None, None), 0, 0, None, None, None)], layouts.epi_tile)
        tTR_rAcc = cute.make_rmem_tensor(
            thr_t2r.partition_D(gC_epi)[(None, None, None, 0, 0, 0, 0, 0)].shape, ACC_DTYPE)
        tTR_rC = cute.make_rmem_tensor(tTR_rAcc.shape, self.c_dtype)
        # registers -> shared memory: (R2S, R2S_M, R2S_N, C_STAGE)
        copy_r2s = cute.make_tiled_copy_D(
            sm100_utils.get_smem_store_op(self.c_layout, self.c_dtype, ACC_DTYPE, copy_t2r), copy_t2r)
        tRS_sC = copy_r2s.get_slice(tidx).partition_D(sC)
        tRS_rC = copy_r2s.retile(tTR_rC)
        # shared memory -> global (TMA): ((ATOM_V, REST_V), C_STAGE) and
        # ((ATOM_V, REST_V), EPI_M, EPI_N, REST_M, REST_N, REST_L)
        bSG_sC, bSG_gC_all = cpasync.tma_partition(
            tma_atom_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), cute.group_modes(gC_epi, 0, 2))
        c_pipeline = self.make_c_pipeline()
        acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_acc_stages)
        subtiles_done = cutlass.Int32(0)
        tensormaps.fetch_early(scheduler, plan_ready)
        cute.arch.griddepcontrol_wait()  # D' only once the previous kernel has finished
        while scheduler.has_work():
            work = scheduler.current()
            if leader:  # the warp issuing the TMA stores
                tensormaps.fetch_ahead(work, scheduler, plan_ready)
            # ((ATOM_V, REST_V), EPI_M x EPI_N)
            bSG_gC = cute.group_modes(bSG_gC_all[(None, None, None, work.m_tile, work.n_tile, 0)], 1, 3)
            # (T2R, T2R_M, T2R_N, EPI_M x EPI_N)
            tTR_tAcc = cute.group_modes(tTR_tAcc_base[(None, None, None, None, None, acc_state.index)], 3, 5)
            alpha = self.group_alpha(scheduler.problem_sizes, work.group)  # None: the sums as they are
            acc_pipeline.consumer_wait(acc_state)
            num_subtiles = cute.size(tTR_tAcc.shape, mode=[3])
            for subtile in cutlass.range(num_subtiles):
                cute.copy(copy_t2r, tTR_tAcc[(None, None, None, subtile)], tTR_rAcc)
                if cutlass.const_expr(alpha is not None):  # the MoE form: the group's alpha first
                    tRS_rC.store((copy_r2s.retile(tTR_rAcc).load() * alpha).to(self.c_dtype))
                else:
                    tRS_rC.store(copy_r2s.retile(tTR_rAcc).load().to(self.c_dtype))
                buffer = (subtiles_done + subtile) % self.num_c_stages
                cute.copy(copy_r2s, tRS_rC, tRS_sC[(None, None, None, buffer)])
                # generic-proxy smem writes must be visible to the TMA (async proxy)
                cute.arch.fence_proxy("async.shared", space="cta")
                epilogue_barrier.arrive_and_wait()
                if leader:
                    cute.copy(tma_atom_c, bSG_sC[(None, buffer)], bSG_gC[(None, subtile)],
                              tma_desc_ptr=tensormaps.descriptor(work.group, 0))
                    c_pipeline.producer_commit()
                    c_pipeline.producer_acquire()  # the buffer written next is free again
                epilogue_barrier.arrive_and_wait()
            subtiles_done += num_subtiles
            with cute.arch.elect_one():
                acc_pipeline.consumer_release(acc_state)  # one arrive per epilogue warp
            acc_state.advance()
            scheduler.advance()
        if leader:
            cute.arch.relinquish_tmem_alloc_permit()
        epilogue_barrier.arrive_and_wait()
        if leader:
            cute.arch.dealloc_tmem(acc_tmem_ptr, TMEM_COLUMNS)
        c_pipeline.producer_tail()


# ==== Compilation: one kernel per (configuration, architecture) ======================================================
class CompiledGemm(NamedTuple):
    """A configuration's kernel object and its host functions (`host_functions`), compiled: name -> (compiled
    function, ArgumentSpec). custom_kernel's forms: "gemm" and "build_tensormaps" (the descriptor builder, once
    per input), same arguments."""
    kernel: object
    functions: Dict[str, tuple]

    def host_function(self, name: str, device_index: int) -> "HostFunction":
        return HostFunction(*self.functions[name], device_index)


_compiled: Dict[tuple, CompiledGemm] = {}


def target_arch() -> str:
    """The architecture CuTe DSL compiles for: CUTE_DSL_ARCH if set, else the GPU's."""
    arch = os.environ.get("CUTE_DSL_ARCH")
    if arch:
        return arch
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}a"


def compile_grouped_gemm(config: TileConfig) -> CompiledGemm:
    """The host functions of `config`'s kernel (`config.make_kernel()`, here, in hopper.py or moe_tables.py),
    compiled once per configuration and target architecture; no GPU needed when CUTE_DSL_ARCH names the target."""
    key = (config.compile_key, target_arch())
    if key not in _compiled:
        kernel = config.make_kernel()
        _compiled[key] = CompiledGemm(kernel, {name: (compile_with_placeholders(function, spec), spec)
                                               for name, function, spec in kernel.host_functions()})
        freeze_long_lived_objects()
    return _compiled[key]


def freeze_long_lived_objects() -> None:
    """Put every object alive now (torch's, the DSL's, the compiled kernels': about 300,000) beyond the cyclic
    garbage collector, which otherwise walks them all in each full collection (~150 ms on a slow CPU). One
    such collection between a timed loop's events holds the host while the GPU drains its queue (samples
    65-130 ms long, the GPU idle, were seen on the H200). Frozen objects are still freed by reference
    counting."""
    gc.collect()
    gc.freeze()


def compile_with_placeholders(function, spec: "ArgumentSpec"):
    """cute.compile of a host function with placeholder values of its `spec`: only their types matter."""
    return cute.compile(function, *spec.convert(tuple(0 if w == 8 else 1 for w in spec.widths[:-1])),
                        make_fake_stream())


# ==== Input validation (host only; runs before any launch) ===========================================================
@functools.lru_cache(maxsize=1024)
def _expected_tensors(m: int, n: int, k: int) -> tuple:
    """(name, dtype, shape, strides) of a, b, c, sfa_reordered, sfb_reordered of sizes (M, N, K, 1) as the
    leaderboard makes them (scale factors: [32, 4, ceil(R/128), 4, K/64, 1] over [1, ceil(R/128), K/64, 32, 4, 4])."""
    k_blocks = ceil_div(k // SF_VEC_SIZE, 4)
    sfa, sfb = (((32, 4, row_blocks, 4, k_blocks, 1), (16, 4, k_blocks * 512, 1, 512, row_blocks * k_blocks * 512))
                for row_blocks in (ceil_div(m, 128), ceil_div(n, 128)))
    return (("a", torch.float4_e2m1fn_x2, (m, k // 2, 1), (k // 2, 1, m * k // 2)),
            ("b", torch.float4_e2m1fn_x2, (n, k // 2, 1), (k // 2, 1, n * k // 2)),
            ("c", torch.float16, (m, n, 1), (n, 1, m * n)),
            ("sfa_reordered", torch.float8_e4m3fn, *sfa), ("sfb_reordered", torch.float8_e4m3fn, *sfb))


def check_group_lengths(data) -> int:
    """The group count G, once the four lists are known to agree on it."""
    if not isinstance(data, (tuple, list)) or len(data) != 4:
        raise ValueError("data must be (abc_tensors, sfasfb_tensors, sfasfb_reordered_tensors, problem_sizes)")
    lengths = dict(zip(("abc_tensors", "sfasfb_tensors", "sfasfb_reordered_tensors", "problem_sizes"), map(len, data)))
    if len(set(lengths.values())) != 1:
        raise ValueError(f"group lists disagree in length: {lengths}")
    if lengths["problem_sizes"] == 0:
        raise ValueError("no groups: the group lists are empty")
    return lengths["problem_sizes"]


def check_problem_size(g: int, size) -> None:
    if len(size) != 4 or not all(isinstance(x, int) for x in size):
        raise ValueError(f"group {g}: problem size {size!r} is not four ints (M, N, K, L)")
    m, n, k, l = size
    if l != 1:
        raise ValueError(f"group {g}: L={l}, only L=1 is supported")
    if m < 1:
        raise ValueError(f"group {g}: M={m}, must be at least 1")
    if n < 1 or n % N_MULTIPLE:
        raise ValueError(f"group {g}: N={n} is not a positive multiple of {N_MULTIPLE}")
    if k < 1 or k % K_MULTIPLE:
        raise ValueError(f"group {g}: K={k} is not a positive multiple of {K_MULTIPLE}")


def validate_input(data, devices: bool = True) -> list:
    """Raise ValueError naming the group and the problem if `data` is not an input this module can compute (with
    `devices` False: every check but the devices'); returns (group, name, device) of every tensor."""
    check_group_lengths(data)
    abc_tensors, _, sfasfb_reordered_tensors, problem_sizes = data
    placed = []
    for g, (abc, sfr, size) in enumerate(zip(abc_tensors, sfasfb_reordered_tensors, problem_sizes)):
        check_problem_size(g, size)
        m, n, k, _ = size
        if len(abc) != 3 or len(sfr) != 2:
            raise ValueError(f"group {g}: expected (a, b, c) and (sfa_reordered, sfb_reordered)")
        for (name, dtype, shape, strides), tensor in zip(_expected_tensors(m, n, k), (*abc, *sfr)):
            if not isinstance(tensor, torch.Tensor):
                raise ValueError(f"group {g}: {name} is {type(tensor).__name__}, not a torch.Tensor")
            if tensor.dtype != dtype:
                raise ValueError(f"group {g}: {name} has dtype {tensor.dtype}, expected {dtype}")
            if tensor.shape != shape:
                raise ValueError(f"group {g}: {name} has shape {tuple(tensor.shape)}, expected "
                                 f"{shape} for (M, N, K, L)={tuple(size)}")
            # exact strides first (the leaderboard's tensors); a dimension of extent 1 has no meaningful stride
            if tensor.stride() != strides and any(
                    extent != 1 and got != want for extent, got, want in zip(tensor.shape, tensor.stride(), strides)):
                raise ValueError(f"group {g}: {name} has strides {tensor.stride()}, expected "
                                 f"{strides} (the leaderboard's layout)")
            if tensor.data_ptr() % PTR_ALIGN_BYTES:
                raise ValueError(f"group {g}: {name} is not {PTR_ALIGN_BYTES}-byte aligned")
            placed.append((g, name, tensor.device))
    for g, name, where in placed if devices else ():  # devices last, so that the rest can be exercised on a CPU
        if where.type != "cuda":
            raise ValueError(f"group {g}: {name} is on {where}, expected a CUDA device")
        if where != placed[0][2]:
            raise ValueError(f"group {g}: {name} is on {where}, other tensors on {placed[0][2]}")
    return placed


# ==== Host launcher, part 1 (no GPU needed): one pass checks a new input and reads the kernel's tables ===============
class ShapePlan(NamedTuple):
    """What a set of sizes on a device fixes: `size_words` (the tables' sizes part), `signature` (per group the
    dtype, shape, strides, device index of a, b, c, sfa_r, sfb_r as `gather_tables` reads them), plan memory,
    and `order`: the input's group of each of the kernel's groups (`group_order`)."""
    config: TileConfig
    size_words: Tuple[int, ...]
    tiles: int
    ctas: int  # the persistent grid: CTAs, or CTA pairs for cta_group 2 (hopper.py's (2,1,1) clusters)
    signature: Tuple[tuple, ...]
    plan_words: int
    order: Tuple[int, ...]


@functools.lru_cache(maxsize=256)
def shape_plan(problem_sizes: tuple, device_index: int, num_sms: int, config: Optional[TileConfig] = None,
               choose: Callable[[tuple, int], TileConfig] = choose_config,
               max_pairs: Optional[int] = None) -> ShapePlan:
    """Raises ValueError, naming the group, for sizes the kernel cannot take. `config` fixed, else
    `choose(problem_sizes, num_sms)` (the cost model's `choose_config`), called once the sizes are known to be valid.
    A configuration of hopper.py's CTA pairs gets at most `max_pairs` of them (`resident_clusters`), else SMs // 2."""
    for g, size in enumerate(problem_sizes):
        check_problem_size(g, size)
    config = config or choose(problem_sizes, num_sms)
    tiles = tile_count(problem_sizes, config)
    units = min(num_sms // config.cta_group, max_pairs or num_sms) if config.cta_group == 2 else num_sms
    ctas = persistent_ctas(tiles, units, config.schedule.balanced_ctas)
    order = group_order(problem_sizes, config.schedule)
    ordered = [problem_sizes[g] for g in order]
    size_words = tuple(w for mp, np_, k, l in (kernel_problem(s, config) for s in ordered)
                       for w in (mp | np_ << 32, k | l << 32))
    signature = tuple(tuple(x for _, dtype, shape, strides in _expected_tensors(m, n, k)
                            for x in (dtype, shape, strides, device_index)) for m, n, k, _ in ordered)
    return ShapePlan(config, size_words, tiles, ctas, signature, config.plan_words(problem_sizes), order)


def table_offsets(num_groups: int) -> Tuple[int, int, int]:
    """Offsets in the kernel's int64 tables of abc (G, 3) A', B', D' and sf (G, 2) SFA', SFB' addresses and sizes
    (G, 4) int32 M', N', K, L, two per word; each on an even word (the kernel assumes 16-byte aligned tables)."""
    sf_at = 3 * num_groups + num_groups % 2
    return 0, sf_at, sf_at + 2 * num_groups


def gather_tables(data, shape: ShapePlan, check: bool = True) -> Optional[list]:
    """The input's table words (`table_offsets`) in one pass over its tensors. With `check`, None unless
    every tensor matches `shape.signature` exactly and is 16-byte aligned: the leaderboard's inputs pass,
    anything else goes to `validate_input` (more lenient on extent-1 strides; names the problem)."""
    abc_tensors, _, sfasfb_reordered_tensors, _ = data
    swap = shape.config.swap_ab
    abc_words, sf_words = [], []
    for g, want in zip(shape.order, shape.signature):
        (a, b, c), (sfa, sfb) = abc_tensors[g], sfasfb_reordered_tensors[g]
        got = tuple(x for t in (a, b, c, sfa, sfb) for x in (t.dtype, t.shape, t.stride(), t.get_device()))
        if check and got != want:
            return None
        pa, pb, pc, psfa, psfb = a.data_ptr(), b.data_ptr(), c.data_ptr(), sfa.data_ptr(), sfb.data_ptr()
        if check and (pa | pb | pc | psfa | psfb) % PTR_ALIGN_BYTES:
            return None
        abc_words += (pb, pa, pc) if swap else (pa, pb, pc)
        sf_words += (psfb, psfa) if swap else (psfa, psfb)
    return abc_words + [0] * (len(abc_words) % 2) + sf_words + list(shape.size_words)


def input_key(data) -> tuple:
    """Identity of an input for the plan cache: its tensors' Python objects and its sizes. A plan holds weak
    references to those tensors and goes when one dies, so no live tensor can reuse an id a plan is keyed on."""
    abc_tensors, _, sfasfb_reordered_tensors, problem_sizes = data
    chain = itertools.chain.from_iterable
    return (*map(id, chain(abc_tensors)), *map(id, chain(sfasfb_reordered_tensors)), *map(tuple, problem_sizes))


# ==== Host launcher, part 2: device-side resources, argument storage, launches =======================================
TABLE_SLOT_WORDS = 512  # one plan's tables (7 G + 2 words) in a shared arena: G <= 72
TABLE_SLOTS_PER_CHUNK = 64


@functools.lru_cache(maxsize=None)
def sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def resident_clusters(index: int, cluster_size: int) -> int:
    """Clusters of `cluster_size` CTAs, each CTA an SM's whole shared memory, that device `index` holds at once:
    the DSL's occupancy query, which NVIDIA's examples size their persistent grids by (a GPC whose SM count is
    odd leaves an SM out of every pairing). A persistent grid of more would run its last clusters as a second
    wave. At most SMs // cluster_size, which is also the answer where the query fails (a DSL release without it,
    a driver that refuses it): the grid is then as large as it was before the query existed."""
    most = sm_count(index) // cluster_size
    try:
        with torch.cuda.device(index):
            found = utils.HardwareInfo(index).get_max_active_clusters(cluster_size)
    except Exception:  # the query is an improvement on SMs // cluster_size, never a new way to fail
        return most
    return max(1, min(most, int(found)))


# The current CUDA stream's handle on a device: torch's private accessor (a tenth of the cost), if any.
current_stream_handle = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda device_index: torch.cuda.current_stream(device_index).cuda_stream)


@functools.lru_cache(maxsize=None)
def _memcpy_htod_async():
    """The driver's cuMemcpyHtoDAsync_v2 through ctypes (libcuda.so.1, which CUDA torch loads too). From
    pageable memory it stages the bytes before returning, so the source may go at once."""
    fn = ctypes.CDLL("libcuda.so.1").cuMemcpyHtoDAsync_v2
    fn.argtypes = (ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    fn.restype = ctypes.c_int
    return fn


@functools.lru_cache(maxsize=None)
def _exchange_capture_mode():
    """The driver's cuThreadExchangeStreamCaptureMode through ctypes."""
    fn = ctypes.CDLL("libcuda.so.1").cuThreadExchangeStreamCaptureMode
    fn.argtypes = (ctypes.POINTER(ctypes.c_int),)
    fn.restype = ctypes.c_int
    return fn


CAPTURE_MODE_RELAXED = 2  # CU_STREAM_CAPTURE_MODE_RELAXED


def event_done(event: torch.cuda.Event) -> bool:
    """event.query() that another stream's (or thread's) global-mode graph capture allows: a query is one of the
    calls such a capture forbids, so this thread turns to relaxed capture mode around it (a plain query where
    the driver's call cannot be had)."""
    try:
        exchange = _exchange_capture_mode()
    except (OSError, AttributeError):
        return event.query()
    mode = ctypes.c_int(CAPTURE_MODE_RELAXED)
    if exchange(ctypes.byref(mode)) != 0:
        return event.query()
    try:
        return event.query()
    finally:
        exchange(ctypes.byref(mode))  # back to the mode this thread had


def copy_words_to_device(words: list, target: torch.Tensor, stream: int) -> None:
    """Copy int64 `words` into the device tensor `target`, ordered on `stream` (the current one)."""
    host = (ctypes.c_int64 * len(words))(*words)
    status = _memcpy_htod_async()(target.data_ptr(), host, ctypes.sizeof(host), stream)
    if status != 0:
        raise RuntimeError(f"CUDA error {status} copying the kernel's tables to the device")


class StreamResources:
    """What plans built on one (device, stream) share: an arena of table slots (read-only once copied; a freed
    slot is reused only by plans built on this stream, whose table copy is ordered after every earlier launch
    there). Nothing a kernel writes is shared between plans."""

    def __init__(self, device_index: int, stream: int):
        self.device_index = device_index
        self.stream = stream
        self.free_slots = []  # views of the arena's chunks

    def take_slot(self) -> torch.Tensor:
        if not self.free_slots:
            chunk = torch.empty(TABLE_SLOTS_PER_CHUNK, TABLE_SLOT_WORDS, dtype=torch.int64, device=self.device_index)
            self.free_slots = list(reversed(chunk.unbind(0)))
        return self.free_slots.pop()


def stream_capturing() -> bool:
    """Whether the current CUDA stream is being captured into a CUDA graph (False without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


# A host function's global-memory pointer argument (16-byte aligned unless `assumed_align` says otherwise)
global_pointer = functools.partial(make_ptr, mem_space=cute.AddressSpace.gmem, assumed_align=PTR_ALIGN_BYTES)

# What the host functions' pointer parameters point to, by parameter name: element type, assumed alignment
POINTER_PARAMETERS = {"ptr_problem_sizes": (cutlass.Int32, PTR_ALIGN_BYTES),
                      "ptr_abc": (cutlass.Int64, PTR_ALIGN_BYTES), "ptr_sf": (cutlass.Int64, PTR_ALIGN_BYTES),
                      "ptr_tensormaps": (cutlass.Int64, BYTES_PER_TENSORMAP), "ptr_offs": (cutlass.Int32, 4)}


class ArgumentSpec(NamedTuple):
    """A compiled host function's arguments, from its jit signature (`argument_spec`): their names in order (less
    the stream, which comes last), each one's bytes as `HostFunction` stores it (the stream's last), and each
    one's DSL type (cutlass.Int32 or Int64, or a pointer's (element type, alignment))."""
    names: Tuple[str, ...]
    widths: Tuple[int, ...]
    types: Tuple[object, ...]

    def ordered(self, values: dict) -> tuple:
        """This function's values, by name from `values` (which may name more: one call's values feed several
        host functions), in its order; ValueError naming those missing."""
        missing = [name for name in self.names if name not in values]
        if missing:
            raise ValueError(f"host function arguments missing: {', '.join(missing)} (of {', '.join(self.names)})")
        return tuple(values[name] for name in self.names)

    def convert(self, values: tuple) -> tuple:
        """Ordered values (less the stream) as the DSL's objects."""
        return tuple(global_pointer(t[0], v, assumed_align=t[1]) if isinstance(t, tuple) else t(v)
                     for t, v in zip(self.types, values))


def argument_spec(function, pointers: dict = POINTER_PARAMETERS) -> ArgumentSpec:
    """The ArgumentSpec of a host function (a cute.jit method or function ending in `stream`): Int32 and Int64
    parameters by their annotations, cute.Pointer ones as `pointers` names them."""
    parameters = [p for p in inspect.signature(function).parameters.values() if p.name != "self"]
    if not parameters or parameters[-1].name != "stream":
        raise TypeError(f"{function.__qualname__}: a host function's last parameter is its stream")
    types = []
    for p in parameters[:-1]:
        if p.annotation is cute.Pointer and p.name in pointers:
            types.append(pointers[p.name])
        elif p.annotation in (cutlass.Int32, cutlass.Int64):
            types.append(p.annotation)
        else:
            raise TypeError(f"{function.__qualname__}: parameter {p.name}: {p.annotation} (a pointer not in "
                            f"`pointers`, or not Int32, Int64)")
    widths = tuple(8 if isinstance(t, tuple) else t.width // 8 for t in types) + (8,)
    return ArgumentSpec(tuple(p.name for p in parameters[:-1]), widths, tuple(types))


GEMM_ARGUMENTS = argument_spec(Sm100GroupedGemmKernel.__call__)  # the GEMM's and the descriptor builder's
assert argument_spec(DescriptorBuilder.build_tensormaps) == GEMM_ARGUMENTS


def _execution_args(compiled):
    """The DSL's argument converter of a compiled function: `execution_args` (4.5+), `args_spec` (4.3) or None."""
    converters = (getattr(compiled, name, None) for name in ("execution_args", "args_spec"))
    return next((c for c in converters if hasattr(c, "generate_execution_args")), None)


@functools.lru_cache(maxsize=None)
def _cu_stream_type():
    """cuda-python's CUstream (what the DSL's host functions take for a stream) where installed, else None."""
    try:
        from cuda.bindings.driver import CUstream
    except ImportError:
        try:
            from cuda.cuda import CUstream
        except ImportError:
            return None
    return CUstream


def sample_values(spec: ArgumentSpec) -> tuple:
    """Distinct values of `spec`'s widths: 8-byte ones beyond 32 bits (so that a 4-byte conversion cannot pass)
    and 4096-byte aligned, as any pointer argument needs."""
    return tuple(0x1111_2222_3000 * (i + 1) if width == 8 else 5 + i for i, width in enumerate(spec.widths))


def argument_layout_matches(compiled, spec: ArgumentSpec) -> bool:
    """Whether this DSL release converts the host function's arguments to exactly one value each
    of `spec.widths` bytes, as `HostFunction` packs them, by the DSL's own conversion of sample values."""
    execution_args = _execution_args(compiled)
    CUstream = _cu_stream_type()
    if execution_args is None or CUstream is None:
        return False
    values = sample_values(spec)
    try:
        converted, _ = execution_args.generate_execution_args(spec.convert(values[:-1]) + (CUstream(values[-1]),), {})
    except Exception:  # any release-specific failure means: not this layout
        return False
    if len(converted) != len(values):
        return False
    for address, width, want in zip(converted, spec.widths, values):
        address = address.value if isinstance(address, ctypes.c_void_p) else address
        if not isinstance(address, int) or int.from_bytes(ctypes.string_at(address, width), "little") != want:
            return False
    return True


def pack_host_arguments(values, stream: int, extras) -> Tuple[ctypes.Array, int]:
    """Argument storage for a compiled host function, in one buffer: its `values` (its spec's order) and the
    stream, 8 signed bytes each (a 4-byte one, negative too, in the low half), then the array the host function
    takes: each value's address, then `extras`. Returns (the buffer, to outlive every call; the array's address)."""
    count = len(values) + 1
    buffer = (ctypes.c_uint64 * (2 * count + len(extras)))()
    base = ctypes.addressof(buffer)
    struct.pack_into("<%dq" % len(buffer), buffer, 0, *values, stream, *range(base, base + 8 * count, 8), *extras)
    return buffer, base + 8 * count


class HostFunction:
    """A compiled kernel's host function on one device, called with argument storage owned here. The DSL converts
    every argument on every call (most of a call's host time) into one array: each value's address, then the
    executor's entries (CUDA error cell, kernel handles). Where the release does so as `argument_layout_matches`
    expects, a plan owns such an array per stream; elsewhere the DSL converts once per stream (`bind`)."""

    def __init__(self, compiled, spec: ArgumentSpec, device_index: int):
        self.compiled = compiled
        self.spec = spec
        self.capi = None
        if not argument_layout_matches(compiled, spec):
            return
        try:  # the executor's attributes common to 4.3, 4.5 and 4.8
            executor = compiled.to(device_index)
            capi = executor.jit_module.capi_func
            self.result = executor.cuda_result  # None where the release reports no CUDA error
            extras = [ctypes.addressof(self.result)] if self.result is not None else []
            context = executor.exec_context
            extras += [p.value or 0 for p in (context.kernel_functions_ptrs if context is not None else [])]
        except (AttributeError, TypeError, NotImplementedError):
            return
        self.executor, self.extras, self.capi = executor, tuple(extras), capi

    def bind(self, values: dict, stream: int):
        """A function launching with `values` (name -> int: the spec's names, and maybe more) on `stream`;
        nothing launched yet."""
        values = self.spec.ordered(values)
        if self.capi is None:  # through the DSL's own conversion, kept for the next launches
            compiled, args = self.compiled, self.spec.convert(values) + (_cu_stream_type()(stream),)
            execution_args, run = _execution_args(compiled), getattr(compiled, "run_compiled_program", None)
            if run is None or execution_args is None:
                return lambda: compiled(*args)
            converted, keep_alive = execution_args.generate_execution_args(args, {})
            return lambda keep_alive=keep_alive: run(converted)
        storage, packed = pack_host_arguments(values, stream, self.extras)
        capi, result = self.capi, self.result

        def launch(keep_alive=(storage, self.executor)):
            capi(packed)
            if result is not None and result.value != 0:
                raise RuntimeError(f"CUDA error {result.value} launching the grouped GEMM")
        launch.storage, launch.packed = storage, packed
        return launch


class LaunchPlan:
    """One input's launch, built on the current stream: its tables in a slot of its stream's arena (beyond
    TABLE_SLOT_WORDS, an allocation of its own), its own device memory (`TileConfig.plan_words`: the descriptor
    table, written once here by the builder kernel, and hopper.py's scratch), and a launch function per stream.
    Launches of one plan on two streams share that memory, as they share the outputs."""

    def __init__(self, words: list, shape: ShapePlan, compiled: CompiledGemm, device_index: int,
                 owner: "GroupedGemmLauncher"):
        self.device_index = device_index
        self.owner = owner  # holds the HostFunction and StreamResources
        self.host = owner.host_function(compiled, "gemm", device_index)
        self.home = owner.stream_resources(device_index, current_stream_handle(device_index))
        self.words = words
        self.slot = self.home.take_slot() if len(words) <= TABLE_SLOT_WORDS else None
        self.tables = self.slot if self.slot is not None else torch.empty(len(words), dtype=torch.int64,
                                                                          device=device_index)
        copy_words_to_device(words, self.tables, self.home.stream)
        abc_at, sf_at, sizes_at = table_offsets(len(shape.signature))
        self.table_addresses = tuple(self.tables.data_ptr() + 8 * at for at in (sizes_at, abc_at, sf_at))
        self.counts = (len(shape.signature), shape.tiles, shape.ctas)
        self.memory = torch.empty(shape.plan_words, dtype=torch.int64, device=device_index)
        self.arguments = dict(zip(("ptr_problem_sizes", "ptr_abc", "ptr_sf"), self.table_addresses),
                              ptr_tensormaps=self.memory.data_ptr(), num_groups=self.counts[0],
                              total_tiles=self.counts[1], num_ctas=self.counts[2])  # and plan_ready
        owner.host_function(compiled, "build_tensormaps", device_index).bind(
            {**self.arguments, "plan_ready": 0}, self.home.stream)()
        self.built_launch = self.host.bind({**self.arguments, "plan_ready": 0}, self.home.stream)  # the GEMM next
        # The completion of the builder and that first GEMM, for launches not ordered after them by their stream:
        # waited for in a CUDA graph capture, it becomes an external event-wait node, so a replay too starts
        # after them.
        self.built = torch.cuda.Event(external=True)
        self.built_seen = False  # seen complete: no launch needs to wait for it any more
        self.used_on_other_stream = False  # its slot is read on two streams: never handed on
        self.captured = False  # launched in a CUDA graph capture: kept while its inputs live
        self.launch_by_stream = {}  # CUDA stream handle -> zero-argument launch needing no wait (the warm path)

    def launch(self):
        """Launch on the current stream. The first launch, on the plan's own stream right after the builder,
        passes `plan_ready` 0 (programmatic launch: the GEMM waits for the builder at `griddepcontrol.wait`).
        Every other launch passes 1: the tables and descriptors are complete before it can start, so it may fetch
        them before that wait. Until the first launch (builder and GEMM) is seen complete, a launch on another
        stream waits for it, and a launch being captured into a CUDA graph (on any stream: a graph may be
        replayed on any) waits for it through an external event-wait node in the graph, since a capture cannot
        ask whether it is done. Once it is seen complete, a stream's launch is kept as its warm path."""
        stream = current_stream_handle(self.device_index)
        if self.built_launch is not None and stream == self.home.stream:  # the cold call (never captured)
            try:
                self.built_launch()
            finally:  # an event never recorded would read as complete
                self.built_launch = None
                self.built.record(torch.cuda.current_stream(self.device_index))
            return
        capturing = stream_capturing()
        # torch's own stream object: ExternalStream(handle) of the default stream (0) would be a new stream
        on_stream = torch.cuda.current_stream(self.device_index)
        if capturing:
            self.captured = True  # the graph replays this launch: the plan's memory must stay
            if not self.built_seen:
                self.built.wait(on_stream)
        elif not self.built_seen:
            self.built_seen = event_done(self.built)
            if not self.built_seen and stream != self.home.stream:
                self.built.wait(on_stream)  # the tables and descriptors are written on the plan's own stream
        if stream != self.home.stream:
            # never hand the slot on; the allocator keeps the memory (and tables of their own) for this stream
            self.used_on_other_stream = True
            self.memory.record_stream(on_stream)
            if self.slot is None:
                self.tables.record_stream(on_stream)
        # a stream with a warm path never comes here
        launch = self.host.bind({**self.arguments, "plan_ready": 1}, stream)
        if self.built_seen and not capturing:
            self.launch_by_stream[stream] = launch
        launch()

    def release(self):
        """The plan left the cache: its slot may serve the next plan."""
        if self.slot is not None and not self.used_on_other_stream:
            self.home.free_slots.append(self.slot)
        self.slot = None


class GroupedGemmLauncher:
    """custom_kernel's host path (the B200 kernel's; hopper.py's, same arguments). A new input (cold) is checked
    and tabulated in one pass (`gather_tables`; else `validate_input` rules), its tables copied to an arena slot,
    a `plan_class` made; the same tensor objects and sizes again (warm: the timing loop) only launch. Only
    metadata is cached, never results. `compile_fn(config)` returns a `CompiledGemm`."""

    plan_class = LaunchPlan

    def __init__(self, compile_fn=None, config: Optional[TileConfig] = None, max_plans: int = 64,
                 choose: Callable[[tuple, int], TileConfig] = choose_config):
        self.compile_fn = compile_fn or compile_grouped_gemm
        self.config = config  # a fixed configuration; None: choose(problem_sizes, num_sms) per shape set
        self.choose = choose  # default: the cost model's choice
        self.max_plans = max_plans  # beyond it, the oldest plan goes
        self.plans: "OrderedDict[tuple, LaunchPlan]" = OrderedDict()
        self.hosts: Dict[tuple, HostFunction] = {}
        self.streams: Dict[Tuple[int, int], StreamResources] = {}

    def __call__(self, data: input_t, config: Optional[TileConfig] = None) -> output_t:
        try:
            key = input_key(data)
        except (TypeError, ValueError):  # not even the input's outline: a verdict
            validate_input(data)
            raise
        if config is not None:
            key += (config.name,)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.build(data, key, config)
        # The warm path: the stream's launch function, else LaunchPlan.launch (the first launch there)
        (plan.launch_by_stream.get(current_stream_handle(plan.device_index)) or plan.launch)()
        return [c for _, _, c in data[0]]

    def build(self, data, key, config: Optional[TileConfig]):
        shape, words, device_index = self.check_and_gather(data, config or self.config)
        if stream_capturing():
            raise RuntimeError("custom_kernel: this input is new, and a new input cannot be prepared during CUDA "
                               "graph capture (its tables are copied from the host): call it once before capturing")
        plan = self.plan_class(words, shape, self.compile_fn(shape.config), device_index, self)
        self.register(plan, key, data)
        return plan

    def check_and_gather(self, data, config: Optional[TileConfig]) -> Tuple[ShapePlan, list, int]:
        """A new input's ShapePlan, table words and device index; ValueError naming group and problem."""
        def gather(check: bool) -> Tuple[ShapePlan, Optional[list], int]:
            device_index = data[0][0][0].get_device()
            sizes, sms = tuple(map(tuple, data[3])), self.num_sms(device_index)
            shape = shape_plan(sizes, device_index, sms, config, self.choose)
            # as many pairs as the device holds at once (no query during a capture: `build` refuses a new input there)
            if shape.config.cta_group == 2 and not stream_capturing():
                shape = shape_plan(sizes, device_index, sms, config, self.choose, self.max_pairs(device_index))
            return shape, gather_tables(data, shape, check), device_index
        try:
            check_group_lengths(data)
            gathered = gather(check=True)
        except (TypeError, ValueError, AttributeError, IndexError):
            gathered = None, None, None
        if gathered[1] is None:  # not exactly the leaderboard's layout
            validate_input(data)  # raises, naming the group and the problem
            gathered = gather(check=False)
        return gathered

    def register(self, plan, key, data) -> None:
        """Cache `plan` under `key` until one of the input's tensors dies or it is the oldest of `max_plans`."""
        def forget(_ref, plans=self.plans, key=key):
            gone = plans.pop(key, None)
            if gone is not None:
                gone.release()
        plan.weak_inputs = [weakref.ref(t, forget) for t in itertools.chain(*data[0], *data[2])]
        self.plans[key] = plan
        if len(self.plans) > self.max_plans:  # a graph may still launch a captured plan: those stay
            oldest = next((k for k, p in self.plans.items() if not p.captured), None)
            if oldest is not None:
                self.plans.pop(oldest).release()

    @staticmethod
    def max_pairs(device_index: int) -> int:
        return resident_clusters(device_index, 2)

    @staticmethod
    def num_sms(device_index: int) -> int:
        """The SM count of CUDA device `device_index`; ValueError for a CPU tensor's -1 (`validate_input` rules)."""
        if device_index < 0:
            raise ValueError("the input is not on a CUDA device")
        return sm_count(device_index)

    def host_function(self, compiled: CompiledGemm, name: str, device_index: int) -> HostFunction:
        key = (id(compiled.functions[name][0]), device_index)
        return self.hosts.get(key) or self.hosts.setdefault(key, compiled.host_function(name, device_index))

    def stream_resources(self, device_index: int, stream: int) -> StreamResources:
        key = (device_index, stream)
        return self.streams.get(key) or self.streams.setdefault(key, StreamResources(device_index, stream))


_b200_launcher = GroupedGemmLauncher()


# ==== Entry point ====================================================================================================
# Code paths beside the B200 kernel: {(major, minor) or None (any other CUDA GPU): (label, run)}, registered by
# the module holding one when imported (hopper.py: sm_90; portable.py: None); this file imports none.
EXTRA_PATHS: Dict[Optional[Tuple[int, int]], Tuple[str, Callable[[input_t], output_t]]] = {}
PATH_NONE = "none"  # a GPU that is not a B200, with no path registered for it


@functools.lru_cache(maxsize=None)
def _path_for_index(index: int) -> Tuple[str, Optional[Callable]]:
    """(label, run) for CUDA device `index`; run is None for the B200 kernel and where nothing is registered."""
    capability = torch.cuda.get_device_capability(index)
    if capability == (10, 0):
        return PATH_B200, None
    return EXTRA_PATHS.get(capability) or EXTRA_PATHS.get(None) or (PATH_NONE, None)


_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def custom_kernel(data: input_t) -> output_t:
    """Compute every group's C in place and return the list of C tensors. Malformed input raises ValueError
    before anything runs (the launcher checks each new input once; a registered path checks its own)."""
    try:
        index = data[0][0][0].get_device()
    except (TypeError, IndexError, KeyError, AttributeError):
        validate_input(data)  # raises the precise error
        raise
    if index < 0:
        validate_input(data)  # raises: not on a CUDA device
    path, run = _path_for_index(index)
    if path == PATH_B200:
        if _current_device() == index:
            return _b200_launcher(data)
        with torch.cuda.device(index):
            return _b200_launcher(data)
    if run is None:
        raise RuntimeError(f"{torch.cuda.get_device_name(index)} is not a B200 and no code path is registered "
                           "for it: import hopper (sm_90) or portable (any CUDA GPU) first")
    with torch.cuda.device(index):
        return run(data)
