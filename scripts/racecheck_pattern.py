"""The Hopper kernel's scale-factor pattern alone, for `compute-sanitizer --tool racecheck`.

One warp reads each stage of a shared-memory ring with ordinary loads (LDS),
then releases the stage on its mbarrier; another warp waits for the release and
refills the stage with a bulk copy (`cp.async.bulk`, the async proxy), which
completes on the stage's full mbarrier: hopper.py's SFB stages exactly
(`load_stage` writes, `dequantize_a_fragment` reads), with CuTe DSL's
PipelineTmaAsync as the kernel builds it. The variant adds a proxy fence, or breaks the ordering:
  plain           as the kernel is
  consumer-fence  the readers run fence.proxy.async.shared::cta before releasing
  producer-fence  the copying thread runs it after its wait, before the copy
  early-read      the negative control: the readers load each stage before waiting for it (a real race,
                  on a line of its own, which scripts/racecheck_verdict.py must reject; its sums may be wrong)
Usage: python scripts/racecheck_pattern.py [VARIANT] (default plain) on a GPU
of sm_90 or newer; exits 0 when the sums the readers saw are exact (early-read: when it ran).
`--ptx VARIANT` prints its sm_90a PTX instead (no GPU needed). scripts/gpu-check.sh runs every
variant under racecheck: what racecheck reports on them tells a tool that
cannot see this ordering from a missing fence."""
import os
import sys
from pathlib import Path

if sys.argv[1:2] == ["--ptx"]:  # read when the DSL is first imported; the kept PTX goes to a folder of its own
    import tempfile
    os.environ.update(CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx",
                      CUTE_DSL_DUMP_DIR=tempfile.mkdtemp(prefix="racecheck-pattern-"))

import torch  # noqa: E402

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import cutlass.pipeline as pipeline  # noqa: E402
from cutlass.cute.nvgpu import cpasync  # noqa: E402
from cutlass.cute.runtime import make_ptr  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nvfp4_group_gemm.submission import SmemAllocator  # noqa: E402  (where this DSL release keeps it)

VARIANTS = ("plain", "consumer-fence", "producer-fence", "early-read")
STAGES, STAGE_BYTES, ROUNDS = 4, 64, 256  # 64 bytes: the Hopper kernel's SFB stage at tile_n 128, tile_k 128


@cute.kernel
def ring(src: cute.Tensor, out: cute.Tensor, variant: cutlass.Constexpr):
    """Warp 0 reads (lane l: the stage's 32-bit word l % 16), warp 1's lane 0 copies; `out` gets warp 0's sums."""
    warp, lane = cute.arch.warp_idx(), cute.arch.lane_idx()
    smem = SmemAllocator()
    barriers = smem.allocate_array(cutlass.Int64, 2 * STAGES)
    ring = smem.allocate_tensor(cutlass.Uint8, cute.make_layout((STAGE_BYTES, STAGES)), byte_alignment=128)
    ab = pipeline.PipelineTmaAsync.create(
        barrier_storage=barriers, num_stages=STAGES,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),  # one release per consumer warp
        tx_count=STAGE_BYTES, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))
    cute.arch.sync_threads()
    if warp == 1:
        bulk = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), cutlass.Uint8, num_bits_per_copy=STAGE_BYTES * 8)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, STAGES)
        for r in cutlass.range(ROUNDS, unroll=1):
            ab.producer_acquire(state)
            if lane == 0:
                if cutlass.const_expr(variant == "producer-fence"):
                    cute.arch.fence_view_async_shared()
                cute.copy(bulk, src[(None, r)], ring[(None, state.index)], mbar_ptr=ab.producer_get_barrier(state))
            state.advance()
    if warp == 0:
        words = cute.recast_tensor(ring, cutlass.Uint32)  # (16, STAGES)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, STAGES)
        total = cutlass.Uint32(0)
        for r in cutlass.range(ROUNDS, unroll=1):
            if cutlass.const_expr(variant == "early-read"):  # the negative control: a load before the wait
                total = words[(lane % 16, state.index)] + total
            ab.consumer_wait(state)
            if cutlass.const_expr(variant != "early-read"):
                total = total + words[(lane % 16, state.index)]
            if cutlass.const_expr(variant == "consumer-fence"):
                cute.arch.fence_view_async_shared()
            ab.consumer_release(state)
            state.advance()
        out[lane] = total


@cute.jit
def run(src_ptr: cute.Pointer, out_ptr: cute.Pointer, variant: cutlass.Constexpr):
    src = cute.make_tensor(src_ptr, cute.make_layout((STAGE_BYTES, ROUNDS)))  # a round's bytes contiguous
    out = cute.make_tensor(out_ptr, cute.make_layout(32))
    ring(src, out, variant).launch(grid=(1, 1, 1), block=(64, 1, 1), smem=2 * STAGES * 8 + STAGES * STAGE_BYTES + 128)


def pointers(src: int, out: int):
    """The kernel's global-memory arguments from addresses: `ROUNDS` x `STAGE_BYTES` bytes and 32 int32."""
    return (make_ptr(cutlass.Uint8, src, cute.AddressSpace.gmem, assumed_align=16),
            make_ptr(cutlass.Int32, out, cute.AddressSpace.gmem, assumed_align=16))


def compile_ptx(variant: str) -> str:
    """The variant's PTX, compiled without a GPU (CUTE_DSL_ARCH=sm_90a), for the CPU smoke test."""
    from nvfp4_group_gemm.compile_gate import ptx_text
    return ptx_text(cute.compile(run, *pointers(0x10000, 0x20000), variant))


def main(argv: list) -> int:
    variant = argv[0] if argv else "plain"
    if variant == "--ptx" and len(argv) == 2 and argv[1] in VARIANTS:
        print(compile_ptx(argv[1]))
        return 0
    if variant not in VARIANTS:
        print(f"racecheck_pattern.py: unknown variant {variant!r}: one of {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    data = torch.randint(0, 256, (ROUNDS, STAGE_BYTES), dtype=torch.uint8, device="cuda")
    out = torch.zeros(32, dtype=torch.int32, device="cuda")
    run(*pointers(data.data_ptr(), out.data_ptr()), variant)
    torch.cuda.synchronize()
    words = data.view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # (ROUNDS, 16)
    want = words.sum(0) & 0xFFFFFFFF
    got = out.to(torch.int64) & 0xFFFFFFFF
    exact = torch.equal(got, torch.cat([want, want]))
    print(f"racecheck_pattern {variant}: {'exact' if exact else 'WRONG'} ({ROUNDS} rounds of {STAGES} stages)")
    return 0 if exact or variant == "early-read" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
