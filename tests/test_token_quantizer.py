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
    (amax / 6, by the decode scale where there is one, and the 16 values by the block's scale); one E4M3
    rounding and its value back; the padding as 4-byte zero stores; the groups found by one warp's shuffles
    after which the CTA synchronizes once."""
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
        assert count(r"st\.global\.v2\.(?:u32|b32)") == 1 and count(r"st\.global\.(?:u8|b8)") == 1, name
        assert count(r"st\.global\.(?:u32|b32)\s") == 1, name  # a padding word
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
