"""The expert MLP (nvfp4_group_gemm/mlp.py) on the CPU: the device quantizer bit-equal to quantize_nvfp4 and
the blocked layout on awkward routings without reading offs on the host, SwiGLU's options against their
formulas, the MLP against a bf16 reference MLP and as the composition of its steps, under torch.compile."""
import pytest
import torch

from nvfp4_group_gemm import mlp, moe

ROUTINGS = {  # expert sizes: awkward routings the quantizer must place exactly
    "even": (16, 16, 16, 16),
    "empty experts": (0, 37, 0, 200, 0),
    "one expert holds every token": (0, 0, 261, 0),
    "no tokens": (0, 0, 0),
    "one token": (1,),
    "many experts": tuple(range(40)),
}


def expected_quantized(x, sizes, global_scale):
    """quantize_nvfp4 per group (its expert's decode scale) and the blocked layout, group g's block from row
    P_g, zero rows up to the worst case: what the device quantizer must write, byte for byte."""
    k = x.shape[1]
    rows = moe.worst_case_scale_rows(x.shape[0], len(sizes))
    packed, blocks, start = [], [], 0
    for g, m in enumerate(sizes):
        scale = None if global_scale is None else (global_scale if global_scale.numel() == 1 else global_scale[g])
        p, s = moe.quantize_nvfp4(x[start:start + m], scale)
        packed.append(p)
        if m:
            blocks.append(moe.to_blocked(s))
        start += m
    used = sum(b.shape[0] for b in blocks)
    tail = torch.zeros(rows - used, moe.scale_width(k), dtype=torch.float8_e4m3fn)
    return torch.cat(packed), torch.cat(blocks + [tail])


@pytest.fixture
def no_host_reads(monkeypatch):
    """Reading a tensor's values on the host (tolist, item, nonzero, bool) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a tensor's values were read on the host")
    for name in ("tolist", "item", "nonzero", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)


@pytest.mark.parametrize("scale", ["none", "one", "per expert"])
@pytest.mark.parametrize("routing", ROUTINGS, ids=list(ROUTINGS))
def test_the_device_quantizer_is_quantize_nvfp4_blocked_from_p_g(routing, scale, monkeypatch):
    sizes = ROUTINGS[routing]
    gen = torch.Generator().manual_seed(len(sizes))
    tokens, k = sum(sizes), 512
    x = (torch.randn(tokens, k, generator=gen) * 3).to(torch.bfloat16)
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)
    global_scale = {"none": None, "one": torch.tensor(0.25),
                    "per expert": torch.rand(len(sizes), generator=gen) + 0.1}[scale]
    want_packed, want_scale = expected_quantized(x, sizes, global_scale)
    with monkeypatch.context() as m:
        for name in ("tolist", "item", "nonzero"):
            m.setattr(torch.Tensor, name, lambda *a, **k: pytest.fail("a tensor's values were read on the host"))
        packed, a_scale = mlp.quantize_tokens_device(x, offs, global_scale)
    assert packed.dtype == torch.uint8 and a_scale.dtype == torch.float8_e4m3fn
    assert torch.equal(packed, want_packed)
    assert torch.equal(a_scale.view(torch.uint8), want_scale.view(torch.uint8))
    if global_scale is None or global_scale.numel() == 1:  # the host quantizer agrees where it takes the scale
        host_packed, host_scale = moe.quantize_tokens(x, offs, global_scale)
        assert torch.equal(packed, host_packed) and torch.equal(a_scale.view(torch.uint8), host_scale.view(torch.uint8))


def test_the_device_quantizer_leaves_rows_past_the_last_group_out_of_the_scales():
    x = torch.randn(50, 256).to(torch.bfloat16)
    offs = torch.tensor([10, 30], dtype=torch.int32)  # rows 30..49 belong to no group
    _, a_scale = mlp.quantize_tokens_device(x, offs)
    _, host = moe.quantize_tokens(x[:30], offs, rows=a_scale.shape[0])
    assert torch.equal(a_scale.view(torch.uint8), host.view(torch.uint8))


def test_the_device_quantizer_refuses_what_it_cannot_place():
    x, offs = torch.randn(300, 256), torch.tensor([100, 300], dtype=torch.int32)
    with pytest.raises(ValueError, match="rows=256: the scale buffer needs 512 rows"):
        mlp.quantize_tokens_device(x, offs, rows=256)
    with pytest.raises(ValueError, match="K=200"):
        mlp.quantize_tokens_device(torch.randn(4, 200), offs)
    with pytest.raises(ValueError, match=r"global_scale: shape \(3,\)"):
        mlp.quantize_tokens_device(x, offs, torch.ones(3))
    with pytest.raises(ValueError, match=r"x: torch.float32 of shape \(300,\): expected \(T, K\)"):
        mlp.quantize_tokens_device(x[:, 0], offs)
    with pytest.raises(ValueError, match="x: torch.int64"):
        mlp.quantize_tokens_device(torch.zeros(4, 256, dtype=torch.long), offs)
    with pytest.raises(ValueError, match="offs: on meta"):
        mlp.quantize_tokens_device(x, offs.to("meta"))
    with pytest.raises(ValueError, match="global_scale: on meta"):
        mlp.quantize_tokens_device(x, offs, torch.ones(2, device="meta"))


@pytest.mark.parametrize("layout", mlp.GATE_UP_LAYOUTS)
def test_swiglu_options_are_the_frameworks_formulas(layout):
    h = (torch.randn(33, 64) * 6).to(torch.bfloat16)
    values = h.float()
    gate, up = (values[:, :32], values[:, 32:]) if layout == "halves" else (values[:, 0::2], values[:, 1::2])
    plain = mlp.swiglu(h, layout)
    assert plain.dtype == torch.bfloat16
    assert torch.equal(plain, (torch.nn.functional.silu(gate) * up).to(torch.bfloat16))
    # gpt-oss: gate clamped above, up both sides, alpha in the sigmoid, 1 added to up
    g, u = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
    assert torch.equal(mlp.swiglu(h, layout, alpha=1.702, beta=1.0, limit=7.0),
                       (g * torch.sigmoid(1.702 * g) * (u + 1.0)).to(torch.bfloat16))
    assert not torch.equal(mlp.swiglu(h, layout, limit=7.0), plain)  # the clamp is applied, not dropped
    with pytest.raises(ValueError, match="layout='rows'"):
        mlp.swiglu(h, "rows")


def experts(e=4, hidden=256, inter=256, seed=0):
    """Quantized expert weights of a toy MLP: w13 (E, 2I, hidden) and w2 (E, hidden, I), with global scales,
    and their bf16 values."""
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(e, 2 * inter, hidden, generator=gen) / hidden ** 0.5
    w2 = torch.randn(e, hidden, inter, generator=gen) / inter ** 0.5
    w13_global, w2_global = torch.rand(e, generator=gen) * 0.01 + 0.002, torch.rand(e, generator=gen) * 0.01 + 0.002
    q13, s13 = moe.quantize_experts(w13, w13_global)
    q2, s2 = moe.quantize_experts(w2, w2_global)
    return dict(w13=q13, w13_scale=s13, w2=q2, w2_scale=s2, w13_global=w13_global, w2_global=w2_global)


def dequantized(weights, which):
    """(E, N, K) fp32 values of quantized experts (the reference MLP's weights)."""
    return moe.decode_experts(weights[which], weights[f"{which}_scale"]) * weights[f"{which}_global"].view(-1, 1, 1)


def test_the_mlp_is_its_steps_and_near_a_bf16_reference_mlp():
    sizes = (0, 70, 3, 183)
    weights = experts()
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(sum(sizes), 256, generator=gen).to(torch.bfloat16)
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)
    x_global, h_global = torch.tensor(0.01), torch.tensor(0.005)
    out = mlp.moe_mlp_nvfp4(x, offs, **weights, x_global=x_global, h_global=h_global)
    assert out.shape == (sum(sizes), 256) and out.dtype == torch.bfloat16
    # the composition of the public steps, the host quantizer in place of the device one
    a, a_scale = moe.quantize_tokens(x, offs, x_global)
    h = moe.grouped_mm_nvfp4(a, weights["w13"], a_scale, weights["w13_scale"], offs, a_global=x_global,
                             b_global=weights["w13_global"])
    a2, a2_scale = moe.quantize_tokens(mlp.swiglu(h), offs, h_global)
    steps = moe.grouped_mm_nvfp4(a2, weights["w2"], a2_scale, weights["w2_scale"], offs, a_global=h_global,
                                 b_global=weights["w2_global"])
    assert torch.equal(out, steps)
    # a bf16 MLP on the dequantized weights, activations unquantized: within what NVFP4's two roundings of the
    # activations cost (about 0.16 here; gate and up swapped, or a GEMM's scale lost, is off by far more)
    w13, w2 = dequantized(weights, "w13"), dequantized(weights, "w2")
    start, rows = 0, []
    for g, m in enumerate(sizes):
        hh = x[start:start + m].float() @ w13[g].t()
        rows.append(torch.nn.functional.silu(hh[:, :256]) * hh[:, 256:] @ w2[g].t())
        start += m
    want = torch.cat(rows)
    error = (out.float() - want).norm() / want.norm()
    print(f"relative error against the bf16 reference MLP: {error:.4f}")
    assert error < 0.25


def test_the_mlp_names_the_argument_whose_shape_does_not_chain():
    weights = experts(e=2)
    x, offs = torch.randn(8, 256).to(torch.bfloat16), torch.tensor([4, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="w13: shape"):
        mlp.moe_mlp_nvfp4(x, offs, **dict(weights, w13=weights["w13"][:, :, :64]))
    with pytest.raises(ValueError, match="w2: shape"):
        mlp.moe_mlp_nvfp4(x, offs, **dict(weights, w2=weights["w2"][:, :128]))
    with pytest.raises(ValueError, match="x: torch.float32"):
        mlp.moe_mlp_nvfp4(x.float(), offs, **weights)
    with pytest.raises(ValueError, match="layout='rows'"):
        mlp.moe_mlp_nvfp4(x, offs, **weights, layout="rows")


def test_torch_compile_traces_the_mlp_whole_graph():
    weights = experts(e=2)
    x = torch.randn(20, 256).to(torch.bfloat16)
    offs = torch.tensor([5, 20], dtype=torch.int32)

    def layer(x, offs):
        return mlp.moe_mlp_nvfp4(x, offs, **weights, alpha=1.702, beta=1.0, limit=7.0)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x, offs), layer(x, offs))


def test_the_docs_moe_layer_is_near_a_bf16_reference_layer():
    """docs/moe.md's whole MoE layer (router top-2, sort, the MLP, weighted combine) against the same layer in
    bf16 torch ops on the dequantized weights; the error printed."""
    import re
    from conftest import ROOT
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "moe.md").read_text(), re.S)
                if "def moe_layer" in b]
    namespace = {}
    exec(compile(block, "docs/moe.md", "exec"), namespace)
    gen = torch.Generator().manual_seed(3)
    e, hidden, inter, tokens = 4, 256, 256, 150
    w13 = (torch.randn(e, 2 * inter, hidden, generator=gen) / hidden ** 0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, hidden, inter, generator=gen) / inter ** 0.5).to(torch.bfloat16)
    router = torch.randn(e, hidden, generator=gen)
    x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16)
    experts = namespace["nvfp4_experts"](w13, w2)
    out = namespace["moe_layer"](x, router, experts)
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    # the reference: the same routing, each expert's bf16 MLP on its dequantized weights, token by token
    weights = {"w13": dequantized(experts, "w13"), "w2": dequantized(experts, "w2")}
    weight, expert = torch.softmax(x.float() @ router.t(), dim=1).topk(2, dim=1)
    weight = weight / weight.sum(1, keepdim=True)
    want = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for choice in range(2):
            g = int(expert[t, choice])
            h = x[t].float() @ weights["w13"][g].t()
            want[t] += weight[t, choice] * ((torch.nn.functional.silu(h[:inter]) * h[inter:]) @ weights["w2"][g].t())
    error = float((out.float() - want).norm() / want.norm())
    print(f"MoE layer, relative error against the bf16 reference layer: {error:.4f}")
    assert error < 0.25


def test_the_token_quantizer_is_a_torch_op_that_torch_compile_traces():
    """nvfp4_group_gemm::quantize_tokens (with a fake): torch.compile(fullgraph=True) traces
    quantize_tokens_device, equal to the eager call; under fake tensors it gives the shapes without data."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    x = torch.randn(100, 128, dtype=torch.bfloat16)
    offs = torch.tensor([30, 30, 100], dtype=torch.int32)
    scale = torch.tensor([0.5, 1.0, 2.0])
    eager = mlp.quantize_tokens_device(x, offs, scale)
    compiled = torch.compile(lambda *a: mlp.quantize_tokens_device(*a), fullgraph=True, backend="aot_eager")
    traced = compiled(x, offs, scale)
    assert all(torch.equal(t.view(torch.uint8), e.view(torch.uint8)) for t, e in zip(traced, eager))
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        packed, blocked = mlp.quantize_tokens_device(mode.from_tensor(x), mode.from_tensor(offs), None)
    assert packed.shape == (100, 64) and blocked.shape == (384, 8) and blocked.dtype == torch.float8_e4m3fn


def test_swiglu_quantized_is_the_two_steps_and_names_what_is_wrong():
    """mlp.swiglu_quantized (one kernel on a Hopper or B200 GPU) is quantize_tokens_device of swiglu, byte for
    byte, for both layouts with and without a limit; malformed h or layout are named."""
    gen = torch.Generator().manual_seed(3)
    h = (torch.randn(70, 256, generator=gen) * 3).to(torch.bfloat16)
    offs = torch.tensor([20, 20, 70], dtype=torch.int32)
    for layout, limit in (("halves", None), ("interleaved", 7.0)):
        got = mlp.swiglu_quantized(h, offs, torch.tensor(0.5), layout, 1.702, 1.0, limit)
        want = mlp.quantize_tokens_device(mlp.swiglu(h, layout, 1.702, 1.0, limit), offs, torch.tensor(0.5))
        assert all(torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in zip(got, want))
    with pytest.raises(ValueError, match=r"h: torch.bfloat16 of shape \(70, 255\)"):
        mlp.swiglu_quantized(h[:, :255], offs)
    with pytest.raises(ValueError, match="layout='rows'"):
        mlp.swiglu_quantized(h, offs, layout="rows")


def test_eval_mlps_gemms_alone_are_the_mlps_gemms_on_its_routing():
    """`eval.py mlp`'s GEMMs timed alone (`mlp_report.gemm_pairs`): gate_up is the op on x quantized (near x
    times the dequantized w13), down the op on SwiGLU of a (T, 2I) quantized, each (T, N) of the MLP's shapes;
    without a GPU no bf16 side."""
    from nvfp4_group_gemm import mlp_report
    e, hidden, inter = 4, 512, 256
    experts = mlp_report.make_experts(e, hidden, inter, torch.device("cpu"))
    x, offs = mlp_report.top2_routing(64, e, hidden, torch.device("cpu"), seed=3)
    x_global, h_global = mlp_report.activation_scales(x, offs, experts)
    pairs = mlp_report.gemm_pairs(x, offs, experts, x_global, h_global)
    assert [(name, shape) for name, shape, _, _ in pairs] == [("gate_up", (2 * inter, hidden)),
                                                              ("down", (hidden, inter))]
    assert all(bf16 is None for _, _, _, bf16 in pairs)
    gate_up, down = (op() for _, _, op, _ in pairs)
    assert gate_up.shape == (64, 2 * inter) and down.shape == (64, hidden)
    want = mlp_report.per_group(x, experts.w13_bf16, offs)
    assert float((gate_up.float() - want).norm() / want.norm()) < 0.25
    assert bool(torch.isfinite(down.float()).all())
