"""The token quantizer's kernel (token_quantizer.py) compiled for sm_90a and sm_100a without a GPU, under each
DSL install: the instructions its design needs, no spill (where a ptxas is at hand). Its results are checked
on a GPU (tests/test_gpu.py: bit-equal to the torch composition)."""
import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from test_compile import DSL_INSTALLS, env_for

SCRIPT = """
import json, sys, warnings
warnings.filterwarnings("ignore")
from nvfp4_group_gemm import compile_gate, submission, token_quantizer as tq
out = {}
for fp16, kind, activation in ((False, tq.NO_SCALE, ""), (True, tq.PER_EXPERT, ""),
                               (False, tq.PER_EXPERT, "interleaved")):
    for paired in (False, True):
        config = tq.TokenQuantizerConfig(fp16=fp16, scale_kind=kind, activation=activation, limit=bool(activation),
                                         paired=paired)
        out[config.name] = compile_gate.ptx_text(tq.compiled(config, submission.target_arch())).replace("\\x00", "")
# the threshold table (one decode scale, and SwiGLU's halves with it); not yet timed, the lean loop (with the
# table, paired per expert, value by value)
for config in (tq.TokenQuantizerConfig(scale_kind=tq.ONE_SCALE, paired=True, threshold_table=True),
               tq.TokenQuantizerConfig(scale_kind=tq.ONE_SCALE, activation="halves", paired=True,
                                       threshold_table=True),
               tq.TokenQuantizerConfig(scale_kind=tq.ONE_SCALE, paired=True, threshold_table=True, lean_loop=True),
               tq.TokenQuantizerConfig(fp16=True, scale_kind=tq.PER_EXPERT, paired=True, lean_loop=True),
               tq.TokenQuantizerConfig(lean_loop=True)):
    out[config.name] = compile_gate.ptx_text(tq.compiled(config, submission.target_arch())).replace("\\x00", "")
print(json.dumps(out))
"""


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("install", DSL_INSTALLS)
def test_the_quantizer_compiles_to_its_designed_instructions(install, arch, tmp_path):
    """Per 16-value block: two 16-byte token loads, one 8-byte store of codes, one scale byte; IEEE divisions
    (amax / 6, by the decode scale where there is one); the codes by step thresholds (and by division for a
    scale that is not positive and finite); one E4M3 rounding and its value back; the padding as 4-byte zero
    stores; the groups found by one warp's shuffles after which the CTA synchronizes once."""
    pytest.importorskip("cutlass")
    env = dict(env_for(install), CUTE_DSL_ARCH=arch, CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    kernels = json.loads(done.stdout.strip().splitlines()[-1])
    names = {"quantize-tokens-bf16", "quantize-tokens-fp16-expert-scales",
             "quantize-tokens-bf16-expert-scales-swiglu-interleaved-limit"}
    assert set(kernels) == names | {name + "-paired" for name in names} | {
        "quantize-tokens-bf16-scale-paired-table", "quantize-tokens-bf16-scale-swiglu-halves-paired-table",
        "quantize-tokens-bf16-scale-paired-table-lean", "quantize-tokens-fp16-expert-scales-paired-lean",
        "quantize-tokens-bf16-lean"}
    from nvfp4_group_gemm import compile_gate, toolchain
    ptxas = toolchain.find_ptxas()
    for name, ptx in kernels.items():
        count = lambda pattern: len(re.findall(pattern, ptx))
        scaled, swiglu = "-scale" in name, "swiglu" in name
        if "-paired" in name:
            check_paired_ptx(name, ptx, count, scaled, swiglu)
        else:
            check_value_by_value_ptx(name, ptx, count, scaled, swiglu)
        if ptxas is not None:
            try:
                report = compile_gate.ptxas_report(ptx, arch, ptxas.path)
            except compile_gate.PtxasTooOld as error:
                pytest.skip(str(error))
            assert report["spill_store_bytes"] == report["spill_load_bytes"] == report["stack_bytes"] == 0, (
                name, report)


def check_value_by_value_ptx(name: str, ptx: str, count, scaled: bool, swiglu: bool) -> None:
    """The value-by-value configuration's PTX: each value's amax, thresholds and codes in fp32."""
    # SwiGLU: its gate and up (32 values, four loads), each pair's sigmoid by libdevice's expf and a
    # reciprocal, rounded to the tokens' type
    assert count(r"ld\.global\.v4\.(?:u32|b32)") == (4 if swiglu else 2), name
    assert count(r"ex2\.approx\.ftz\.f32") == count(r"rcp\.rn\.f32") == (16 if swiglu else 0), name
    assert count(r"cvt\.rn\.bf16\.f32") == (16 if swiglu else 0), name
    # the codes: one 8-byte store (two words, or one 64-bit value where a release merges them)
    assert count(r"st\.global\.(?:v2\.(?:u32|b32)|b64)") == 1 and count(r"st\.global\.(?:u8|b8)") == 1, name
    assert count(r"st\.global\.(?:u32|b32)\s") == 1, name  # a padding word
    # the 16 values' codes from the block's seven step thresholds (fp64 products rounded up or down to fp32),
    # three compares each; the division kept for a scale that is not positive and finite
    assert count(r"cvt\.rp\.f32\.f64") == 3 and count(r"cvt\.rm\.f32\.f64") == 4, name
    assert count(r"mul\.rn\.f64") == 7 and count(r"setp\.ge\.f32 [pqr], a, ") == 16 * 3, name
    assert count(r"div\.rn\.f32") == 1 + scaled + 16, name
    assert count(r"cvt\.rn\.satfinite\.e4m3x2\.f32") == 1 and count(r"cvt\.rn\.f16x2\.e4m3x2") == 1, name
    assert count(r"cvt\.f32\.f16") == (1 + 16 if "fp16" in name else 1), name
    assert count(r"bar\.sync") == 1 and count(r"shfl\.sync\.up") >= 5, name
    assert not re.search(r"div\.(?:approx|full)\.f32", ptx), name


def check_paired_ptx(name: str, ptx: str, count, scaled: bool, swiglu: bool) -> None:
    """A paired configuration's PTX (TokenQuantizerConfig.paired): the next block's loads issued before this
    one converts (two copies of the two 16-byte loads; SwiGLU's four as before, its values packed two to a word
    of the tokens' type); amax by seven packed maxes of the 8 words; the seven step thresholds rounded up to the
    tokens' type (fp16: cvt.rp); 8 words' codes, three packed compares and four lop3 selects each; the division
    kept for a scale that is not positive and finite, as in the configuration that goes value by value. With a
    threshold table the thresholds are computed once, each thread of the last four warps an entry (seven words
    stored), and a block reads its entry with two 16-byte shared loads."""
    fp16 = "fp16" in name
    table = "-table" in name
    assert count(r"ld\.shared\.v4\.(?:u32|b32)") == 2 * table, name
    assert count(r"st\.shared\.(?:u32|b32)\s") + 2 * count(r"st\.shared\.v2\.(?:u32|b32)") + 4 * count(
        r"st\.shared\.v4\.(?:u32|b32)") == 4 + 7 * table, name  # the groups' four words
    kind = "f16x2" if fp16 else "bf16x2"
    # SwiGLU: its gate and up (32 values, four loads), each pair's sigmoid by libdevice's expf and a
    # reciprocal, rounded to the tokens' type and packed two to a word
    assert count(r"ld\.global\.v4\.(?:u32|b32)") == 4, name
    assert count(r"ex2\.approx\.ftz\.f32") == count(r"rcp\.rn\.f32") == (16 if swiglu else 0), name
    assert count(r"cvt\.rn\.bf16\.f32") == count(r"cvt\.rn\.bf16x2\.f32") * 2 == (16 if swiglu else 0), name
    # the codes: one 8-byte store (two words, or one 64-bit value where a release merges them)
    assert count(r"st\.global\.(?:v2\.(?:u32|b32)|b64)") == 1 and count(r"st\.global\.(?:u8|b8)") == 1, name
    assert count(r"st\.global\.(?:u32|b32)\s") == 1, name  # a padding word
    # amax: seven packed maxes of 8 words; the seven step thresholds (fp64 products rounded up or down to
    # fp32, then up to the tokens' type); 8 words' codes, three packed compares each; the division kept for
    # a scale that is not positive and finite
    assert count(rf"max\.{kind}") == 7, name
    assert count(r"cvt\.rp\.f32\.f64") == 3 and count(r"cvt\.rm\.f32\.f64") == 4, name
    assert count(r"mul\.rn\.f64") == 7 and count(r"cvt\.rp\.f16\.f32") == (7 if fp16 else 0), name
    assert count(rf"set\.ge\.u32\.{kind}") == 8 * 3 and count(r"lop3\.b32") == 8 * 4, name
    assert count(r"div\.rn\.f32") == 1 + scaled + 16, name
    # the E4M3 value: the block's, and the table's where there is one
    assert count(r"cvt\.rn\.satfinite\.e4m3x2\.f32") == 1 and count(r"cvt\.rn\.f16x2\.e4m3x2") == 1 + table, name
    # the E4M3 values; with fp16 tokens the amax's two halves and the division's 16 values
    assert count(r"cvt\.f32\.f16") == (1 + 2 + 16 if fp16 else 1) + table, name
    assert count(r"bar\.sync") == 1 and count(r"shfl\.sync\.up") >= 5, name
    assert not re.search(r"div\.(?:approx|full)\.f32", ptx), name


def stand_in_device(monkeypatch, host_class) -> None:
    """quantize_tokens' host path on a CPU: `host_class` for submission.HostFunction (made with the compiled
    function, here the configuration itself), device 0 of 132 SMs, stream 7, no launches kept from before."""
    import contextlib

    import torch
    from nvfp4_group_gemm import moe, submission, token_quantizer as tq
    monkeypatch.setattr(tq, "_launches", {})
    monkeypatch.setattr(tq, "compiled", lambda config, arch: config)
    monkeypatch.setattr(submission, "HostFunction", host_class)
    monkeypatch.setattr(submission, "current_stream_handle", lambda index: 7)
    monkeypatch.setattr(submission, "sm_count", lambda index: 132)
    monkeypatch.setattr(submission, "target_arch", lambda: "sm_90a")
    monkeypatch.setattr(moe, "cuda_index", lambda tensor: 0)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())


def test_a_calls_arguments_reach_the_kernel_in_its_order_and_the_launch_is_bound_once(monkeypatch):
    """quantize_tokens' host path with the native host function stood in for (no GPU): the values the kernel
    reads (each argument at its address, as the native function does) are the call's, in the jit signature's
    order, SwiGLU's options as fp32 bits (negative ones too); a later call of the same kind on the same stream
    rewrites them without binding again; another kind gets its own launch."""
    import ctypes
    import struct

    import torch
    from nvfp4_group_gemm import submission, token_quantizer as tq
    seen, binds = [], []

    class Host:
        def __init__(self, compiled, spec, device_index):
            self.spec = spec

        def bind(self, values, stream):
            binds.append(1)
            storage, packed = submission.pack_host_arguments(self.spec.ordered(values), stream, ())
            addresses = (ctypes.c_uint64 * len(self.spec.names)).from_address(packed)

            def launch():
                seen.append({name: int.from_bytes(ctypes.string_at(at, width), "little", signed=True)
                             for name, at, width in zip(self.spec.names, addresses, self.spec.widths)})
            launch.storage, launch.packed = storage, packed
            return launch
    stand_in_device(monkeypatch, Host)
    bits = lambda value: struct.unpack("<i", struct.pack("<f", value))[0]
    offs = torch.tensor([3, 10], dtype=torch.int32)
    for call, tokens in enumerate((10, 12)):
        h = torch.zeros(tokens, 512, dtype=torch.bfloat16)
        packed, blocked = tq.quantize_tokens(h, offs, None, 256, swiglu=("interleaved", 1.702, -1.0, 7.0))
        assert seen[-1] == dict(ptr_x=h.data_ptr(), ptr_offs=offs.data_ptr(), ptr_packed=packed.data_ptr(),
                                ptr_scales=blocked.data_ptr(), ptr_global=0, tokens=tokens, k=256, experts=2,
                                rows=256, ctas=seen[-1]["ctas"], alpha_bits=bits(1.702), beta_bits=bits(-1.0),
                                limit_bits=bits(7.0))
        assert seen[-1]["ctas"] >= 1 and len(binds) == 1
    x = torch.zeros(12, 256, dtype=torch.float16)
    scale = torch.ones(2)
    packed, blocked = tq.quantize_tokens(x, offs, scale, 256)
    assert len(binds) == 2 and seen[-1]["ptr_global"] == scale.data_ptr() and seen[-1]["beta_bits"] == 0


def recording_launches(monkeypatch) -> tuple:
    """quantize_tokens on the CPU stand-in (`stand_in_device`), its host functions recorded: the configurations
    compiled and each launch's arguments, in order."""
    compiled, launched = [], []

    class Host:
        def __init__(self, config, spec, device_index):
            self.spec = spec
            compiled.append(config)

        def bind(self, values, stream):
            return lambda: launched.append(dict(values))
    stand_in_device(monkeypatch, Host)
    return compiled, launched


def test_a_paired_configuration_is_compiled_and_launched_on_its_own_grid(monkeypatch):
    """token_quantizer.PAIRED (the default) picks paired configurations (TokenQuantizerConfig.paired, a kernel
    of their own, "-paired" in the name), each launched on PAIRED_CTAS_PER_SM CTAs an SM at most,
    PAIRED_SWIGLU_CTAS_PER_SM with SwiGLU (as many as fit an SM: they hold more registers a thread than the
    value-by-value kernels); PAIRED False compiles the value-by-value configurations, on CTAS_PER_SM."""
    import torch
    from nvfp4_group_gemm import token_quantizer as tq
    compiled, launched = recording_launches(monkeypatch)
    assert tq.PAIRED  # the default: the same bytes, faster (docs/moe.md)
    monkeypatch.setattr(tq, "THRESHOLD_TABLE", False)  # its own test, below
    x = torch.empty(4096, 7168, dtype=torch.bfloat16)  # 1.8 M blocks: more than any grid's threads
    offs = torch.tensor([4096], dtype=torch.int32)
    swiglu = ("halves", 1.0, 0.0, None)
    for paired, options, per_sm in ((False, None, tq.CTAS_PER_SM), (True, None, tq.PAIRED_CTAS_PER_SM),
                                    (False, swiglu, tq.CTAS_PER_SM), (True, swiglu, tq.PAIRED_SWIGLU_CTAS_PER_SM)):
        monkeypatch.setattr(tq, "PAIRED", paired)
        tq.quantize_tokens(x, offs, None, 4096, swiglu=options)
        assert compiled[-1].paired == paired and compiled[-1].name.endswith("-paired") == paired
        assert launched[-1]["ctas"] == per_sm * 132
    assert len({tq.CTAS_PER_SM, tq.PAIRED_CTAS_PER_SM, tq.PAIRED_SWIGLU_CTAS_PER_SM}) == 3


def test_the_threshold_table_is_a_configuration_of_its_own_for_one_decode_scale_or_none(monkeypatch):
    """token_quantizer.THRESHOLD_TABLE (the default) makes the paired configurations of one decode scale or
    none read their thresholds from a table (a kernel of its own, "-table", on TABLE_CTAS_PER_SM CTAs an SM);
    per-expert scales keep the kernel they had, and a table is refused where a block's thresholds depend on more
    than its scale byte."""
    import torch
    from nvfp4_group_gemm import token_quantizer as tq
    compiled, launched = recording_launches(monkeypatch)
    assert tq.THRESHOLD_TABLE  # the default: the same bytes, faster (docs/moe.md)
    x = torch.empty(4096, 7168, dtype=torch.bfloat16)
    offs = torch.tensor([2048, 4096], dtype=torch.int32)
    for scale in (None, torch.ones(1)):
        tq.quantize_tokens(x, offs, scale, 4096)
        assert compiled[-1].threshold_table and compiled[-1].name.endswith("-paired-table"), compiled[-1].name
        assert launched[-1]["ctas"] == tq.TABLE_CTAS_PER_SM * 132
    tq.quantize_tokens(x, offs, torch.ones(2), 4096)  # per expert: the paired kernel as it was
    assert not compiled[-1].threshold_table and launched[-1]["ctas"] == tq.PAIRED_CTAS_PER_SM * 132
    monkeypatch.setattr(tq, "PAIRED", False)
    tq.quantize_tokens(x, offs, None, 4096)
    assert not compiled[-1].threshold_table and launched[-1]["ctas"] == tq.CTAS_PER_SM * 132
    for config in (dict(paired=False), dict(paired=True, scale_kind=tq.PER_EXPERT)):
        with pytest.raises(ValueError, match="threshold table is for paired configurations of one decode scale"):
            tq.TokenQuantizerConfig(threshold_table=True, **config)


def test_the_lean_loop_is_a_configuration_of_its_own_for_every_kind(monkeypatch):
    """token_quantizer.LEAN_LOOP (off until timed) makes every configuration quantize_tokens compiles keep its
    group in registers ("-lean" in the name): value by value, paired, with the threshold table, with SwiGLU; each
    on the grid it had but the table's of x's own blocks, on LEAN_TABLE_CTAS_PER_SM (its registers allow one CTA
    more)."""
    import torch
    from nvfp4_group_gemm import token_quantizer as tq
    compiled, launched = recording_launches(monkeypatch)
    assert not tq.LEAN_LOOP  # not yet timed: off
    x = torch.empty(4096, 7168, dtype=torch.bfloat16)
    offs = torch.tensor([2048, 4096], dtype=torch.int32)
    swiglu = ("halves", 1.0, 0.0, None)
    for paired, table in ((False, False), (True, False), (True, True)):
        for options in (None, swiglu):
            monkeypatch.setattr(tq, "PAIRED", paired)
            monkeypatch.setattr(tq, "THRESHOLD_TABLE", table)
            monkeypatch.setattr(tq, "LEAN_LOOP", False)
            rows = x if options is None else torch.empty(4096, 2 * 7168, dtype=torch.bfloat16)
            tq.quantize_tokens(rows, offs, None, 4096, swiglu=options)
            name, ctas = compiled[-1].name, launched[-1]["ctas"]
            monkeypatch.setattr(tq, "LEAN_LOOP", True)
            tq.quantize_tokens(rows, offs, None, 4096, swiglu=options)
            assert compiled[-1].lean_loop and compiled[-1].name == name + "-lean", (compiled[-1].name, name)
            more = table and options is None
            assert launched[-1]["ctas"] == (tq.LEAN_TABLE_CTAS_PER_SM * 132 if more else ctas)
    assert tq.LEAN_TABLE_CTAS_PER_SM == tq.TABLE_CTAS_PER_SM + 1


def test_the_configuration_label_names_the_settings(monkeypatch):
    """eval.py mlp prints which quantizer it timed: token_quantizer.configuration_label, from PAIRED,
    THRESHOLD_TABLE and LEAN_LOOP."""
    from nvfp4_group_gemm import token_quantizer as tq
    monkeypatch.setattr(tq, "THRESHOLD_TABLE", False)
    assert tq.configuration_label() == "paired"
    monkeypatch.setattr(tq, "THRESHOLD_TABLE", True)
    assert tq.configuration_label() == "paired, threshold table"
    monkeypatch.setattr(tq, "LEAN_LOOP", True)
    assert tq.configuration_label() == "paired, threshold table, lean loop"
    monkeypatch.setattr(tq, "PAIRED", False)
    assert tq.configuration_label() == "value by value, lean loop"


def fp32_thresholds(s):
    """token_quantizer.THRESHOLD_PTX emulated: for block scales s > 0, finite, each step's boundary x s (exact in
    fp64) rounded to fp32 up where a tie rounds up, else down and then to the next fp32 above: (n, 7), ascending."""
    import torch
    from nvfp4_group_gemm import moe, token_quantizer as tq
    boundaries = torch.tensor([tq.e2m1_boundary(t, up) for t, up in moe.E2M1_STEPS], dtype=torch.float64)
    up = torch.tensor([u for _, u in moe.E2M1_STEPS])
    exact = boundaries.view(1, -1) * s.double().view(-1, 1)  # (n, 7), exact in fp64
    nearest = exact.float()
    back = nearest.double()
    rounded_up = torch.where(back < exact, torch.nextafter(nearest, torch.tensor(float("inf"))), nearest)
    rounded_down = torch.where(back > exact, torch.nextafter(nearest, torch.tensor(float("-inf"))), nearest)
    above = (rounded_down.view(torch.int32) + 1).view(torch.float32)
    return torch.where(up, rounded_up, above)


def codes_by_search(x, u):
    """PAIR_CODE_PTX emulated (per value): how many of the thresholds u (n, 7) |x| reaches,
    by a three-level search, x's sign bit as bit 3 (a NaN reaches none)."""
    import torch
    a = x.abs()
    p = a >= u[:, 3]
    code = torch.where(p, 4, 0)
    q = a >= torch.where(p, u[:, 5], u[:, 1])
    code = code + torch.where(q, 2, 0)
    r = a >= torch.where(p, torch.where(q, u[:, 6], u[:, 4]), torch.where(q, u[:, 2], u[:, 0]))
    code = code + r.long()
    return (code | (torch.signbit(x).long() << 3)).to(torch.uint8)


def codes_by_division(x, s):
    """The recipe's codes: the steps fp32's x / s passes (moe.e2m1_codes, as torch divides); a NaN quotient gets
    the zero of x's sign, as the kernel gives it."""
    import torch
    from nvfp4_group_gemm import moe
    q = x.float() / s
    nan = (torch.signbit(x).long() << 3).to(torch.uint8)
    return torch.where(q.isnan(), nan, moe.e2m1_codes(q))


def block_scales(n: int, g, low: int = -140):
    """n positive finite fp32 block scales, from denormal (2^low) to 2^120, random significands."""
    import torch
    s = ((torch.rand(n, generator=g, dtype=torch.float64) + 0.5)
         * torch.exp2(torch.randint(low, 120, (n,), generator=g).double())).float()
    return s[(s > 0) & s.isfinite()]


def test_the_step_thresholds_give_the_codes_fp32s_division_gives():
    """The quantizer's codes without a division per value (token_quantizer.THRESHOLD_PTX and PAIR_CODE_PTX's
    search, emulated here in fp32): a value's code is how many of its block's seven step thresholds |x|
    reaches, its sign bit x's. Equal to counting the steps of fp32's x / s for values within a few ulps of every
    boundary at scales from denormal to 2^120, and for zeros and infinities; a NaN gets the zero of its sign."""
    import torch
    from nvfp4_group_gemm import moe, token_quantizer as tq
    boundaries = torch.tensor([tq.e2m1_boundary(t, up) for t, up in moe.E2M1_STEPS], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    s = block_scales(400_000, g)
    which = torch.randint(0, 7, (len(s),), generator=g)
    near = (boundaries[which] * s.double()).float().view(torch.int32)
    ulps = torch.randint(-3, 4, (len(s),), generator=g, dtype=torch.int32)
    x = (near + ulps).clamp(0, 0x7F7FFFFF).view(torch.float32)
    x = torch.where(torch.rand(len(s), generator=g) < 0.5, -x, x)
    assert torch.equal(codes_by_search(x, fp32_thresholds(s)), codes_by_division(x, s))
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan"), 1e-45, 3.4e38,
                             -3.4e38])
    for scale in (1.0, 2.0 ** -6, 448.0, 1e-38, 1e-45, 3e38):
        s = torch.full(specials.shape, scale)
        assert torch.equal(codes_by_search(specials, fp32_thresholds(s)), codes_by_division(specials, s)), scale


def type_ceiling(u, dtype):
    """token_quantizer.PAIRED_THRESHOLD_PTX emulated: the smallest value of `dtype` at or above each fp32
    threshold (positive): bf16 by adding 0xFFFF to the bits and keeping the upper half, fp16 as cvt.rp does
    (inf above its largest finite value)."""
    import torch
    if dtype == torch.bfloat16:
        return ((u.view(torch.int32) + 0xFFFF) & -65536).view(torch.float32).to(torch.bfloat16)
    nearest = u.half()
    below = nearest.float() < u
    return torch.where(below, (nearest.view(torch.int16) + 1).view(torch.float16), nearest)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_thresholds_in_the_tokens_type_give_the_same_codes(dtype):
    """The kernel compares tokens two at a time in their own type (PAIR_CODE_PTX: bf16x2 or f16x2 compares)
    against each fp32 threshold's ceiling in that type (PAIRED_THRESHOLD_PTX): for a value x of that type,
    x >= t exactly when x >= the ceiling. Emulated here: the codes equal fp32's division's for tokens within a
    few of the type's ulps of every boundary at every block scale the type's range meets, for the type's
    extremes (its largest finite value, its smallest subnormal, zeros, infinities) and a NaN gets the zero of
    its sign."""
    import torch
    from nvfp4_group_gemm import moe, token_quantizer as tq
    dtype = getattr(torch, dtype)
    bits = torch.int16
    boundaries = torch.tensor([tq.e2m1_boundary(t, up) for t, up in moe.E2M1_STEPS], dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    s = block_scales(400_000, g, low=-140 if dtype == torch.bfloat16 else -40)
    which = torch.randint(0, 7, (len(s),), generator=g)
    near = (boundaries[which] * s.double()).float().to(dtype)
    near = near[near.isfinite()]
    s, which = s[:len(near)], which[:len(near)]
    ulps = torch.randint(-3, 4, (len(near),), generator=g, dtype=bits)
    top = torch.tensor(float("inf"), dtype=dtype).view(bits) - 1
    x = (near.view(bits) + ulps).clamp(0, int(top)).view(dtype)
    x = torch.where(torch.rand(len(x), generator=g) < 0.5, -x, x)
    u = type_ceiling(fp32_thresholds(s), dtype)
    assert torch.equal(codes_by_search(x, u), codes_by_division(x, s))
    info = torch.finfo(dtype)
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), info.max, -info.max,
                             info.smallest_normal, 2.0 ** -133 if dtype == torch.bfloat16 else 2.0 ** -24, 1.0,
                             6.0]).to(dtype)
    for scale in (1.0, 2.0 ** -6, 448.0, 1e-38, 1e-45, 3e38, 65504.0 / 6, 2.0 ** -24, 5.96e-8):
        s = torch.full(specials.shape, scale)
        got = codes_by_search(specials, type_ceiling(fp32_thresholds(s), dtype))
        assert torch.equal(got, codes_by_division(specials, s)), scale
