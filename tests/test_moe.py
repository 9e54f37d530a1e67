"""grouped_mm_nvfp4 on the CPU: the MoE convention (offs on the device, blocked scale buffers, transposed B,
global scales), errors naming the argument, the torch.library registration under torch.compile."""
import pytest
import torch

from nvfp4_group_gemm import moe
from nvfp4_group_gemm.reference import dequantize, reorder_scale_factors


def routed(sizes, n=256, k=512, seed=0, global_scales=False, rows=None):
    """A MoE layer's inputs: tokens sorted by expert (group sizes `sizes`), stacked expert weights, quantized;
    and the plain per-group operands an independent reference uses."""
    gen = torch.Generator().manual_seed(seed)
    t, e = sum(sizes), len(sizes)
    x = torch.randn(t, k, generator=gen)
    w = torch.randn(e, n, k, generator=gen)
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)
    a_global = b_global = None
    if global_scales:
        a_global = torch.tensor(0.5)
        b_global = torch.rand(e, generator=gen) + 0.25
    a, a_scale = moe.quantize_tokens(x, offs, a_global, rows)
    b, b_scale = moe.quantize_experts(w, b_global)
    return dict(a=a, b=b, a_scale=a_scale, b_scale=b_scale, offs=offs, a_global=a_global, b_global=b_global), \
        (x, w)


def reference(args, out_dtype=torch.bfloat16):
    """Per group, from the unblocked scale factors (quantize_nvfp4 again) and reference.dequantize: fp64 sums."""
    a, b, offs = args["a"], args["b"], args["offs"].tolist()
    rows = []
    k = 2 * a.shape[1]
    for g, (start, end) in enumerate(zip([0] + offs[:-1], offs)):
        if end == start:
            continue
        a_plain = unblock(args["a_scale"], start, end, offs, k)
        b_plain = unblock(args["b_scale"][g].reshape(-1), 0, b.shape[1], None, k)
        product = dequantize(a[start:end], a_plain).double() @ dequantize(b[g], b_plain).double().t()
        alpha = 1.0
        if args["a_global"] is not None:
            alpha *= float(args["a_global"])
        if args["b_global"] is not None:
            alpha *= float(args["b_global"][g])
        rows.append((start, end, (product * alpha).to(out_dtype)))
    return rows


def unblock(buffer, start, end, offs, k):
    """Group rows start..end's scale factors read back from a blocked buffer through the leaderboard's own
    layout (reference.reorder_scale_factors puts row r, column j at [r%32, (r%128)//32, r//128, j%4, j//4])."""
    width = moe.scale_width(k)
    flat = buffer.reshape(-1).view(torch.uint8)
    first = 0
    if offs is not None:  # P_g: the padded rows of the groups before
        ends = [0] + offs
        first = sum(moe.round_up(b - a, 128) for a, b in zip(ends, ends[1:]) if b <= start)
    rows = end - start
    block = flat[first * width: (first + moe.round_up(rows, 128)) * width]
    blocks = block.view(moe.round_up(rows, 128) // 128, width // 4, 32, 4, 4)  # (rb, cb, r%32, (r%128)//32, c%4)
    r = torch.arange(rows).view(-1, 1)
    j = torch.arange(k // 16).view(1, -1)
    return blocks[r // 128, j // 4, r % 32, (r % 128) // 32, j % 4].view(torch.float8_e4m3fn)


def assert_matches(out, args, out_dtype=torch.bfloat16):
    for start, end, expected in reference(args, out_dtype):
        assert torch.equal(out[start:end], expected), (start, end, (out[start:end].float() - expected.float()
                                                                       ).abs().max())


@pytest.mark.parametrize("sizes", [(72, 0, 129, 1), (0, 0, 300, 0), (300,), (5, 7, 0, 0, 130, 64, 1, 0)],
                         ids=["mixed", "all on one expert", "one expert", "a quarter empty or more"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_the_op_matches_the_reference_per_group(sizes, out_dtype):
    args, _ = routed(sizes)
    assert_matches(moe.grouped_mm_nvfp4(**args, out_dtype=out_dtype), args, out_dtype)


def test_global_scales_padded_scale_buffers_and_the_transposed_weights_view():
    args, _ = routed((40, 0, 200, 17), global_scales=True, rows=1024)  # longer than the worst case
    out = moe.grouped_mm_nvfp4(**args)
    assert_matches(out, args)
    exact, _ = routed((40, 0, 200, 17), global_scales=True, rows=0)  # torch's tests: the blocks alone (P_E rows)
    with pytest.raises(ValueError, match="a_scale: .* may need up to .* or pass validate=True"):
        moe.grouped_mm_nvfp4(**exact)
    assert torch.equal(moe.grouped_mm_nvfp4(**exact, validate=True), out)
    transposed = dict(args, b=args["b"].transpose(1, 2))  # torch's (E, K/2, N) view of the same weights
    assert torch.equal(moe.grouped_mm_nvfp4(**transposed), out)


def test_rows_past_the_last_group_are_not_written_and_no_tokens_is_no_work():
    args, _ = routed((64, 64))
    args["offs"] = torch.tensor([64, 100], dtype=torch.int32)  # rows 100..127 belong to no group
    out = torch.full((128, 256), 7.0, dtype=torch.bfloat16)
    assert moe.grouped_mm_nvfp4(**args, out=out, validate=True) is out
    assert (out[100:] == 7.0).all() and not (out[:100] == 7.0).all()
    empty, _ = routed((0, 0, 0))
    assert moe.grouped_mm_nvfp4(**empty).shape == (0, 256)


def test_the_blocked_layout_is_the_leaderboards():
    """to_blocked and scale_offsets put row r, column j where reference.reorder_scale_factors does."""
    plain = torch.randint(1, 120, (200, 32), dtype=torch.uint8).view(torch.float8_e4m3fn)
    theirs = reorder_scale_factors(plain.unsqueeze(-1), 200, 512, "cpu")  # (32, 4, rb, 4, cb, 1) view
    flat_theirs = theirs.permute(5, 2, 4, 0, 1, 3).contiguous().view(torch.uint8).flatten()
    ours = moe.to_blocked(plain).view(torch.uint8).flatten()
    offsets = moe.scale_offsets(torch.arange(200), 32, moe.scale_width(512))
    assert torch.equal(ours[offsets], plain.view(torch.uint8)) and torch.equal(flat_theirs[offsets], ours[offsets])


def test_quantization_round_trips_values_it_can_represent():
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0] * 4).view(2, 16) * torch.tensor([[1.0], [-2.0]])
    packed, scales = moe.quantize_nvfp4(values)
    assert torch.equal(dequantize(packed, scales), values)
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    packed, scales = moe.quantize_nvfp4(x)
    error = (dequantize(packed, scales) - x).abs() / x.abs().amax()
    assert error.max() < 0.15  # 4-bit values: within a step of the block's largest


MALFORMED = [
    ("a", lambda a: dict(a, a=a["a"].float()), "a: dtype torch.float32"),
    ("a", lambda a: dict(a, a=a["a"][:, :7].contiguous()), "a: K = 14"),
    ("b", lambda a: dict(a, b=a["b"][:, :, :100]), "b: shape (3, 256, 100)"),
    ("b", lambda a: dict(a, b=a["b"][0]), "b: shape (256, 256): expected (E, N, K/2)"),
    ("offs", lambda a: dict(a, offs=a["offs"].long()), "offs: dtype torch.int64"),
    ("offs", lambda a: dict(a, offs=a["offs"][:2]), "offs: dtype torch.int32 shape (2,): expected int32 (3,)"),
    ("a_scale", lambda a: dict(a, a_scale=a["a_scale"][:128]), "a_scale: 4096 bytes: the groups' blocks may need"),
    ("a_scale", lambda a: dict(a, a_scale=a["a_scale"].float()), "a_scale: dtype torch.float32"),
    ("b_scale", lambda a: dict(a, b_scale=a["b_scale"][:2]), "b_scale: 16384 bytes: expected 3 x"),
    ("b_scale", lambda a: dict(a, b_scale=a["b_scale"].transpose(1, 2)), "b_scale: not contiguous"),
    ("b_global", lambda a: dict(a, b_global=torch.ones(2)), "b_global: dtype torch.float32 shape (2,)"),
    ("out", lambda a: dict(a, out=torch.empty(3, 3, dtype=torch.bfloat16)), "out: torch.bfloat16 (3, 3)"),
    ("out_dtype", lambda a: dict(a, out_dtype=torch.float32), "out_dtype: torch.float32"),
    ("a", lambda a: dict(a, a=[[0]]), "a: expected a torch.Tensor, got list"),
    # out's dtype, named as out's when out_dtype was never passed
    ("out", lambda a: dict(a, out=torch.empty(60, 256)), "out: dtype torch.float32: expected torch.bfloat16"),
]


@pytest.mark.parametrize("argument,spoil,fragment", MALFORMED, ids=[f"{m[0]}-{i}" for i, m in enumerate(MALFORMED)])
def test_malformed_arguments_are_refused_naming_the_argument(argument, spoil, fragment):
    args, _ = routed((40, 0, 20))
    with pytest.raises(ValueError, match="grouped_mm_nvfp4: " + argument) as error:
        moe.grouped_mm_nvfp4(**spoil(args))
    assert fragment in str(error.value), str(error.value)


def test_validate_reads_offs_and_refuses_what_the_kernel_cannot_check():
    args, _ = routed((40, 0, 20))
    for bad, why in (([40, 20, 60], "non-decreasing"), ([40, 40, 61], "ends at row 61, a has 60 rows")):
        with pytest.raises(ValueError, match=why):
            moe.grouped_mm_nvfp4(**dict(args, offs=torch.tensor(bad, dtype=torch.int32)), validate=True)


def test_the_torch_ops_check_the_scale_buffers_length_as_the_wrapper_does():
    """Called through torch.ops (as a compiled graph calls it), a short a_scale is refused naming it, before
    anything runs: its worst-case length is known on the host."""
    args, _ = routed((40, 0, 20))
    positional = [args[k] for k in ("a", "b", "a_scale", "b_scale", "offs", "a_global", "b_global")]
    positional[2] = args["a_scale"][:128]
    with pytest.raises(ValueError, match="grouped_mm_nvfp4: a_scale: .* may need up to"):
        torch.ops.nvfp4_group_gemm.grouped_mm_nvfp4(*positional, torch.bfloat16)
    out = torch.full((60, 256), 7.0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="grouped_mm_nvfp4: a_scale: .* may need up to"):
        torch.ops.nvfp4_group_gemm.grouped_mm_nvfp4_out(*positional, out)
    assert (out == 7.0).all()


@pytest.mark.parametrize("offs,why", [([50, 20, 60], "non-decreasing"), ([-5, 20, 60], "non-decreasing"),
                                      ([40, 40, 61], "ends at row 61, a has 60 rows")])
def test_the_portable_path_checks_offs_where_it_reads_it_on_the_host(offs, why):
    """On the CPU the portable path reads offs on the host anyway: malformed offs is an error naming it (it gave
    results off by up to 124, silently), and out is left as it was."""
    args, _ = routed((40, 0, 20))
    out = torch.full((60, 256), 7.0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="grouped_mm_nvfp4: offs: .*" + why):
        moe.grouped_mm_nvfp4(**dict(args, offs=torch.tensor(offs, dtype=torch.int32)), out=out)
    assert (out == 7.0).all()


def test_the_torch_ops_exist_once_the_package_is_imported_after_torch():
    """Code calling the op through torch.ops (or loading a graph naming it) needs only `import nvfp4_group_gemm`;
    a tool importing the package before torch still imports no torch."""
    import subprocess
    import sys
    from conftest import ROOT
    ops = subprocess.run([sys.executable, "-c", "import torch, nvfp4_group_gemm; "
                          "print(torch.ops.nvfp4_group_gemm.grouped_mm_nvfp4, "
                          "torch.ops.nvfp4_group_gemm.grouped_mm_nvfp4_out, torch.ops.nvfp4_group_gemm.moe_mlp_nvfp4)"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ops.returncode == 0 and "grouped_mm_nvfp4_out" in ops.stdout and "moe_mlp_nvfp4" in ops.stdout, \
        ops.stderr[-2000:]
    light = subprocess.run([sys.executable, "-c", "import sys, nvfp4_group_gemm; print('torch' in sys.modules)"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert light.stdout.strip() == "False", light.stderr[-2000:]


class ToyExperts(torch.nn.Module):
    """A MoE block's expert GEMM: routed tokens in, one NVFP4 grouped GEMM, scaled."""

    def forward(self, a, b, a_scale, b_scale, offs, b_global):
        return moe.grouped_mm_nvfp4(a, b, a_scale, b_scale, offs, b_global=b_global) * 2


def test_torch_compile_traces_the_op_whole_graph():
    args, _ = routed((30, 0, 70), global_scales=True)
    inputs = [args[k] for k in ("a", "b", "a_scale", "b_scale", "offs", "b_global")]
    eager = ToyExperts()(*inputs)  # first, so that the trace meets a call signature checked before
    compiled = torch.compile(ToyExperts(), fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(*inputs), eager)


def test_the_fake_implementation_gives_the_shape_without_data():
    from torch._subclasses.fake_tensor import FakeTensorMode
    args, _ = routed((30, 0, 70))
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = {k: (mode.from_tensor(v) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
        out = torch.ops.nvfp4_group_gemm.grouped_mm_nvfp4(fake["a"], fake["b"].transpose(1, 2), fake["a_scale"],
                                                          fake["b_scale"], fake["offs"], None, None, torch.float16)
    assert out.shape == (100, 256) and out.dtype == torch.float16


@pytest.mark.parametrize("seed", range(6))
def test_quantization_is_torchaos_bit_for_bit(seed):
    """moe.quantize_nvfp4 against torchao's NVFP4 quantizer (a dev dependency), with and without a per-tensor
    scale: the same E4M3 scales, the same packed bytes; and torchao's swizzled scales are moe.to_blocked's."""
    nvfp4 = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(seed)) * [1, 4, 9, 16, 0.02, 0.001][seed]
    x[0, :16] = 0.0  # a block of zeros
    x[1, :8] = -0.0  # negative zeros
    per_tensor = None if seed % 2 else (x.abs().amax() / (6.0 * 448.0)).float()
    scales, data = nvfp4.nvfp4_quantize(x, 16, per_tensor_scale=per_tensor)
    packed, ours = moe.quantize_nvfp4(x, per_tensor)
    assert torch.equal(data.view(torch.uint8).reshape(packed.shape), packed)
    assert torch.equal(scales.view(torch.uint8).reshape(ours.shape), ours.view(torch.uint8))
    swizzled = nvfp4.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor, is_swizzled_scales=True)
    assert torch.equal(swizzled.scale.view(torch.uint8).flatten(), moe.to_blocked(ours).view(torch.uint8).flatten())


def leaderboard_view(args, out, sizes):
    """The op's stacked operands as the leaderboard's per-group tuple (views, no copies; groups with rows)."""
    a, b, offs = args["a"], args["b"], args["offs"].tolist()
    width = moe.scale_width(2 * a.shape[1])
    abc, sf, problem_sizes, row = [], [], [], 0
    for g, (start, end) in enumerate(zip([0] + offs[:-1], offs)):
        if end == start:
            continue
        abc.append((a[start:end].unsqueeze(-1), b[g].unsqueeze(-1), out[start:end].unsqueeze(-1)))
        sfa = args["a_scale"].reshape(-1)[row * width:]  # the group's block starts at row P_g
        sf.append((sfa, args["b_scale"][g]))
        problem_sizes.append((end - start, b.shape[1], 2 * a.shape[1], 1))
        row += moe.round_up(end - start, 128)
    return abc, [None] * len(abc), sf, problem_sizes


@pytest.mark.parametrize("sizes", [(72, 1, 129, 300), (0, 40, 0, 0, 130, 5)], ids=["every group", "empty groups"])
def test_the_kernels_tables_come_from_offs_on_the_device_as_the_launcher_builds_them(sizes):
    """moe.device_tables (torch ops on offs, no host copy of the sizes) against submission.gather_tables, the
    leaderboard launcher's host tables, on the same tensors seen as per-group views; empty groups have M = 0."""
    from nvfp4_group_gemm import submission
    args, _ = routed(sizes)
    out = torch.empty(sum(sizes), 256, dtype=torch.float16)
    problem = moe.Problem(args["a"], args["b"], args["a_scale"], args["b_scale"], args["offs"], None, None,
                          torch.float16, out)
    words = moe.device_tables(problem, args["a"], args["a_scale"], args["b_scale"], args["offs"], out).tolist()
    data = leaderboard_view(args, out, sizes)
    config = submission.TILE_CONFIGS["128x128"]  # unswapped, round-robin: the groups in order
    shape = submission.shape_plan(tuple(data[3]), -1, 148, config)
    host = submission.gather_tables(data, shape, check=False)
    e, kept = len(sizes), [g for g, m in enumerate(sizes) if m]
    abc, sf_at, sizes_at = words[:3 * e], submission.table_offsets(e)[1], submission.table_offsets(e)[2]
    g_host = len(kept)
    host_abc, host_sf = host[:3 * g_host], host[submission.table_offsets(g_host)[1]:][:2 * g_host]
    host_sizes = host[submission.table_offsets(g_host)[2]:]
    assert [abc[3 * g:3 * g + 3] for g in kept] == [host_abc[3 * i:3 * i + 3] for i in range(g_host)]
    assert [words[sf_at + 2 * g:sf_at + 2 * g + 2] for g in kept] == [host_sf[2 * i:2 * i + 2] for i in range(g_host)]
    assert [words[sizes_at + 2 * g:sizes_at + 2 * g + 2] for g in kept] == [
        host_sizes[2 * i:2 * i + 2] for i in range(g_host)]
    assert all(words[sizes_at + 2 * g] & 0xFFFFFFFF == 0 for g in range(e) if not sizes[g])  # M = 0


def test_torchao_nvfp4_weights_go_in_without_copies():
    """Stacked expert weights quantized by torchao (NVFP4Tensor, swizzled scales, a per-tensor scale): the op
    reads its qdata and scale as they are (bit for bit quantize_experts's) and gives the same output."""
    nvfp4 = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    args, (_, w) = routed((40, 0, 100, 16))
    per_tensor = (w.abs().amax() / (6.0 * 448.0)).float()
    weights = nvfp4.NVFP4Tensor.to_nvfp4(w, per_tensor_scale=per_tensor, is_swizzled_scales=True)
    b, b_scale = moe.quantize_experts(w, per_tensor)
    assert torch.equal(weights.qdata.view(torch.uint8), b) and torch.equal(
        weights.scale.view(torch.uint8).flatten(), b_scale.view(torch.uint8).flatten())
    ours = moe.grouped_mm_nvfp4(**dict(args, b=b, b_scale=b_scale, b_global=per_tensor))
    theirs = moe.grouped_mm_nvfp4(**dict(args, b=weights, b_scale=None, b_global=None))
    assert torch.equal(ours, theirs)
    with pytest.raises(ValueError, match="b: an NVFP4Tensor carries its scales"):
        moe.grouped_mm_nvfp4(**dict(args, b=weights))


def test_the_decoding_tables_are_the_references_and_made_on_the_device():
    from nvfp4_group_gemm.reference import E2M1_TABLE, E4M3_TABLE
    e2m1, e4m3 = moe.decoding_tables(torch.device("cpu"))
    assert torch.equal(e2m1, E2M1_TABLE)
    assert torch.equal(torch.nan_to_num(e4m3, nan=-1.0), torch.nan_to_num(E4M3_TABLE, nan=-1.0))


def test_rows_past_the_last_group_read_no_scale_beyond_the_groups_blocks():
    """Rows past offs[-1] belong to no group: they must not index the scale buffer past P_E (validate=True
    accepts a buffer of exactly P_E rows)."""
    args, _ = routed((256,), rows=0)
    args["offs"] = torch.tensor([1], dtype=torch.int32)  # one row in the group: P_E = 128 rows
    args["a_scale"] = args["a_scale"][:128]
    out = torch.zeros(256, 256, dtype=torch.bfloat16)
    moe.grouped_mm_nvfp4(**args, out=out, validate=True)
    assert (out[1:] == 0).all()


def test_strides_the_kernels_cannot_take_are_refused():
    args, _ = routed((40, 0, 20))
    big = torch.zeros(6, dtype=torch.int32)
    big[::2] = args["offs"]
    with pytest.raises(ValueError, match="offs: stride 2"):
        moe.grouped_mm_nvfp4(**dict(args, offs=big[::2]))
    wide = torch.zeros(60, 512, dtype=torch.uint8)
    wide[:, :256] = args["a"]
    with pytest.raises(ValueError, match="a: shape .60, 256. strides .512, 1."):
        moe.grouped_mm_nvfp4(**dict(args, a=wide[:, :256]))


@pytest.fixture
def bound(monkeypatch):
    """The launches a KernelPlan would make, recorded instead ((spec, {name: value} of the spec's names, stream)
    per bind: a stand-in for submission.HostFunction), on a GPU of 132 SMs, with each configuration's host
    functions as its kernel names them (`host_functions`), compiled as stand-ins."""
    from nvfp4_group_gemm import submission
    bound = []

    class Recorder:
        def __init__(self, compiled, spec, device_index):
            self.spec = spec

        def bind(self, values, stream):
            bound.append((self.spec, dict(zip(self.spec.names, self.spec.ordered(values))), stream))
            return lambda: None

    def standin(config):
        kernel = config.make_kernel()
        return submission.CompiledGemm(kernel, {name: (name, spec) for name, _, spec in kernel.host_functions()})
    monkeypatch.setattr(submission, "HostFunction", Recorder)
    monkeypatch.setattr(submission, "compile_grouped_gemm", standin)
    monkeypatch.setattr(submission, "sm_count", lambda index: 132)
    return bound


def launch_two_routings(configs):
    """A plan of 4 experts, N 256, K 512 for 202 tokens (T rounded up: 256) launched on two routings of them
    in the same buffers, as a CUDA graph's replays have them: (the plan, the buffers, out)."""
    first, _ = routed((72, 0, 129, 1))
    second, _ = routed((1, 1, 1, 199), seed=1)
    configs = configs if isinstance(configs, tuple) else (configs,)
    plan = moe.KernelPlan(configs, 0, 7, experts=4, n=256, k=512, tokens=moe.token_capacity(202), device="cpu")
    out = torch.empty(202, 256, dtype=torch.float16)
    for routing in (first, second):
        for name in ("a", "offs", "a_scale"):
            first[name].copy_(routing[name])
        plan.launch(first["a"], first["b"], first["a_scale"], first["b_scale"], first["offs"], out)
    return plan, first, out


def operands(args, out) -> dict:
    """The base addresses a MoE call passes its host functions, by argument name, without global scales."""
    return dict(ptr_offs=args["offs"].data_ptr(), a_address=args["a"].data_ptr(), c_address=out.data_ptr(),
                sfa_address=args["a_scale"].data_ptr(), sfb_address=args["b_scale"].data_ptr(),
                a_global_address=0, b_global_address=0, a_global_per_group=0, b_global_per_group=0)


def test_the_kernel_path_passes_no_group_size_to_the_kernels(bound):
    """The kernels' host arguments follow from T, E, N, K and the SM count alone: two routings of the same
    tokens bind the same values (the builder computes the sizes, P_g and the tile count from offs on the
    device), and the grid is sized for the most tiles any routing can make."""
    from nvfp4_group_gemm import moe_tables, submission
    plan, first, out = launch_two_routings(moe_tables.MOE_CONFIG)
    gemm, builder_first, builder_second = bound  # the GEMM bound once, with the plan; the builder every call
    assert gemm[0] is submission.GEMM_ARGUMENTS and builder_first[0] is moe_tables.OFFSETS_BUILDER_ARGUMENTS
    assert builder_first == builder_second
    tables = {name: builder_first[1][name] for name in ("ptr_problem_sizes", "ptr_abc", "ptr_sf")}
    abc_at, sf_at, sizes_at = submission.table_offsets(4)
    assert tables == {name: plan.tables.data_ptr() + 8 * at
                      for name, at in zip(tables, (sizes_at, abc_at, sf_at))}
    assert builder_first[1] == {**tables, **operands(first, out), "ptr_tensormaps": plan.memory.data_ptr(),
                                "b_address": first["b"].data_ptr(),
                                "num_groups": 4, "tokens": 202, "n": 256, "k": 512}  # E, T, N, K: no group's size
    # the plan's T (256): every group one partial tile more than T / 128, two N tiles each
    most = (moe.token_capacity(202) + 127 * 4) // 128 * 2
    assert gemm[1] == {**tables, "ptr_tensormaps": plan.memory.data_ptr(), "num_groups": 4, "total_tiles": most,
                       "num_ctas": min(most, 132), "plan_ready": 0}
    assert all(s == 7 for _, _, s in bound)


def test_the_hopper_kernel_path_is_one_launch_with_no_group_size(bound):
    """hopper.py's MoE form computes the groups from offs itself: one launch per call, whose arguments follow
    from T, E, N, K, the SM count and base addresses alone (two routings bind the same values), the plan's
    token counters zero from the start (each launch leaves them so)."""
    from nvfp4_group_gemm import hopper
    config = hopper.SM90_MOE_CONFIGS["sm90-128x128-k128-wr-n16-64-offs"]
    plan, first, out = launch_two_routings(config)
    assert plan.tables is None and not plan.memory.any()
    first_call, second_call = bound
    assert first_call == second_call and first_call[0] is hopper.MOE_GEMM_ARGUMENTS and first_call[2] == 7
    scratch = plan.memory.data_ptr() + hopper.SM90_PLAN_LAYOUT.scratch_offset(4)
    most = (moe.token_capacity(202) + 127 * 4) // 128 * 2
    assert first_call[1] == {**operands(first, out), "ptr_memory": plan.memory.data_ptr(), "ptr_scratch": scratch,
                             "ptr_b": first["b"].data_ptr(), "num_groups": 4, "tokens": 202, "n": 256, "k": 512,
                             "one_wave_ctas": min(most, 132), "one_wave_rule": hopper.MOE_EVERY_CALL,
                             "num_ctas": min(most, 132)}


def test_two_hopper_forms_share_a_plan_and_the_device_chooses(bound):
    """Where hopper_policy.moe_forms gives two forms, each call launches both on the plan's one memory, in that order,
    with no group size: the first takes the calls past the default form's one wave, the second (the default)
    those within it, both told the default form's grid; each its own grid."""
    from nvfp4_group_gemm import hopper, hopper_policy
    forms = (hopper.SM90_MOE_CONFIGS["sm90-192x256-k64-wr-pair-offs"],
             hopper.SM90_MOE_CONFIGS["sm90-128x128-k128-wr-n16-64-offs"])
    plan, first, out = launch_two_routings(forms)
    pair_first, default_first, pair_second, default_second = bound
    assert (pair_first, default_first) == (pair_second, default_second)
    own = ("one_wave_rule", "num_ctas")
    assert ({k: v for k, v in pair_first[1].items() if k not in own}
            == {k: v for k, v in default_first[1].items() if k not in own})  # operands, plan memory, scratch
    most_default = (moe.token_capacity(202) + 127 * 4) // 128 * 2
    most_pair = (moe.token_capacity(202) + 191 * 4) // 192 * 1
    assert [pair_first[1][k] for k in ("one_wave_ctas", *own)] == [min(most_default, 132), hopper.MOE_PAST_ONE_WAVE,
                                                                   min(most_pair, 66)]
    assert [default_first[1][k] for k in ("one_wave_ctas", *own)] == [min(most_default, 132),
                                                                      hopper.MOE_IN_ONE_WAVE, min(most_default, 132)]
    assert pair_first[1]["one_wave_ctas"] == hopper_policy.moe_one_wave_ctas(moe.token_capacity(202), 4, 256, 132)


def test_a_hopper_plan_takes_the_calls_its_rule_says(bound):
    """A plan of one form told which calls to take (as the two-form launch tells each) binds that rule."""
    from nvfp4_group_gemm import hopper
    config = hopper.SM90_MOE_CONFIGS["sm90-128x128-k128-wr-n16-64-offs"]
    plan = moe.KernelPlan((config,), 0, 7, experts=4, n=256, k=512, tokens=256, device="cpu",
                          rules=(hopper.MOE_IN_ONE_WAVE,))
    args, _ = routed((72, 0, 129, 1))
    plan.launch(args["a"], args["b"], args["a_scale"], args["b_scale"], args["offs"], torch.empty(202, 256))
    ((_, values, _),) = bound
    assert values["one_wave_rule"] == hopper.MOE_IN_ONE_WAVE and values["one_wave_ctas"] == plan.one_wave_ctas


def hopper_plan_on_the_cpu(monkeypatch, capturing: list):
    """The default Hopper MoE form's plan for 4 experts, N 256, K 512, 256 tokens, with recording launches
    (the `bound` fixture) and a capture state the test sets (capturing[0]); a routing of 202 tokens and out."""
    from nvfp4_group_gemm import hopper, submission
    monkeypatch.setattr(submission, "stream_capturing", lambda: capturing[0])
    config = hopper.SM90_MOE_CONFIGS["sm90-128x128-k128-wr-n16-64-offs"]
    plan = moe.KernelPlan((config,), 0, 7, experts=4, n=256, k=512, tokens=256, device="cpu")
    args, _ = routed((72, 0, 129, 1))
    return plan, args, torch.empty(202, 256, dtype=torch.float16)


def test_a_plan_made_during_a_capture_zeroes_its_counters_at_its_first_launch_outside_one(monkeypatch, bound):
    """The token counters of a plan made during a CUDA graph capture are zeroed only when the graph replays
    (its allocation's memset is captured): the plan's first launch outside a capture zeroes them first, once;
    the descriptors' memory and the scratch are left alone."""
    from nvfp4_group_gemm import hopper
    capturing = [True]
    plan, args, out = hopper_plan_on_the_cpu(monkeypatch, capturing)
    launches = []

    def call():  # the plan's memory as its launch finds it
        plan.launch(args["a"], args["b"], args["a_scale"], args["b_scale"], args["offs"], out)
        launches.append(plan.memory.clone())
    plan.memory.fill_(-1)  # what the captured memset leaves before any replay, as far as this plan knows
    call()  # inside the capture: nothing zeroed eagerly
    capturing[0] = False
    call()
    plan.memory[hopper.SM90_PLAN_LAYOUT.fixed_offset(4) // 8:].fill_(-1)  # the kernel's own, as if run
    call()
    counters = slice(hopper.SM90_PLAN_LAYOUT.fixed_offset(4) // 8, hopper.SM90_PLAN_LAYOUT.scratch_offset(4) // 8)
    first, second, third = launches
    assert (first == -1).all()
    assert (second[counters] == 0).all() and (second[:counters.start] == -1).all()
    assert (second[counters.stop:] == -1).all()
    assert (third[counters] == -1).all()  # once only


def test_calls_whose_token_count_varies_share_a_few_plans():
    assert [moe.token_capacity(t) for t in (1, 64, 65, 202, 256, 257, 16384)] == [64, 64, 128, 256, 256, 512,
                                                                                  16384]


def test_vllms_expert_offsets_view_is_taken_as_offs_without_a_copy():
    """vLLM keeps each expert's start and the end, (E + 1,), and passes expert_offsets[1:]: a view that starts
    one element in, taken as it is."""
    args, _ = routed((72, 0, 129, 1))
    expert_offsets = torch.cat((torch.zeros(1, dtype=torch.int32), args["offs"]))
    view = expert_offsets[1:]
    assert view.data_ptr() == expert_offsets.data_ptr() + 4
    expected = moe.grouped_mm_nvfp4(**args)
    assert torch.equal(moe.grouped_mm_nvfp4(**{**args, "offs": view}), expected)


def test_plans_beyond_the_memory_limit_are_dropped_oldest_first_and_captured_ones_kept(monkeypatch, bound):
    """Plan memory is bounded: the least recently used plans no capture launched go first once theirs passes
    the limit; a plan launched in a CUDA graph capture stays until release_plans; the plan a call needs stays
    whatever its size."""
    from types import SimpleNamespace
    cache = moe.PlanCache(limit=300)
    plan = lambda nbytes, captured=False: SimpleNamespace(nbytes=nbytes, captured=captured)
    cache.add("a", plan(100))
    cache.add("captured", plan(1000, captured=True))
    cache.add("b", plan(100))
    cache.add("c", plan(100))
    assert list(cache.plans) == ["a", "captured", "b", "c"]  # 300 bytes droppable: at the limit
    assert cache.get("a") is not None  # now the most recent
    cache.add("d", plan(100))
    assert list(cache.plans) == ["captured", "c", "a", "d"]  # b, the least recently used, went
    cache.add("huge", plan(5000))
    assert list(cache.plans) == ["captured", "huge"]  # the call's own plan stays, whatever its size
    cache.clear()
    assert not cache.plans
    # a KernelPlan knows whether a capture launched it
    capturing = [False]
    kernel_plan, args, out = hopper_plan_on_the_cpu(monkeypatch, capturing)
    assert kernel_plan.nbytes == kernel_plan.memory.numel() * 8 >= 256 * 512 * 2
    kernel_plan.launch(args["a"], args["b"], args["a_scale"], args["b_scale"], args["offs"], out)
    assert not kernel_plan.captured
    capturing[0] = True
    kernel_plan.launch(args["a"], args["b"], args["a_scale"], args["b_scale"], args["offs"], out)
    capturing[0] = False
    assert kernel_plan.captured
    with pytest.raises(ValueError, match="nbytes: -1"):
        moe.set_plan_memory_limit(-1)


def test_an_eager_call_skips_the_torch_ops_dispatch_and_checks_once(monkeypatch):
    """In eager mode (nothing tracing, plain tensors) the wrapper runs the computation itself: one Problem, no
    torch op dispatch (most of an eager call's host time); under a tracing mode (fake tensors here, as
    torch.compile's) it goes through the op, whose fake gives the shape."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    args, _ = routed((30, 0, 70))
    made, ran = [], []
    real_checked, real_run = moe.Problem.checked, moe.run
    monkeypatch.setattr(moe.Problem, "checked", lambda *a, **k: made.append(1) or real_checked(*a, **k))
    monkeypatch.setattr(moe, "run", lambda *a, **k: ran.append(1) or real_run(*a, **k))
    dispatched = []
    op = torch.ops.nvfp4_group_gemm.grouped_mm_nvfp4
    monkeypatch.setattr(torch.ops.nvfp4_group_gemm, "grouped_mm_nvfp4",
                        lambda *a, **k: dispatched.append(1) or op(*a, **k), raising=False)
    out = moe.grouped_mm_nvfp4(**args)
    assert (len(made), len(ran), len(dispatched)) == (1, 1, 0)
    assert_matches(out, args)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = {k: (mode.from_tensor(v) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
        traced = moe.grouped_mm_nvfp4(**fake, out_dtype=torch.float16)
    assert len(dispatched) == 1 and traced.shape == (100, 256) and traced.dtype == torch.float16
    assert not moe.plain_eager(args["a"].requires_grad_(False), torch.zeros(2, requires_grad=True))


def test_a_calls_checks_are_made_once_per_signature_and_keep_no_tensor(monkeypatch):
    """Problem.checked checks a call's tensors once per signature (types, shapes, strides, dtypes, devices): a
    later call like it, with other tensors, is not checked again and computes on its own tensors; one that
    differs in anything checked is checked (and refused where it is wrong); what is kept holds no tensor."""
    monkeypatch.setattr(moe, "_checked_calls", {})
    checks = []
    real_init = moe.Problem.__init__
    monkeypatch.setattr(moe.Problem, "__init__", lambda self, *a, **k: checks.append(1) or real_init(self, *a, **k))
    first, _ = routed((30, 0, 70))
    again, _ = routed((50, 10, 40), seed=3)
    assert_matches(moe.grouped_mm_nvfp4(**first), first)
    assert_matches(moe.grouped_mm_nvfp4(**again), again)
    assert len(checks) == 1
    (facts,) = moe._checked_calls.values()
    assert not any(isinstance(v, torch.Tensor) for v in facts.values())
    transposed = dict(again, b=again["b"].transpose(1, 2))  # torch's (E, K/2, N) view: another signature
    assert_matches(moe.grouped_mm_nvfp4(**transposed), again)
    assert_matches(moe.grouped_mm_nvfp4(**transposed), again)
    assert len(checks) == 2
    short = dict(again, offs=again["offs"][:2])
    for _ in range(2):
        with pytest.raises(ValueError, match="offs: dtype torch.int32 shape \\(2,\\)"):
            moe.grouped_mm_nvfp4(**short)
    assert len(checks) == 4 and len(moe._checked_calls) == 2  # a refused call is checked every time, kept never


def test_the_remembered_signatures_are_bounded_the_first_checked_dropped_first(monkeypatch):
    """At most CHECKED_CALLS_KEPT signatures are remembered; a new one beyond them drops the first checked, which
    is checked again when it comes back (one dictionary lookup a call, no reordering)."""
    monkeypatch.setattr(moe, "_checked_calls", {})
    monkeypatch.setattr(moe, "CHECKED_CALLS_KEPT", 2)
    checks = []
    real_init = moe.Problem.__init__
    monkeypatch.setattr(moe.Problem, "__init__", lambda self, *a, **k: checks.append(1) or real_init(self, *a, **k))
    calls = [routed(sizes)[0] for sizes in ((30, 0, 70), (10, 10), (5, 6, 7, 8))]  # three signatures
    for args in (calls[0], calls[1], calls[0], calls[2], calls[1]):  # the third drops the first, used or not
        assert_matches(moe.grouped_mm_nvfp4(**args), args)
    assert len(checks) == 3 and len(moe._checked_calls) == 2
    assert_matches(moe.grouped_mm_nvfp4(**calls[0]), calls[0])
    assert len(checks) == 4 and len(moe._checked_calls) == 2


def test_a_traced_call_is_checked_without_the_remembered_signatures(monkeypatch):
    """Under torch.compile the wrapper's Python is traced, and copying a remembered Problem's state breaks the
    graph (dynamo cannot trace `__dict__.update`, as a GPU run of the fullgraph test found): a traced call is
    checked afresh and leaves the remembered signatures as they are."""
    monkeypatch.setattr(moe, "_checked_calls", {})
    args, _ = routed((30, 0, 70))
    moe.grouped_mm_nvfp4(**args)
    (key,) = moe._checked_calls
    before = dict(moe._checked_calls)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    checks = []
    real_init = moe.Problem.__init__
    monkeypatch.setattr(moe.Problem, "__init__", lambda self, *a, **k: checks.append(1) or real_init(self, *a, **k))
    problem = moe.Problem.checked(args["a"], args["b"], args["a_scale"], args["b_scale"], args["offs"], None, None,
                                  torch.bfloat16, None)
    assert problem.facts is None and checks == [1]  # checked by Problem(...), not copied from what is remembered
    assert moe._checked_calls == before


def test_the_kernel_forms_are_chosen_once_per_set_of_facts(monkeypatch):
    """kernel_forms' choice (hopper_policy.moe_forms models sampled routings) is made once per device capability, T, E,
    N, K, SM count, output type and form setting, and is the choice itself."""
    import dataclasses
    from nvfp4_group_gemm import hopper, hopper_policy, moe_tables, submission
    moe.forms_for.cache_clear()
    expected = tuple(dataclasses.replace(c, bf16_output=True) for c in hopper_policy.moe_forms(512, 2, 4096, 1536, 132))
    assert moe.forms_for((9, 0), 512, 2, 4096, 1536, 132, True, None) == expected
    assert moe.forms_for((9, 0), 512, 2, 4096, 1536, 132, True, None) is moe.forms_for((9, 0), 512, 2, 4096, 1536,
                                                                                       132, True, None)
    assert moe.forms_for.cache_info().misses == 1
    monkeypatch.setattr(hopper_policy, "moe_form", "sm90-128x128-k128-wr-n16-64-offs")
    (named,) = moe.forms_for((9, 0), 512, 2, 4096, 1536, 132, False, "sm90-128x128-k128-wr-n16-64-offs")
    assert named.tile_name == "sm90-128x128-k128-wr-n16-64-offs"
    assert moe.forms_for((10, 0), 512, 2, 4096, 1536, 148, False, None) == (moe_tables.MOE_CONFIG,)
    assert moe.forms_for((8, 0), 512, 2, 4096, 1536, 108, False, None) is None
    assert moe.forms_for((9, 0), 512, hopper.MOE_MAX_EXPERTS + 1, 4096, 1536, 132, False, None) is None


def test_a_launch_without_its_own_argument_storage_binds_again_from_the_cells_each_call():
    """moe.ChangingLaunch where the host function owns no argument storage (the DSL's own conversion): the first
    launch uses the first binding, each later one binds again with the values the cells hold then."""
    import ctypes
    from nvfp4_group_gemm import submission
    spec = submission.ArgumentSpec(("ptr_offs", "num_groups", "c_address"), (8, 4, 8), (None,) * 3)
    seen = []

    class Host:
        def __init__(self):
            self.spec, self.binds = spec, 0

        def bind(self, values, stream):
            self.binds += 1
            storage = (ctypes.c_int64 * 4)(*spec.ordered(values), stream)
            return lambda: seen.append(tuple(storage))
    host = Host()
    cells = moe.CallCells(("ptr_offs", "c_address", "tokens"))
    cells.write((64, 4096, 5))
    launch = moe.ChangingLaunch(host, {"num_groups": 8}, 7, cells).bind()
    launch()
    cells.write((128, 8192, -6))
    launch()
    assert seen == [(64, 8, 4096, 7), (128, 8, 8192, 7)] and host.binds == 2
    assert cells.values() == {"ptr_offs": 128, "c_address": 8192, "tokens": -6}


def test_a_plans_launches_read_the_calls_arguments_from_one_set_of_cells():
    """With moe.CallCells, each bound launch's address array points at the cells for the call's arguments: a
    call writes them once and every launch (two forms here, in other argument orders and widths) reads them, as
    the DSL's native host function does (the value at each address, 4 or 8 bytes), without binding again."""
    import ctypes
    from nvfp4_group_gemm import submission
    seen = []

    class Host:
        def __init__(self, names, widths):
            self.spec, self.binds = submission.ArgumentSpec(names, widths, (None,) * len(names)), 0

        def bind(self, values, stream):
            self.binds += 1
            storage, packed = submission.pack_host_arguments(self.spec.ordered(values), stream, ())
            addresses = (ctypes.c_uint64 * len(self.spec.names)).from_address(packed)

            def launch():  # what the native function reads: each argument at its address, then the stream
                seen.append(tuple(int.from_bytes(ctypes.string_at(at, width), "little", signed=True)
                                  for at, width in zip(addresses, self.spec.widths)))
            launch.storage, launch.packed = storage, packed
            return launch
    cells = moe.CallCells(("ptr_offs", "tokens", "c_address", "beta_bits"))
    hosts = [Host(("num_groups", "tokens", "ptr_offs", "c_address"), (4, 4, 8, 8)),
             Host(("c_address", "ptr_offs", "ctas", "beta_bits"), (8, 8, 4, 4))]
    cells.write((64, 5, 4096, -1082130432))  # beta_bits: fp32 -1.0's bits
    launches = [moe.ChangingLaunch(host, {"num_groups": 8, "ctas": 132}, 7, cells).bind() for host in hosts]
    for launch in launches:
        launch()
    assert seen == [(8, 5, 64, 4096), (4096, 64, 132, -1082130432)]
    seen.clear()
    cells.write((128, 6, 8192, 1065353216))
    for launch in launches:
        launch()
    assert seen == [(8, 6, 128, 8192), (8192, 128, 132, 1065353216)] and [h.binds for h in hosts] == [1, 1]
