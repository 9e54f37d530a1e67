"""The MoE op's groups from offs, on the device: what the leaderboard never runs, beside the MoE op (moe.py)
rather than in submission.py, which holds what it runs.

offs (E,) Int32 holds each group's end row in the stacked tokens A. From it, per group: its first row and rows
(each end clamped to T and to the earlier ends: `clamped_bounds`), its first row P_g in the blocked SFA (the
groups before it, each rounded up to 128 rows), its tiles, and its alpha (its global scales' product,
`global_scales_product`). hopper.py's MoE form computes these in each CTA; the B200 MoE form
(`Sm100MoeKernel`, `MOE_CONFIG`) has a builder kernel write them, with the descriptors, into the tables its
GEMM reads (`OffsetsBuilder`). `moe.device_tables` is their torch twin, which the tests compare."""
import dataclasses

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm

from . import launch, submission
from .submission import SF_VEC_SIZE, ceil_div


# ==== Host side: the tables' size, the grid's bound ==================================================================
def moe_table_words(num_groups: int) -> int:
    """Int64 words of the MoE form's tables: abc, sf and sizes (`table_offsets`), the tile count's row,
    each group's alpha."""
    _, _, sizes_at = submission.table_offsets(num_groups)
    return sizes_at + 2 * num_groups + 2 + ceil_div(num_groups, 2)


def most_tiles(tokens: int, experts: int, n: int, config: submission.TileConfig) -> int:
    """The most linear tiles any routing of `tokens` over `experts` groups of N = `n` can make: each group one
    partial M tile more than its rows fill, at most min(E, T) of them (the MoE form's grid bound)."""
    return (tokens + (config.tile_m - 1) * min(experts, tokens)) // config.tile_m * ceil_div(n, config.tile_n)


def inline_ptx(result_type, args, text: str, constraints: str):
    """Inline PTX with no side effects (the compiler may move or drop it), as both kernels and the token quantizer
    write their arithmetic: `text` reads $1.. (`args`, DSL values) and writes $0.. (`result_type`: an MLIR type,
    or a struct of several)."""
    return llvm.inline_asm(result_type, [a.ir_value() for a in args], text, constraints, has_side_effects=False,
                           is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


def inline_ptx_memory(result_type, args, text: str, constraints: str):
    """Inline PTX that reads or writes memory, or orders or waits for what does (atomics, fences, barriers, bulk
    copies): kept in place (side effects, a memory clobber); `result_type` None where it has no result."""
    clobber = "~{memory}" if not constraints else constraints + ",~{memory}"
    return llvm.inline_asm(result_type, [a.ir_value() for a in args], text, clobber, has_side_effects=True,
                           is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


# ==== Device side: the groups from offs, by one warp =================================================================
def shuffle_up(value, offset: int):
    """`value` of the lane `offset` below this one (lanes below `offset` keep their own): shfl.sync.up with
    clamp 0, its bound being the warp's first lane. Said here, not left to the DSL's default: releases before
    4.8 pass a clamp of 31, under which every lane keeps its own value."""
    return cute.arch.shuffle_sync_up(value, offset=offset, mask_and_clamp=0)


@cute.jit
def clamped_bounds(offs: cute.Tensor, g, num_groups, tokens, carried):
    """A warp's round of 32 groups (lane l: group g = the round's first + l): g's first row and end row, the end
    being the largest of its and the earlier groups' ends (a running maximum: a scan across the lanes, from
    `carried`, the end of the earlier rounds' last group), at most T. Lanes past the last group get empty
    groups at the last end."""
    lane = cute.arch.lane_idx()
    end = carried
    if g < num_groups:
        end = offs[g]
        if end > tokens:
            end = tokens
    for step in cutlass.range_constexpr(5):  # inclusive running maximum over the lanes
        earlier = shuffle_up(end, 1 << step)
        if lane >= (1 << step):
            if earlier > end:
                end = earlier
    if carried > end:
        end = carried
    begin = shuffle_up(end, 1)
    if lane == 0:
        begin = carried
    return begin, end


@cute.jit
def first_scale_rows(begin, end, carried_rows):
    """A warp's round of groups (`clamped_bounds`' rows): each group's first row P_g in the blocked scale buffer
    (the groups before it, each rounded up to 128 rows, from `carried_rows`, the earlier rounds' total) and
    every lane's total after this round."""
    lane = cute.arch.lane_idx()
    blocked = (end - begin + 127) // 128 * 128
    total = blocked
    for step in cutlass.range_constexpr(5):  # inclusive sum over the lanes
        earlier = shuffle_up(total, 1 << step)
        if lane >= (1 << step):
            total = total + earlier
    return carried_rows + total - blocked, carried_rows + cute.arch.shuffle_sync(total, 31)


@cute.jit
def group_from_offsets(offs: cute.Tensor, group, num_groups, tokens, tile_m: cutlass.Constexpr[int], tiles_n):
    """From the groups' end rows (a warp, each lane a share of the groups): `group`'s first row in A and its rows,
    its first row P_g in the blocked SFA (the groups before it, each rounded up to 128 rows), and every group's
    tiles (ceil(m / tile_m) x `tiles_n`). A group ends at the largest of its and the earlier groups' ends, at
    most T (a running maximum: a scan across the lanes), so that whatever `offs` holds no group reaches past
    row T and the groups' rows add up to at most T."""
    lane = cute.arch.lane_idx()
    start, rows, scale_row, tiles = cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(0)
    carried = cutlass.Int32(0)  # the end of the last group of the lanes' earlier rounds
    for first in cutlass.range(0, num_groups, 32, unroll=1):
        g = first + lane
        begin, end = clamped_bounds(offs, g, num_groups, tokens, carried)
        m = end - begin
        if g == group:
            start, rows = begin, m
        if g < group:
            scale_row += (m + 127) // 128 * 128
        if g < num_groups:
            tiles += (m + tile_m - 1) // tile_m * tiles_n
        carried = cute.arch.shuffle_sync(end, 31)
    add = lambda x, y: x + y
    return tuple(cute.arch.warp_reduction(x, add) for x in (start, rows, scale_row, tiles))


@cute.jit
def global_scales_product(global_scales, group):
    """`group`'s alpha, the product of its fp32 global scales (1 without them): `global_scales` holds (address,
    per group) of a_global and b_global, address 0 for none, per group 1 where a scale is one per group."""
    alpha = cutlass.Float32(1.0)
    for address, per_group in global_scales:  # unrolled while tracing
        if address != 0:
            alpha = alpha * cute.make_tensor(cute.make_ptr(
                cutlass.Float32, address + cutlass.Int64(group * per_group) * 4, cute.AddressSpace.gmem,
                assumed_align=4), cute.make_layout(1))[0]
    return alpha


# The MoE form's sizes table (`build_from_offsets`): the (G, 4) Int32 rows, then a row whose first word is the
# tile count (`tile_count_cell`), then each group's fp32 alpha (`group_alpha`).
@cute.jit
def tile_count_cell(problem_sizes: cute.Tensor):
    """The MoE form's (1,) Int32 tile count, in the row after the (G, 4) sizes."""
    return cute.make_tensor(problem_sizes.iterator + 4 * problem_sizes.shape[0], cute.make_layout(1))


@cute.jit
def group_alpha(problem_sizes: cute.Tensor, group):
    """The MoE form's (1,) Float32 of `group`'s alpha (its global scales' product, 1 without them), which its
    builder writes after the tile count's row and its epilogue multiplies the sums by."""
    address = problem_sizes.iterator.toint() + (4 * (problem_sizes.shape[0] + 1) + group) * 4
    return cute.make_tensor(cute.make_ptr(cutlass.Float32, address, cute.AddressSpace.gmem, assumed_align=4),
                            cute.make_layout(1))


# ==== The B200 MoE form: a builder kernel writes the tables and descriptors, then the GEMM reads them ================
class OffsetsBuilder:
    """The B200 MoE form's builder (mixed into the kernel class before submission.DescriptorBuilder): a small
    kernel, one warp per group, writing the group's rows of the tables the GEMM reads, its alpha, the tile
    count and the group's descriptors, from offs, every call."""

    def host_functions(self) -> tuple:
        """In launch order: this builder (`build_from_offsets`), then the GEMM, which reads what it wrote."""
        return (("build_from_offsets", self.build_from_offsets, OFFSETS_BUILDER_ARGUMENTS),
                ("gemm", self, submission.GEMM_ARGUMENTS))

    @cute.jit
    def build_from_offsets(self, ptr_offs: cute.Pointer, ptr_problem_sizes: cute.Pointer, ptr_abc: cute.Pointer,
                           ptr_sf: cute.Pointer, ptr_tensormaps: cute.Pointer, num_groups: cutlass.Int32,
                           tokens: cutlass.Int32, n: cutlass.Int32, k: cutlass.Int32, a_address: cutlass.Int64,
                           b_address: cutlass.Int64, c_address: cutlass.Int64, sfa_address: cutlass.Int64,
                           sfb_address: cutlass.Int64, a_global_address: cutlass.Int64,
                           b_global_address: cutlass.Int64, a_global_per_group: cutlass.Int32,
                           b_global_per_group: cutlass.Int32, stream):
        """The MoE form's builder (host function; `OFFSETS_BUILDER_ARGUMENTS`): offs (G,) Int32, each group's
        end row in A; the tables it writes (the GEMM's arguments: sizes (G + 1, 4), the tile count in the row
        after the last group's, then each group's alpha (`group_alpha`); abc, sf; the descriptor table); G, T,
        N, K; the base addresses of A (T, K/2), B (G, N, K/2), D (T, N), SFA (blocked, group g's block from row
        P_g) and SFB (G blocked blocks); the fp32 global scales' addresses (0: none) and whether each holds one
        value per group."""
        if cutlass.const_expr(self.config.swap_ab or not self.config.device_offsets):
            raise ValueError(f"{self.config.name}: only an unswapped configuration with device_offsets builds "
                             "its tables from offs")
        atoms = self.descriptor_atoms()
        self.tensormap_staging = submission.tensormap_staging(len(atoms))
        problem_sizes, abc_ptrs, sf_ptrs, tensormaps = submission.host_tables(
            ptr_problem_sizes, ptr_abc, ptr_sf, ptr_tensormaps, num_groups)
        offs = cute.make_tensor(ptr_offs, cute.make_layout(num_groups))
        self.offsets_builder(atoms, offs, problem_sizes, abc_ptrs, sf_ptrs, tensormaps, num_groups, tokens, n, k,
                             a_address, b_address, c_address, sfa_address, sfb_address, a_global_address,
                             b_global_address, a_global_per_group, b_global_per_group).launch(
            grid=(1, 1, num_groups), block=[32, 1, 1], smem=self.tensormap_staging.size_in_bytes(), stream=stream,
            use_pdl=self.config.pdl)

    @cute.kernel
    def offsets_builder(self, atoms: tuple, offs: cute.Tensor, problem_sizes: cute.Tensor, abc_ptrs: cute.Tensor,
                        sf_ptrs: cute.Tensor, tensormaps: cute.Tensor, num_groups: cutlass.Int32,
                        tokens: cutlass.Int32, n: cutlass.Int32, k: cutlass.Int32, a_address: cutlass.Int64,
                        b_address: cutlass.Int64, c_address: cutlass.Int64, sfa_address: cutlass.Int64,
                        sfb_address: cutlass.Int64, a_global_address: cutlass.Int64,
                        b_global_address: cutlass.Int64, a_global_per_group: cutlass.Int32,
                        b_global_per_group: cutlass.Int32):
        """One warp per group, all after griddepcontrol.wait (offs may be the previous kernel's output, and the
        tables the previous GEMM's input): the group's rows of the tables (`group_from_offsets`), the tile
        count (group 0) and its alpha (`group_alpha`), and its descriptors, made from those rows in registers."""
        _, _, group = cute.arch.block_idx()
        staging = submission.SmemAllocator().allocate(self.tensormap_staging)
        cute.arch.griddepcontrol_launch_dependents()  # the GEMM waits for this grid's end before reading anything
        cute.arch.griddepcontrol_wait()
        start, m, scale_row, tiles = group_from_offsets(offs, group, num_groups, tokens, self.config.tile_m,
                                                        ceil_div(n, self.config.tile_n))
        width = ceil_div(k // SF_VEC_SIZE, 4) * 4  # bytes of a blocked scale row
        # the group's rows of the three tables, in registers: its descriptors are made from these, and lane 0
        # stores them for the GEMM
        sizes = cute.make_rmem_tensor((1, 4), cutlass.Int32)
        abc = cute.make_rmem_tensor((1, 3), cutlass.Int64)
        sf = cute.make_rmem_tensor((1, 2), cutlass.Int64)
        sizes[0, 0], sizes[0, 1], sizes[0, 2], sizes[0, 3] = m, n, k, cutlass.Int32(1)
        abc[0, 0] = a_address + cutlass.Int64(start) * cutlass.Int64(k // 2)
        abc[0, 1] = b_address + cutlass.Int64(group) * cutlass.Int64(n) * cutlass.Int64(k // 2)
        abc[0, 2] = c_address + cutlass.Int64(start) * cutlass.Int64(n) * 2
        sf[0, 0] = sfa_address + cutlass.Int64(scale_row) * cutlass.Int64(width)
        sf[0, 1] = (sfb_address
                    + cutlass.Int64(group) * cutlass.Int64(ceil_div(n, 128) * 128) * cutlass.Int64(width))
        if cute.arch.lane_idx() == 0:
            for i in cutlass.range_constexpr(4):
                problem_sizes[group, i] = sizes[0, i]
            for i in cutlass.range_constexpr(3):
                abc_ptrs[group, i] = abc[0, i]
            for i in cutlass.range_constexpr(2):
                sf_ptrs[group, i] = sf[0, i]
            if group == 0:
                tile_count_cell(problem_sizes)[0] = tiles
            group_alpha(problem_sizes, group)[0] = global_scales_product(
                ((a_global_address, a_global_per_group), (b_global_address, b_global_per_group)), group)
        descriptors = self.group_descriptor_tensors((sizes, abc, sf, tensormaps, num_groups), cutlass.Int32(0))
        submission.write_group_tensormaps(atoms, descriptors, tensormaps, group, staging)
        tables = (problem_sizes, abc_ptrs, sf_ptrs, tensormaps, num_groups)
        self.after_descriptors(tables, group)


class Sm100MoeKernel(OffsetsBuilder, submission.Sm100GroupedGemmKernel):
    """The B200 kernel in its MoE form (`MOE_CONFIG`), with the builder from offs: its GEMM walks the tile count
    the builder wrote and multiplies each group's sums by the group's alpha."""

    @cute.jit
    def tiles_to_walk(self, problem_sizes, total_tiles):
        """The tile count `build_from_offsets` wrote (`tile_count_cell`), read after griddepcontrol.wait: a
        kernel wrote the tables, so nothing of them may be read before that kernel's end."""
        cute.arch.griddepcontrol_wait()
        return tile_count_cell(problem_sizes)[0]

    @cute.jit
    def group_alpha(self, problem_sizes, group):
        """The group's global scales' product, which the builder wrote (`group_alpha`)."""
        return group_alpha(problem_sizes, group)[0]


OFFSETS_BUILDER_ARGUMENTS = submission.argument_spec(OffsetsBuilder.build_from_offsets)


@dataclasses.dataclass(frozen=True)
class Sm100MoeConfig(launch.PlannedMemory, submission.TileConfig):
    """A B200 MoE form's configuration (device_offsets): its kernel has the builder from offs."""

    def make_kernel(self):
        return Sm100MoeKernel(self)


# The MoE op's form on sm_100: group sizes on the device, so no shape-based choice
MOE_CONFIG = Sm100MoeConfig(128, 128, device_offsets=True)
