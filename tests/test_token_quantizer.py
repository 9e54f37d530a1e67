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
    config = tq.TokenQuantizerConfig(fp16=fp16, scale_kind=kind, activation=activation, limit=bool(activation))
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
    assert set(kernels) == {"quantize-tokens-bf16", "quantize-tokens-fp16-expert-scales",
                            "quantize-tokens-bf16-expert-scales-swiglu-interleaved-limit"}
    from nvfp4_group_gemm import compile_gate, toolchain
    ptxas = toolchain.find_ptxas()
    for name, ptx in kernels.items():
        count = lambda pattern: len(re.findall(pattern, ptx))
        scaled, swiglu = "scales" in name, "swiglu" in name
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
        if ptxas is not None:
            try:
                report = compile_gate.ptxas_report(ptx, arch, ptxas.path)
            except compile_gate.PtxasTooOld as error:
                pytest.skip(str(error))
            assert report["spill_store_bytes"] == report["spill_load_bytes"] == report["stack_bytes"] == 0, (
                name, report)


def test_a_calls_arguments_reach_the_kernel_in_its_order_and_the_launch_is_bound_once(monkeypatch):
    """quantize_tokens' host path with the native host function stood in for (no GPU): the values the kernel
    reads (each argument at its address, as the native function does) are the call's, in the jit signature's
    order, SwiGLU's options as fp32 bits (negative ones too); a later call of the same kind on the same stream
    rewrites them without binding again; another kind gets its own launch."""
    import contextlib
    import ctypes
    import struct

    import torch
    from nvfp4_group_gemm import moe, submission, token_quantizer as tq
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
    monkeypatch.setattr(tq, "_launches", {})
    monkeypatch.setattr(tq, "compiled", lambda config, arch: config)
    monkeypatch.setattr(submission, "HostFunction", Host)
    monkeypatch.setattr(submission, "current_stream_handle", lambda index: 7)
    monkeypatch.setattr(submission, "sm_count", lambda index: 132)
    monkeypatch.setattr(submission, "target_arch", lambda: "sm_90a")
    monkeypatch.setattr(moe, "cuda_index", lambda tensor: 0)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
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


def test_the_step_thresholds_give_the_codes_fp32s_division_gives():
    """The quantizer's codes without a division per value (token_quantizer.THRESHOLD_PTX and THRESHOLD_CODE_PTX,
    emulated here): for a block scale s > 0, finite, each step's boundary x s (exact in fp64) rounded to fp32 up
    where a tie rounds up, else down and then to the next fp32 above; a value's code how many of these |x|
    reaches (a three-level search), its sign bit x's. Equal to counting the steps of fp32's x / s
    (moe.e2m1_codes, as torch divides) for values within a few ulps of every boundary at scales from denormal
    to 2^120, and for zeros and infinities; a NaN gets the zero of its sign."""
    import torch
    from nvfp4_group_gemm import moe, token_quantizer as tq
    boundaries = torch.tensor([tq.e2m1_boundary(t, up) for t, up in moe.E2M1_STEPS], dtype=torch.float64)
    up = torch.tensor([u for _, u in moe.E2M1_STEPS])

    def by_thresholds(x, s):
        exact = boundaries.view(1, -1) * s.double().view(-1, 1)  # (n, 7), exact in fp64
        nearest = exact.float()
        back = nearest.double()
        rounded_up = torch.where(back < exact, torch.nextafter(nearest, torch.tensor(float("inf"))), nearest)
        rounded_down = torch.where(back > exact, torch.nextafter(nearest, torch.tensor(float("-inf"))), nearest)
        above = (rounded_down.view(torch.int32) + 1).view(torch.float32)
        u = torch.where(up, rounded_up, above)  # (n, 7), ascending
        a = x.abs()
        p = a >= u[:, 3]
        code = torch.where(p, 4, 0)
        q = a >= torch.where(p, u[:, 5], u[:, 1])
        code = code + torch.where(q, 2, 0)
        r = a >= torch.where(p, torch.where(q, u[:, 6], u[:, 4]), torch.where(q, u[:, 2], u[:, 0]))
        code = code + r.long()
        return (code | (torch.signbit(x).long() << 3)).to(torch.uint8)

    def by_division(x, s):
        q = x / s
        nan = (torch.signbit(x).long() << 3).to(torch.uint8)
        return torch.where(q.isnan(), nan, moe.e2m1_codes(q))
    g = torch.Generator().manual_seed(0)
    n = 400_000
    s = ((torch.rand(n, generator=g, dtype=torch.float64) + 0.5)
         * torch.exp2(torch.randint(-140, 120, (n,), generator=g).double())).float()
    s = s[(s > 0) & s.isfinite()]
    which = torch.randint(0, 7, (len(s),), generator=g)
    near = (boundaries[which] * s.double()).float().view(torch.int32)
    ulps = torch.randint(-3, 4, (len(s),), generator=g, dtype=torch.int32)
    x = (near + ulps).clamp(0, 0x7F7FFFFF).view(torch.float32)
    x = torch.where(torch.rand(len(s), generator=g) < 0.5, -x, x)
    assert torch.equal(by_thresholds(x, s), by_division(x, s))
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan"), 1e-45, 3.4e38,
                             -3.4e38])
    for scale in (1.0, 2.0 ** -6, 448.0, 1e-38, 1e-45, 3e38):
        s = torch.full(specials.shape, scale)
        assert torch.equal(by_thresholds(specials, s), by_division(specials, s)), scale
