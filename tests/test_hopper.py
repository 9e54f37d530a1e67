"""The Hopper (sm_90a) kernel of hopper.py: it compiles on the CPU for every
task shape, its dequantization identity holds for every E2M1 x E4M3 pair, and
its scale-factor offsets address the blocked layout the leaderboard makes.
It runs on a Hopper GPU through custom_kernel (tests/test_gpu.py)."""
import json
import re
import subprocess
import sys

import pytest
import torch

from conftest import BENCHMARK_CASES, ROOT, TEST_CASES
from test_compile import DSL_INSTALLS, env_for

hopper = pytest.importorskip("hopper")

_reports = {}


@pytest.fixture(params=DSL_INSTALLS)
def report(request, tmp_path_factory):
    """`eval.py compile --arch sm_90a --json` under one DSL install, once per session."""
    if request.param not in _reports:
        out = tmp_path_factory.mktemp(f"hopper-{request.param}")
        done = subprocess.run(
            [sys.executable, "-W", "ignore", "eval.py", "compile", "--arch", "sm_90a", "--json",
             str(out / "r.json"), "--keep", str(out / "ptx")],
            cwd=ROOT, env=env_for(request.param), capture_output=True, text=True, timeout=1800)
        report = json.loads((out / "r.json").read_text()) if (out / "r.json").exists() else None
        _reports[request.param] = (done, report)
    done, report = _reports[request.param]
    kernels = report["kernels"] if report else []
    if kernels and all("PtxasTooOld" in k.get("error", "") for k in kernels):
        pytest.skip(f"the PTX is newer than this machine's ptxas: {kernels[0]['error']}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return report


def test_compiles_for_sm90a_without_spills_and_serves_every_task_shape(report):
    assert [k["config"] for k in report["kernels"]] == list(hopper.SM90_CONFIGS)
    for kernel in report["kernels"]:
        config = hopper.SM90_CONFIGS[kernel["config"]]
        assert kernel["ok"], kernel
        assert kernel["spill_store_bytes"] == 0 and kernel["spill_load_bytes"] == 0 and kernel["stack_bytes"] == 0
        assert kernel["wgmma_serialized"] is False  # ptxas overlaps the wgmma with what follows
        # ctas_per_sm CTAs fit an SM: registers and shared memory
        assert 0 < kernel["registers"] <= hopper.register_budget(config) == kernel["register_budget"]
        assert 0 < kernel["dynamic_smem_bytes"] <= hopper.smem_budget(config) <= hopper.SMEM_CAPACITY
        assert config.ctas_per_sm * (kernel["dynamic_smem_bytes"] + hopper.SMEM_RESERVED) <= hopper.SMEM_PER_SM
        assert kernel["direct_host_arguments"] is True
        # one entry point, or two with the token pre-pass (its kernel, then the GEMM)
        assert kernel["kernels"] == (2 if config.tokens_prepass else 1)
    expected = [[[m, n, k, 1] for m, n, k in zip(c.args["m"], c.args["n"], c.args["k"])]
                for c in TEST_CASES + BENCHMARK_CASES]
    plans = report["shape_sets"]
    assert [p["problem_sizes"] for p in plans[:14]] == expected
    assert all(p["config"] == hopper.SM90_CONFIG.name and p["tiles"] >= 1 for p in plans)


@pytest.mark.parametrize("name", list(hopper.SM90_CONFIGS))
def test_ptx_has_the_designed_instructions(report, name):
    (kernel,) = [k for k in report["kernels"] if k["config"] == name]
    config = hopper.SM90_CONFIGS[name]
    roles = hopper.warp_roles(config)
    with open(kernel["ptx_file"]) as f:
        ptx = f.read()
    features = kernel["ptx_features"]
    # fp16 wgmma, fp32 accumulators: one per 16-wide K block of a stage, for each of the
    # two fp16 buffers (stages come in pairs); A from registers (RS) or shared memory (SS)
    # (with the weights in registers, wgmma's N is the tile's tokens)
    wgmma_n = config.mma_m if config.weights_in_registers else config.mma_n
    wgmma = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{wgmma_n}k16\.f32\.f16\.f16[^;]*", ptx)
    # (the warp-specialized form consumes one fp16 stage per loop iteration)
    assert len(wgmma) == (1 if config.warp_specialized else 2) * config.tile_k // 16
    a_in_registers = [re.search(r"\},\s*\{", w) is not None for w in wgmma]
    fragment_a = config.a_in_registers or config.weights_in_registers
    assert all(a_in_registers) if fragment_a else not any(a_in_registers), wgmma[0]
    # packed A and B by TMA through per-CTA descriptors; scale factors by bulk copy
    # (with the token pre-pass, fp16 A by TMA and only SFB by bulk copy; its kernel stores fp16 A,
    # 64 bytes per chunk, and lets the GEMM launch early, whose producer waits for it)
    # (fp16 A in 128-byte swizzle boxes: one TMA copy per 64 K)
    a_copies = config.tile_k // 64 if config.tokens_prepass else 1
    assert features["tma_load"] == a_copies + 1 and features["bulk_copy_load"] == (1 if config.tokens_prepass else 2)
    assert (len(re.findall(r"st\.global\.v4", ptx)) >= 4) == config.tokens_prepass
    assert ptx.count("griddepcontrol.launch_dependents;") == ptx.count("griddepcontrol.wait;") == int(
        config.tokens_prepass)
    assert features["tensormap_release"] == features["tensormap_acquire"] == hopper.NUM_TENSORMAPS
    # E4M3 scales converted in pairs; fp16 operands written with 16-byte stores, fenced for wgmma
    assert features["e4m3_to_f16x2"] >= 1
    # B (and A in SS form) in 16-K blocks: one 8-byte load and two 16-byte stores each; with the
    # weights in registers no thread writes an fp16 operand to shared memory
    a_in_shared_by_threads = not (config.a_in_registers or config.tokens_prepass)
    fp16_stores = len(re.findall(r"st\.shared\.v4", ptx))
    if config.weights_in_registers:
        assert fp16_stores == 0
    else:
        assert fp16_stores >= 2 * 2 * (2 if a_in_shared_by_threads else 1)
        assert "fence.proxy.async.shared::cta" in ptx
    assert len(re.findall(r"ld\.shared\.(?:u64|b64|v2\.u32)", ptx)) >= 2
    assert features["threads_per_cta"] == roles.threads == 32 * (4 * roles.consumer_warpgroups + 1)


# ---- the arithmetic, emulated bit for bit on the CPU ------------------------------
def f16(bits: int) -> float:
    return float(torch.tensor([bits], dtype=torch.int32).to(torch.int16).view(torch.float16)[0])


def e2m1(nibble: int) -> float:
    magnitude = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)[nibble & 7]
    return -magnitude if nibble & 8 else magnitude


def test_the_dequantization_identity_holds_for_every_pair():
    # dequant_word: nibble n at bits 12-15 of a half -> (n & 8) << 12 | (n & 7) << 9 = value * 2^-14
    for nibble in range(16):
        half = nibble << 12
        pattern = (half & 0x8000) | ((half & 0x7000) >> 3)
        assert f16(pattern) == e2m1(nibble) * 2.0 ** -14
    # scale_f16x2: fp16(E4M3) * 2^7; the product rounded once to fp16 is exact
    scales = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    finite = scales[torch.isfinite(scales)]
    values = torch.tensor([e2m1(n) for n in range(16)])
    scale16 = (finite.half() * 128).float()
    assert torch.equal(scale16, finite * 128)  # every finite scale * 2^7 is exact in fp16
    operand = (values[:, None] * 2.0 ** -14).half().float() * scale16[None, :]
    assert torch.equal(operand.half().float(), values[:, None] * finite[None, :] * 2.0 ** -7)
    assert operand.abs().max() < 65504  # no fp16 overflow
    assert hopper.ACC_SCALE == 2.0 ** 14


def run_ptx(ptx: str, operands: dict) -> dict:
    """Emulate the integer and f16x2 instructions of the inline PTX bit for bit."""
    regs = dict(operands)
    value = lambda x: regs[x] if x in regs else int(x, 0)
    for line in ptx.replace("{", "").replace("}", "").split(";"):
        parts = line.replace(",", " ").split()
        if not parts or parts[0] == ".reg":
            continue
        op, dst, args = parts[0], parts[1], [value(x) for x in parts[2:]]
        if op == "mov.b32":
            result = args[0]
        elif op == "shl.b32":
            result = args[0] << args[1]
        elif op == "shr.b32":
            result = args[0] >> args[1]
        elif op == "and.b32":
            result = args[0] & args[1]
        elif op == "or.b32":
            result = args[0] | args[1]
        elif op == "mul.rn.f16x2":
            halves = torch.tensor([[args[0] & 0xFFFF, args[0] >> 16], [args[1] & 0xFFFF, args[1] >> 16]],
                                  dtype=torch.int32).to(torch.int16).view(torch.float16)
            product = (halves[0] * halves[1]).view(torch.int16).to(torch.int32) & 0xFFFF
            result = int(product[0]) | int(product[1]) << 16
        else:
            raise AssertionError(f"unexpected instruction {op}")
        regs[dst] = result & 0xFFFFFFFF
    return regs


def test_the_conversion_ptx_yields_each_pair_times_the_scale():
    """DEQUANT_WORD_PTX and DEQUANT_PAIR_PTX, emulated: pair j of a word is the
    nibbles j and j + 4 as value * 2^-14 times the fp16 scale, exactly."""
    scale = 0x4C00  # fp16 16.0 in both halves
    scale2 = scale | scale << 16
    for word in (0x76543210, 0xFEDCBA98, 0x19E2B7C4, 0x8F0F70F0):
        out = run_ptx(hopper.DEQUANT_WORD_PTX, {"$4": word, "$5": scale2})
        for j in range(4):
            got = out[f"${j}"]
            for half, nibble in ((got & 0xFFFF, word >> 4 * j & 15), (got >> 16, word >> 4 * (j + 4) & 15)):
                assert f16(half) == e2m1(nibble) * 2.0 ** -14 * 16.0, (hex(word), j)
        # dequant_pair: the same arithmetic as pair 3 (nibbles at bits 12-15 and 28-31)
        assert run_ptx(hopper.DEQUANT_PAIR_PTX, {"$1": word, "$2": scale2})["$0"] == out["$3"]


@pytest.mark.parametrize("tile_k", sorted({c.tile_k for c in hopper.SM90_CONFIGS.values()}))
def test_scale_factor_offsets_address_the_blocked_layout(tile_k):
    from reference import generate_input
    import submission
    m, n, k = 200, 256, 768
    data = generate_input((m,), (n,), (k,), 1, seed=7, device="cpu")
    sfa_plain = data[1][0][0]  # [M, K/16, 1] E4M3 in row order
    blocked = data[2][0][0].permute(5, 2, 4, 0, 1, 3).contiguous().view(torch.uint8).flatten()
    assert blocked.numel() == submission.ceil_div(m, 128) * 128 * k // 16
    row_blocks_k = k // 64
    for row in (0, 1, 31, 32, 77, 127, 128, 199):
        for k_block in range(k // 16):
            stage, kb = divmod(k_block, tile_k // 16)
            stage_bytes = hopper.Sm90GroupedGemmKernel(hopper.SM90_CONFIGS[
                next(n for n, c in hopper.SM90_CONFIGS.items() if c.tile_k == tile_k)]).sf_stage_bytes
            base = (row // 128) * row_blocks_k * hopper.SF_BLOCK_BYTES + stage * stage_bytes
            got = blocked[base + hopper.sf_offset(row % 128, kb)]
            assert got == sfa_plain[row, k_block, 0].view(torch.uint8), (row, k_block)


# ---- dispatch ------------------------------------------------------------------
def test_sm90_goes_to_the_hopper_kernel_and_falls_back_without_it(monkeypatch):
    import submission
    monkeypatch.setattr(submission, "_capability", lambda index: (9, 0))
    submission._path_for_index.cache_clear()
    try:
        assert submission._path_for_index(0) == submission.PATH_HOPPER
        submission._path_for_index.cache_clear()
        monkeypatch.setattr(submission, "_hopper_module", lambda: None)  # hopper.py absent
        assert submission._path_for_index(0) == submission.PATH_PORTABLE
        submission._path_for_index.cache_clear()
        monkeypatch.setattr(submission, "_capability", lambda index: (10, 0))
        assert submission._path_for_index(0) == submission.PATH_B200
    finally:
        submission._path_for_index.cache_clear()
    assert submission.code_path(torch.device("cpu")) == submission.PATH_PORTABLE


def test_the_launcher_uses_the_hopper_tile_for_its_tables():
    import submission
    from reference import generate_input
    data = generate_input((80, 300), (256, 128), (512, 256), 2, seed=3, device="cpu")
    shape = submission.shape_plan(tuple(map(tuple, data[3])), -1, 132, hopper.SM90_CONFIG)
    assert shape.config is hopper.SM90_CONFIG
    # 128 x 128 tiles: 1 x 2 for (80, 256), 3 x 1 for (300, 128)
    assert shape.tiles == 2 + 3 and shape.ctas == 5


def test_two_ctas_per_sm_double_the_persistent_grid_and_the_workspace_holds_them():
    import submission
    two = hopper.Sm90TileConfig("two", 128, 128, False, ctas_per_sm=2, tile_k=64)
    many = ((1024, 4096, 256, 1),) * 4  # 8 x 32 tiles per group
    assert submission.shape_plan(many, -1, 132, two).ctas == 2 * 132
    assert submission.shape_plan(((100, 256, 256, 1),), -1, 132, two).ctas == 2  # never more than tiles
    assert two.ctas_per_sm <= submission.MAX_CTAS_PER_SM
    three = hopper.Sm90TileConfig("three", 128, 128, False, ctas_per_sm=3, tile_k=64)
    with pytest.raises(ValueError, match="3 CTAs per SM"):
        submission.launch_plan(many, three, 132)


def test_every_timing_diagnostic_compiles_for_sm90a():
    """`eval.py sweep --diagnose` variants (wrong results by design, timing only),
    compiled in a fresh process (the DSL takes its target at first use)."""
    assert {c.diagnostic for c in hopper.SM90_DIAGNOSTICS} == {"skip-convert", "skip-mma", "alu-only", "skip-a",
                                                               "skip-tokens", "skip-prepass"}
    assert not any(c.diagnostic for c in hopper.SM90_CONFIGS.values())
    script = ("import hopper\n"
              "for config in hopper.SM90_DIAGNOSTICS:\n"
              "    kernel = hopper.Sm90GroupedGemmKernel(config)\n"
              "    assert hopper.compile_kernel(kernel) is not None\n"
              "    assert kernel.smem_bytes <= hopper.smem_budget(config)\n"
              "    print('compiled', config.name)\n")
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", script], cwd=ROOT, capture_output=True, text=True,
                          env=dict(env_for("installed"), CUTE_DSL_ARCH="sm_90a"), timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.count("compiled ") == len(hopper.SM90_DIAGNOSTICS)


def test_the_token_prepass_asks_for_fp16_a_scratch_and_the_workspace_grows_for_it():
    import submission
    pre = next(c for c in hopper.SM90_CONFIGS.values() if c.tokens_prepass)
    sizes = ((80, 256, 512, 1), (300, 128, 256, 1))
    assert pre.scratch_bytes(sizes) == (80 * 512 + 300 * 256) * 2
    assert submission.shape_plan(sizes, -1, 132, pre).scratch_bytes == pre.scratch_bytes(sizes)
    assert submission.shape_plan(sizes, -1, 132, hopper.SM90_CONFIGS["sm90-128x128-k64-rs"]).scratch_bytes == 0
    assert all(c.scratch_bytes(sizes) == 0 for c in submission.TILE_CONFIGS.values())  # the B200 kernel
    # StreamResources.workspace_for on the CPU: grows, never shrinks, keeps what plans still name
    resources = object.__new__(submission.StreamResources)
    resources.device_index, resources.tensormap_words, resources.outgrown = "cpu", 64, []
    resources.workspace = torch.empty(64, dtype=torch.int64)
    first = resources.workspace
    assert resources.workspace_for(0) is first
    grown = resources.workspace_for(1000)
    assert grown.numel() == 64 + 125 and resources.outgrown == [first]
    assert resources.workspace_for(8) is grown


def test_the_token_prepass_reads_a_chunks_two_scale_factors_as_one_halfword():
    """convert_token_chunk: the scale factors of K k0 .. k0 + 15 and k0 + 16 ..
    k0 + 31 of a row are consecutive bytes of the blocked layout, 2-aligned."""
    from reference import generate_input
    m, n, k = 300, 128, 1024
    data = generate_input((m,), (n,), (k,), 1, seed=11, device="cpu")
    sfa_plain = data[1][0][0].view(torch.uint8)[:, :, 0]  # [M, K/16]
    blocked = data[2][0][0].permute(5, 2, 4, 0, 1, 3).contiguous().view(torch.uint8).flatten()
    for row in (0, 5, 31, 32, 127, 128, 200, 299):
        for k0 in range(0, k, hopper.TOKEN_CHUNK_K):
            at = hopper.token_scale_offset(row, k0, k)
            assert at % 2 == 0
            assert blocked[at: at + 2].tolist() == sfa_plain[row, k0 // 16: k0 // 16 + 2].tolist(), (row, k0)


def test_the_configuration_setting():
    import submission
    assert hopper.launcher_options(None) == {"config": hopper.SM90_CONFIG}
    assert hopper.launcher_options("sm90-128x128-k64") == {"config": hopper.SM90_CONFIGS["sm90-128x128-k64"]}
    with pytest.raises(ValueError, match="NVFP4_SM90_CONFIG='k99': expected one of sm90-"):
        hopper.launcher_options("k99")
    # the default: the weights in registers, after the token pre-pass (its scratch asked for)
    assert hopper.SM90_CONFIG.weights_in_registers and hopper.SM90_CONFIG.tokens_prepass
    sizes = ((1024, 4096, 7168, 1), (256, 4096, 7168, 1))
    assert submission.shape_plan(sizes, -1, 132, hopper.SM90_CONFIG).scratch_bytes == (1024 + 256) * 7168 * 2
    # a per-shape choice (the launcher's `choose`) reaches shape_plan after the sizes are checked
    lockstep = hopper.SM90_CONFIGS["sm90-128x128-k64-rs"]
    assert submission.shape_plan(sizes, -1, 132, None, lambda s: lockstep).scratch_bytes == 0
    with pytest.raises(ValueError, match="group 1"):
        submission.shape_plan(((128, 256, 512, 1), (128, 256, 100, 1)), -1, 132, None, lambda s: lockstep)


def test_the_register_budget_counts_warps_per_scheduler():
    """ptxas caps a CTA's registers by the warps one of the SM's four
    schedulers holds: 9 warps -> 3 on one -> 168; 13 -> 4 -> 128; 17 -> 5 -> 96
    (what it did for each of those warp counts); two CTAs of 9 -> 5 -> 96."""
    def config(name, **form):
        return hopper.Sm90TileConfig(name, 128, 128, False, tile_k=64, **form)
    assert hopper.register_budget(config("a", a_in_registers=True)) == 168
    assert hopper.register_budget(config("b", a_in_registers=True, converter_warpgroups=1)) == 128
    assert hopper.register_budget(config("c", warp_specialized=True)) == 96
    assert hopper.register_budget(config("d", a_in_registers=True, ctas_per_sm=2)) == 96


def test_the_compile_gate_fails_a_kernel_whose_wgmma_ptxas_serializes():
    import eval as ev
    line = ("ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized "
            "due to insufficient register resources for the function 'kernel'")
    assert ev.PTXAS_WGMMA_SERIALIZED.search(line)
    assert not ev.PTXAS_WGMMA_SERIALIZED.search("ptxas info    : Used 159 registers, used 1 barriers")


def test_sweep_picks_configurations_by_name():
    import eval as ev
    assert ev.sweep_configs() == list(hopper.SM90_CONFIGS.values())
    wr = ev.sweep_configs(["-wr"])
    assert wr and all(c.weights_in_registers for c in wr)
    with_diagnostics = ev.sweep_configs(["k128-wr"], diagnose=True)
    assert hopper.SM90_CONFIG in with_diagnostics and any(c.diagnostic for c in with_diagnostics)
    assert ev.sweep_configs(["no-such-form"]) == []


@pytest.mark.parametrize("row_bytes", [32, 64])
def test_the_swizzled_packed_stage_puts_a_warps_eight_rows_in_different_banks(row_bytes):
    """packed_column against CuTe's Swizzle<B, 4, 3> on byte offsets, and the
    reason for it: a fragment load reads 8 bytes of 8 consecutive rows."""
    bits = (row_bytes // 16).bit_length() - 1

    def cute_swizzle(offset):  # Swizzle<bits, 4, 3>: bits 7.. XORed into bits 4..
        return offset ^ ((offset & (((1 << bits) - 1) << 7)) >> 3)

    blocks = row_bytes // 8
    for row in range(128):
        for kb in range(blocks):
            assert row * row_bytes + 8 * hopper.packed_column(row, kb, row_bytes, bits) == cute_swizzle(
                row * row_bytes + 8 * kb)

    def banks(swizzle_bits, first_row, kb):
        return {(r * row_bytes + 8 * hopper.packed_column(r, kb, row_bytes, swizzle_bits)) // 4 % 32
                for r in range(first_row, first_row + 8)}
    for first_row in range(0, 128, 8):
        for kb in range(blocks):
            assert len(banks(bits, first_row, kb)) == 8  # one 4-byte bank per row (its word's first half)
            assert len(banks(0, first_row, kb)) == 128 // row_bytes  # unswizzled: shared 2- or 4-way
