"""The B200 kernel compiles for sm_100a on a machine without a GPU, and its PTX
has what the design says.

Each kernel is compiled in a fresh interpreter (`eval.py compile`), because CuTe
DSL takes its target from CUTE_DSL_ARCH. Set NVFP4_EXTRA_CUTLASS_DSL to a folder
holding another nvidia-cutlass-dsl release (`pip install --target`; `.ci/run`
does this for 4.5.2) to compile under that release too."""
import collections
import dataclasses
import inspect
import json
import math
import os
import re
import subprocess
import sys

import pytest

from nvfp4_group_gemm import moe_tables, submission
from conftest import BENCHMARK_CASES, ROOT, TEST_CASES

from nvfp4_group_gemm import compile_gate
from nvfp4_group_gemm import model_report

EXTRA_DSL = os.environ.get("NVFP4_EXTRA_CUTLASS_DSL")
DSL_INSTALLS = ["installed"] + (["extra"] if EXTRA_DSL else [])


def env_for(install: str) -> dict:
    env = dict(os.environ, CUTE_DSL_ARCH="sm_100a")
    if install == "extra":
        # Newer wheels keep the packages in dsl_packages, older in python_packages.
        paths = [os.path.join(EXTRA_DSL, "nvidia_cutlass_dsl", sub)
                 for sub in ("python_packages", "dsl_packages")] + [EXTRA_DSL]
        env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return env


_reports = {}


def compile_report(install: str, tmp_path_factory) -> dict:
    """`eval.py compile --json` under one DSL install, run once per session."""
    if install not in _reports:
        out = tmp_path_factory.mktemp(f"compile-{install}")
        done = subprocess.run(
            [sys.executable, "-W", "ignore", "eval.py", "compile", "--json", str(out / "r.json"),
             "--keep", str(out / "ptx")],
            cwd=ROOT, env=env_for(install), capture_output=True, text=True, timeout=1800)
        report = json.loads((out / "r.json").read_text()) if (out / "r.json").exists() else None
        _reports[install] = (done, report)
    return _reports[install]


@pytest.fixture(params=DSL_INSTALLS)
def report(request, tmp_path_factory):
    done, report = compile_report(request.param, tmp_path_factory)
    assert not list(ROOT.glob("*.ptx")) and not list(ROOT.glob("*.cubin"))  # nothing left behind
    kernels = report["kernels"] if report else []
    if kernels and all("PtxasTooOld" in k.get("error", "") for k in kernels):
        pytest.skip(f"the PTX is newer than this machine's ptxas: {kernels[0]['error']}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    if request.param == "extra":
        print("extra nvidia-cutlass-dsl:", kernels[0]["cutlass_dsl"])
    return report


def test_every_configuration_compiles_without_spills(report):
    kernels = {k["config"]: k for k in report["kernels"]}
    # every kernel CONFIG_POLICY may name: each tile configuration (the model's), round-robin and contiguous;
    # and the MoE op's form, with its builder from offs
    moe_forms = [moe_tables.MOE_CONFIG, dataclasses.replace(moe_tables.MOE_CONFIG, bf16_output=True)]
    assert set(kernels) == {compile_gate.kernel_name(c) for c in submission.policy_candidates() + moe_forms}
    assert {name.split("/")[0] for name in kernels} == set(submission.TILE_CONFIGS) | {c.tile_name for c in moe_forms}
    for k in kernels.values():
        assert k["ok"], k
        assert k["spill_store_bytes"] == 0 and k["spill_load_bytes"] == 0 and k["stack_bytes"] == 0
        assert k.get("offsets_builder_spill_bytes", 0) == 0
        assert 0 < k["registers"] <= 255
        assert 0 < k["dynamic_smem_bytes"] <= submission.SMEM_CAPACITY
    moe = kernels[compile_gate.kernel_name(moe_tables.MOE_CONFIG)]
    assert moe["offsets_builder_spill_bytes"] == 0 and 0 < moe["offsets_builder_registers"] <= 255


def test_launches_can_skip_the_dsls_argument_conversion(report):
    # submission.HostFunction packs the host function's arguments itself where
    # this holds; elsewhere every plan pays the DSL's conversion once per stream.
    for k in report["kernels"]:
        assert k["direct_host_arguments"] is True, (k["config"], k["cutlass_dsl"])
        assert k.get("direct_offsets_builder_arguments", True) is True, (k["config"], k["cutlass_dsl"])


def test_every_task_shape_and_a_contract_spread_is_served(report):
    plans = report["shape_sets"]
    expected = [[[m, n, k, 1] for m, n, k in zip(c.args["m"], c.args["n"], c.args["k"])]
                for c in TEST_CASES + BENCHMARK_CASES]
    assert [p["problem_sizes"] for p in plans[:14]] == expected  # all 14 task shapes, in order
    spread = plans[14:]
    assert len(spread) >= 20
    groups = [p["groups"] for p in spread]
    ms = [s[0] for p in spread for s in p["problem_sizes"]]
    assert min(groups) == 1 and max(groups) == 64 and min(ms) == 1 and max(ms) == 1024
    for p in spread:
        for m, n, k, l in p["problem_sizes"]:
            assert n % 128 == 0 and n <= 8192 and k % 256 == 0 and k <= 8192 and l == 1
    compiled = {k["config"] for k in report["kernels"] if k["ok"]}
    assert {p["kernel"] for p in plans} <= compiled
    assert {p["config"].split("/")[0] for p in plans} == set(submission.TILE_CONFIGS)  # both are used


def ptx_of(report, config):
    kernel = next(k for k in report["kernels"] if k["config"] == config)
    with open(kernel["ptx_file"]) as f:
        return kernel, f.read()


@pytest.mark.parametrize("config", list(submission.TILE_CONFIGS))
def test_ptx_has_the_designed_instructions(report, config):
    kernel, ptx = ptx_of(report, config)
    # block-scaled FP4 MMA, 4 per K stage (one per 64-wide K block); 16-element scale
    # blocks are spelled block16 (newer DSL releases) or scale_vec::4X (older)
    mma = re.findall(r"tcgen05\.mma\.cta_group::1\.kind::mxf4nvf4\.block_scale\.(?:block16|scale_vec::4X)", ptx)
    assert len(mma) == submission.MMA_K_BLOCKS_PER_STAGE
    # TMA tensor loads for A', B', SFA', SFB' and a TMA store for D'
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::(?:cta|cluster)\.global\.tile\.mbarrier", ptx)) >= 4
    assert re.search(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta", ptx)
    # descriptors are never rewritten in the GEMM: each of the five is acquired and prefetched,
    # in three places (the CTA's first group before the wait when the plan is ready, again after
    # it, the next tile's group a tile ahead): the producer's four and the epilogue's one early
    features = kernel["ptx_features"]
    assert features["tensormap_replace"] == features["tensormap_release"] == 0
    assert features["tensormap_acquire"] == features["tensormap_prefetch"] == 3 * submission.TENSORMAPS_PER_GROUP
    assert features["acquires_before_waits"] == [4, 1]
    # programmatic dependent launch: the producer and the epilogue wait, the producer releases the next kernel
    assert features["pdl_wait"] == 2 and features["pdl_launch_dependents"] == 1
    # the builder: every descriptor replaced in shared memory and copied out with a release fence,
    # only after the previous kernel has finished
    built = kernel["builder_ptx_features"]
    assert built["tensormap_replace"] > 0 and built["tensormap_release"] == submission.TENSORMAPS_PER_GROUP
    assert built["pdl_wait"] == built["pdl_launch_dependents"] == 1 and built["tma_load"] == 0
    assert kernel["builder_spill_bytes"] == 0
    # C staged in shared memory is fenced before the TMA store reads it
    assert "fence.proxy.async.shared::cta" in ptx
    # scale factors copied shared -> tensor memory; accumulator read back from TMEM
    assert "tcgen05.cp.cta_group::1" in ptx and "tcgen05.ld.sync" in ptx
    # the warp roles: 4 epilogue + MMA + TMA warps
    assert re.search(r"\.reqntid (\d+), 1, 1", ptx)[1] == str(submission.SM100_ROLES.threads) == "192"
    assert kernel["ptx_features"]["threads_per_cta"] == 192


def test_accumulator_is_double_buffered_where_it_fits(report):
    for name, config in submission.TILE_CONFIGS.items():
        kernel, ptx = ptx_of(report, name)
        expected_acc = submission.acc_stages(config)
        assert kernel["stages_acc"] == expected_acc
        # one full and one empty barrier per A/B stage and per accumulator buffer
        inits = len(re.findall(r"mbarrier\.init\.shared", ptx))
        assert inits == 2 * (kernel["stages_ab"] + kernel["stages_acc"]), (name, inits)
    assert submission.acc_stages(submission.TILE_CONFIGS["128x128"]) == 2


def test_the_cost_model_counts_the_stages_the_kernel_has(report):
    for name, config in submission.TILE_CONFIGS.items():
        kernel = next(k for k in report["kernels"] if k["config"] == name)
        assert submission._compute_stages_for_model(config) == kernel["stages_ab"]
        assert kernel["stages_ab"] >= 3


@pytest.mark.slow
def test_other_shape_sets_trigger_no_compile():
    code = """
import inspect
import json
from nvfp4_group_gemm import submission
from cutlass import cute
calls = []
real_compile = cute.compile
def counting_compile(*args, **kwargs):
    calls.append(1)
    return real_compile(*args, **kwargs)
cute.compile = counting_compile
first = [(96, 128, 256, 1), (128, 256, 512, 1)]
second = [(256, 512, 256, 1), (72, 384, 256, 1)]
third = [(40, 7168, 2048, 1)] * 8
config = submission.TILE_CONFIGS["128x128"]
c1 = submission.compile_grouped_gemm(config)
plans = []
for sizes in (first, second, third):
    c = submission.compile_grouped_gemm(config)
    shape = submission.shape_plan(tuple(sizes), 0, 148, config)
    plans.append([c is c1, [shape.tiles, shape.ctas]])
print(json.dumps({"compiles": len(calls), "plans": plans, "cached": len(submission._compiled)}))
"""
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT,
                          env=env_for("installed"), capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # one configuration: its GEMM and its descriptor builder, two host functions
    assert result["compiles"] == 2 and result["cached"] == 1
    assert [same for same, _ in result["plans"]] == [True, True, True]
    # the plans differ: the sizes are run-time arguments of the one kernel
    assert [plan for _, plan in result["plans"]] == [[3, 3], [11, 11], [8 * 56, 148]]


@pytest.mark.slow
@pytest.mark.parametrize("install", DSL_INSTALLS)
@pytest.mark.parametrize("name,arch", [("128x128/contiguous", "sm_100a"),
                                       ("sm90-128x128-k128-wr-n16-64/contiguous", "sm_90a")])
def test_the_contiguous_schedule_compiles_without_spills(install, name, arch):
    """The one compiled schedule choice (`submission.Schedule.contiguous`): CTA c takes tiles c T / C ..
    (c + 1) T / C - 1, so the scheduler divides by the grid size, which round-robin never does."""
    def compile_one(config_name):
        done = subprocess.run([sys.executable, "-W", "ignore", "eval.py", "compile-one", config_name, "--arch", arch],
                              cwd=ROOT, env=dict(env_for(install), CUTE_DSL_ARCH=arch), capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])
    contiguous, round_robin = compile_one(name), compile_one(name.split("/")[0])
    if "PtxasTooOld" in contiguous.get("error", ""):
        pytest.skip(contiguous["error"])
    assert contiguous["ok"] and round_robin["ok"], contiguous.get("error")
    assert contiguous["spill_store_bytes"] == contiguous["spill_load_bytes"] == contiguous["stack_bytes"] == 0
    assert contiguous["ptx_features"]["integer_divisions"] > round_robin["ptx_features"]["integer_divisions"]


def test_the_configuration_policy_names_one_candidate_or_the_model(monkeypatch):
    sizes = [(128, 4096, 1536, 1), (384, 4096, 1536, 1)]
    assert submission.CONFIG_POLICY == "model"  # the artifact ships with the model's choice
    assert len(submission.policy_candidates()) == len(submission.SCHEDULES) * len(submission.TILE_CONFIGS)
    for candidate in submission.policy_candidates():
        monkeypatch.setattr(submission, "CONFIG_POLICY", candidate.name)
        assert submission.choose_config(sizes) == candidate
    monkeypatch.setattr(submission, "CONFIG_POLICY", "256x256")
    with pytest.raises(ValueError, match="CONFIG_POLICY .or \"model\". '256x256': expected one of 128x128, "):
        submission.choose_config(sizes)


def test_the_kernel_refuses_the_public_pair_designs_the_model_prices():
    """The public 2-CTA designs (model_report.public_designs) are configurations the cost model prices for its
    fit, each CTA holding half a tile's rows; the kernel takes one CTA per MMA, so it refuses them, and the model
    never offers one."""
    pairs = [c for design in model_report.public_designs().values() for c, _, _ in design if c.cta_group == 2]
    assert pairs and all(c.cta_group == 1 for c in submission.policy_candidates())
    for config in pairs:
        assert submission.stage_bytes(config) < submission.stage_bytes(
            submission.TileConfig(config.tile_m, config.tile_n))  # each CTA holds half the rows
    for bad in (*pairs, submission.TileConfig(256, 128), submission.TileConfig(128, 128, cta_group=2)):
        with pytest.raises(ValueError, match="an MMA is one CTA's 128 rows of M'"):
            bad.make_kernel()


@pytest.mark.slow
@pytest.mark.parametrize("name,arch", [("128x128", "sm_100a"), ("sm90-128x128-k128-wr-n16-64", "sm_90a")])
def test_compiling_raises_no_deprecation_warning_from_our_code(name, arch):
    """What we call of the DSL is not deprecated (a deprecation is the next release's breakage): a compile with
    every DeprecationWarning as an error still makes PTX. Every one: the DSL's deprecated wrappers warn from its
    own modules, not from the caller's line, so a filter on our module names would miss them."""
    code = ("import json, sys, warnings\n"
            "warnings.filterwarnings('error', category=DeprecationWarning)\n"
            "from nvfp4_group_gemm import compile_gate\n"
            "print(json.dumps(compile_gate.compile_one(sys.argv[1], sys.argv[2], None)))\n")
    done = subprocess.run([sys.executable, "-c", code, name, arch], cwd=ROOT, env=env_for("installed"),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert "Deprecation" not in json.dumps(row), row
    assert "stopped" not in row and row.get("ptx_features"), row
    # ptxas's verdict is the compile gate's business; a machine whose only ptxas is too old still checks the above
    assert row["ok"] or "PtxasTooOld" in row.get("error", ""), row


# ---- the B200 kernel's PTX against NVIDIA's example -------------------------------------------------------
# Reviewed facts: an independent line-by-line review (nvidia-cutlass-dsl 4.8.1) compiled NVIDIA's CuTe DSL
# grouped block-scaled GEMM example at the same tiles and found these equal in both PTX files (128x128;
# swap-128x256 as NVIDIA's 128x256 with column-major C). None: not compared by the review. A DSL release or a
# change here that moves one fails below, naming the configuration and the field.
REVIEWED_PTX_FACTS = {
    "128x128": dict(instruction_descriptor=0x08200480, expect_tx_bytes=36864, scale_copies_per_stage=8,
                    tmem_load="32x32b.x32"),
    "swap-128x256": dict(instruction_descriptor=0x08400480, expect_tx_bytes=55296, scale_copies_per_stage=None,
                         tmem_load=None),
}


def expected_forms() -> dict:
    """The review's instruction forms (its "also equal" list)."""
    return {
        "mma": {"tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.block16"},
        "commit": {"tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64"},
        "commit_masks": set(),
        "tmem_alloc": {"tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32",
                       "tcgen05.dealloc.cta_group::1.sync.aligned.b32",
                       "tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned"},
        # (dimensions, form) -> share of the loads: A' and B' 2-d, SFA' and SFB' 3-d
        "tma_loads": {(2, "shared::cta.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"): 1,
                      (3, "shared::cta.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"): 1},
        # A/B stages 1; accumulator 1 and 4 (the epilogue's warps)
        "mbarrier_init_counts": {1, 4},
    }


def immediates(ptx: str, width: str = "32") -> dict:
    """register -> the immediates `mov.b{width}` puts in it."""
    found = {}
    for reg, value in re.findall(rf"mov\.[bu]{width}\s+(%\w+),\s*(-?\d+);", ptx):
        found.setdefault(reg, set()).add(int(value))
    return found


def operand_values(ptx: str, operands: list, width: str = "32") -> set:
    movs, values = immediates(ptx, width), set()
    for operand in operands:
        values |= movs.get(operand, {"(computed)"}) if operand.startswith("%") else {int(operand)}
    return values


def observed_ptx_facts(ptx: str) -> dict:
    """The reviewed fields as this PTX has them. Older DSL releases spell two forms differently (block16 is
    scale_vec::4X; a CTA's own shared memory, shared::cluster) and unroll the producer's loop: forms are
    normalized, and the loads counted as shares."""
    ptx = ptx.replace("block_scale.scale_vec::4X", "block_scale.block16")
    loads = re.findall(r"cp\.async\.bulk\.tensor\.(\d)d\.(shared::\w+\.global\S*?);?\s", ptx)
    loads = [(int(d), form.replace("shared::cluster", "shared::cta")) for d, form in loads]
    counts = {key: loads.count(key) for key in set(loads)}
    unit = math.gcd(*counts.values()) if counts else 1
    return {
        "instruction_descriptors": {int(v) for pair in re.findall(r"selp\.b32\s+%r\d+,\s*(\d+),\s*(\d+),", ptx)
                                    for v in pair},
        "expect_tx_bytes": operand_values(ptx, re.findall(r"mbarrier\.arrive\.expect_tx\S*\s+\S+,\s*\[[^\]]+\],\s*"
                                                          r"(%r\d+|\d+);", ptx)),
        "scale_copies": re.findall(r"(tcgen05\.cp\.\S+)\s", ptx),
        "mma": set(re.findall(r"(tcgen05\.mma\.cta_group::\d\.kind::[\w:.]+?)(?:\.collector::\S+)?\s", ptx)),
        "commit": set(re.findall(r"(tcgen05\.commit\.\S+)\s", ptx)),
        "commit_masks": operand_values(ptx, re.findall(r"tcgen05\.commit\.\S+\s+\[[^\]]+\],\s*(%rs\d+|\d+);", ptx),
                                       "16") - {"(computed)"},
        "tmem_alloc": set(re.findall(r"(tcgen05\.(?:alloc|dealloc|relinquish_alloc_permit)\.[\w:.]+?)\s*[;\s]", ptx)),
        "tmem_loads": set(re.findall(r"tcgen05\.ld\.sync\.aligned\.(\w+\.x\d+)\.b32", ptx)),
        "tma_loads": {key: n // unit for key, n in counts.items()},
        "mbarrier_init_counts": operand_values(ptx, re.findall(r"mbarrier\.init\.shared\.b64\s+\[[^\]]+\],\s*"
                                                               r"(%r\d+|\d+);", ptx)),
    }


def differences(config: str, observed: dict) -> list:
    facts = REVIEWED_PTX_FACTS[config.split("/")[0]]
    wrong = []

    def check(field, ok, got, want):
        if not ok:
            wrong.append(f"{config}: {field}: the PTX has {got}, the reviewed value is {want}")
    check("instruction_descriptor", facts["instruction_descriptor"] in observed["instruction_descriptors"],
          sorted(hex(v) for v in observed["instruction_descriptors"]), hex(facts["instruction_descriptor"]))
    check("expect_tx_bytes", observed["expect_tx_bytes"] == {facts["expect_tx_bytes"]},
          observed["expect_tx_bytes"], facts["expect_tx_bytes"])
    copies = observed["scale_copies"]
    check("scale_copy_form", set(copies) == {"tcgen05.cp.cta_group::1.32x128b.warpx4"}, set(copies),
          "tcgen05.cp.cta_group::1.32x128b.warpx4")
    if facts["scale_copies_per_stage"] is not None:
        check("scale_copies_per_stage", len(copies) == facts["scale_copies_per_stage"], len(copies),
              facts["scale_copies_per_stage"])
    if facts["tmem_load"] is not None:
        check("tmem_load", observed["tmem_loads"] == {facts["tmem_load"]}, observed["tmem_loads"], facts["tmem_load"])
    for field, want in expected_forms().items():
        check(field, observed[field] == want, observed[field], want)
    return wrong


@pytest.mark.parametrize("config", sorted(REVIEWED_PTX_FACTS))
def test_the_ptx_keeps_the_facts_the_review_found_equal_to_nvidias_example(report, config):
    assert set(REVIEWED_PTX_FACTS) == set(submission.TILE_CONFIGS)
    for name in (config, f"{config}/contiguous"):
        _, ptx = ptx_of(report, name)
        wrong = differences(name, observed_ptx_facts(ptx))
        assert not wrong, "\n".join(wrong)


def test_a_changed_fact_is_named_with_its_configuration_and_field():
    observed = {"instruction_descriptors": {0x08200480}, "expect_tx_bytes": {36864},
                "scale_copies": ["tcgen05.cp.cta_group::1.32x128b.warpx4"] * 8, "tmem_loads": {"32x32b.x32"},
                **expected_forms()}
    assert differences("128x128", observed) == []
    moved = dict(observed, expect_tx_bytes={32768}, commit={"tcgen05.commit.cta_group::2.x"})
    assert differences("128x128/contiguous", moved) == [
        "128x128/contiguous: expect_tx_bytes: the PTX has {32768}, the reviewed value is 36864",
        "128x128/contiguous: commit: the PTX has {'tcgen05.commit.cta_group::2.x'}, the reviewed value is "
        "{'tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64'}"]


def test_no_two_gemm_ctas_share_an_sm_while_tmem_is_taken_before_the_wait(report):
    """Every B200 configuration's shared memory keeps a second CTA off its SM (check_sm_exclusive, at trace
    time): a dependent launch's CTA cannot block in tcgen05.alloc beside the one it waits for."""
    for kernel in report["kernels"]:
        assert submission.ctas_per_sm_by_smem(kernel["dynamic_smem_bytes"]) == 1, kernel["config"]


def test_a_configuration_that_two_ctas_could_share_an_sm_with_is_refused():
    room_for_two = submission.SM_SHARED_MEMORY // 2 - submission.CTA_SMEM_RESERVED
    with pytest.raises(ValueError, match="128x64: two CTAs fit one SM .* Move the allocation after the wait"):
        submission.check_sm_exclusive("128x64", room_for_two)
    submission.check_sm_exclusive("128x128", room_for_two + 1)  # one more byte: one CTA per SM
    assert submission.ctas_per_sm_by_smem(room_for_two + 1) == 1


# ---- what the kernels read before they wait for the previous kernel ----------------------------------------
PTX_INSTRUCTION = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.:]*)\s+([^;]*);", re.M)
NOT_A_DEFINITION = ("st.", "bra", "bar", "mbarrier", "tcgen05.mma", "tcgen05.cp", "tcgen05.commit", "cp.", "fence",
                    "prefetch", "griddepcontrol", "ret", "tensormap", "red.", "atom")


def global_reads(entry: str) -> list:
    """(instruction, before the entry's first griddepcontrol.wait in text order, the kernel parameters its
    address derives from) of every global load and descriptor acquire of one PTX entry. An address is followed
    back through 64-bit registers to the pointers loaded from parameters (`ld.param.b64`); a value loaded from
    memory is a leaf of its own ("loaded")."""
    defs = {}
    for op, args in PTX_INSTRUCTION.findall(entry):
        parts = [a.strip() for a in re.split(r",(?![^{]*\})", args)]
        if not parts[0] or op.startswith(NOT_A_DEFINITION):
            continue
        param = re.search(r"_param_(\d+)", args)
        if op.startswith("ld.param") and param and re.search(r"\.[bus]64", op):
            sources = [int(param[1])]
        elif op.startswith("ld."):
            sources = ["loaded"]
        else:
            sources = [r for p in parts[1:] for r in re.findall(r"%rd\d+", p)]
        for dest in re.findall(r"%\w+", parts[0]):
            defs.setdefault(dest, []).extend(sources)

    def leaves(reg, seen):
        if reg in seen:
            return set()
        seen.add(reg)
        return set().union(*[{s} if not str(s).startswith("%") else leaves(s, seen) for s in defs.get(reg, [])])
    first_wait = entry.find("griddepcontrol.wait")
    reads = re.finditer(r"(ld\.global\S*|fence\.proxy\.tensormap::generic\.acquire\S*)\s+[^\[]*\[(%rd\d+)[^\]]*\]",
                        entry)
    return [(m[1], first_wait < 0 or m.start() < first_wait, leaves(m[2], set())) for m in reads]


class Dataflow:
    """Where the values of one PTX entry come from: each register's defining instructions, followed back to
    leaves: ("param", i) for a value loaded from kernel parameter i, ("load", instruction, its offset in the
    entry, the register holding its address) for a value loaded from memory, ("special", name) for %tid,
    %laneid and the like, ("varies", register) for a register written in more than one place (a loop's
    counter, a branch's choice); immediates add nothing. A register defined in a loop has the leaves of all
    its definitions (computed to a fixed point)."""

    def __init__(self, entry: str):
        self.entry = entry
        direct, sources, counts = {}, {}, {}
        for match in PTX_INSTRUCTION.finditer(entry):
            op, args = match[1], match[2]
            parts = [a.strip() for a in re.split(r",(?![^{]*\})", args)]
            if not parts[0] or op.startswith(NOT_A_DEFINITION):
                continue
            operands = " ".join(parts[1:])
            param, address = re.search(r"_param_(\d+)", operands), re.search(r"\[(%\w+)", operands)
            for dest in re.findall(r"%\w+", parts[0]):
                leaves, regs = direct.setdefault(dest, set()), sources.setdefault(dest, set())
                if op.startswith("ld.param") and param:
                    leaves.add(("param", int(param[1])))
                elif op.startswith("ld."):
                    leaves.add(("load", op, match.start(), address[1] if address else None))
                else:
                    regs.update(re.findall(r"%\w+", operands))
                counts[dest] = counts.get(dest, 0) + 1
        for reg, count in counts.items():  # a loop's counter, a branch's choice: not a fixed value
            if count > 1:
                direct[reg].add(("varies", reg))
        self.found = {reg: set(leaves) for reg, leaves in direct.items()}
        changed = True
        while changed:
            changed = False
            for reg, regs in sources.items():
                before = len(self.found[reg])
                for source in regs:
                    self.found[reg] |= self.found.get(source, {("special", source)})
                changed |= len(self.found[reg]) != before

    def leaves(self, register: str) -> set:
        return self.found.get(register, {("special", register)})


PTX_MULTIPLY = re.compile(r"mul\.(?:rn\.)?f32(x2)?\s+(%\w+),\s*(%\w+),\s*(%\w+|0[fF][0-9A-Fa-f]{8});")


def multiplier_of(entry: str):
    """The fp32 multiplies of an entry's epilogue: (elements multiplied, the operand most of them share, how
    many share it)."""
    muls = PTX_MULTIPLY.findall(entry)
    shared = collections.Counter(r for _, _, a, b in muls for r in (a, b)).most_common(1)
    return sum(2 if x2 else 1 for x2, *_ in muls), *(shared[0] if shared else (None, 0))


def group_dependent_loads(flow: "Dataflow", register: str, after: int) -> list:
    """The global loads `register` is computed from that come after offset `after` and whose address depends on
    more than the kernel's parameters and constants (on the tile's group, here)."""
    return [leaf for leaf in flow.leaves(register) if leaf[0] == "load" and leaf[1].startswith("ld.global")
            and leaf[2] > after and leaf[3] and any(source[0] != "param" for source in flow.leaves(leaf[3]))]


def offs_rounded_to_128(flow: "Dataflow", offs_param: int) -> list:
    """The instructions that turn a count of 128-row blocks computed from offs into rows (P_g's step; the tile
    counts' divisions by 128 are no such instruction)."""
    rounding = re.compile(r"^\s*shl\.b32\s+%\w+,\s*(%\w+),\s*7;", re.M)  # whole 128-row blocks, as rows
    found = []
    for match in rounding.finditer(flow.entry):
        loads = [leaf for leaf in flow.leaves(match[1]) if leaf[0] == "load" and leaf[3]]
        if any(("param", offs_param) in flow.leaves(leaf[3]) for leaf in loads):
            found.append(" ".join(match[0].split()))
    return found


def parameter_index(kernel, name: str, tuple_sizes: dict = {}) -> int:
    """A @cute.kernel argument's index among the PTX entry's parameters (the arguments after self, in order; an
    argument that is a tuple, named in `tuple_sizes`, is one PTX parameter per element)."""
    names = [p for p in inspect.signature(kernel).parameters if p != "self"]
    return sum(tuple_sizes.get(n, 1) for n in names[:names.index(name)])


def test_before_their_waits_the_kernels_read_only_the_plans_tables(report):
    """The GEMM's and the builder's global reads (those before griddepcontrol.wait, and those of warps that
    never wait: the MMA warp's) all address the plan's tables, which only host copies on the plan's stream
    write: the problem sizes (and the builder's address tables); the descriptor table through acquire fences.
    A kernel that writes a table (group sizes computed on the device, say) breaks this, and these reads must
    then move after the wait."""
    gemm, builder = submission.Sm100GroupedGemmKernel.kernel, submission.Sm100GroupedGemmKernel.tensormap_builder
    gemm_tables = {"ld.global": {parameter_index(gemm, "problem_sizes")},
                   "fence.proxy": {parameter_index(gemm, "tensormaps")}}
    atoms = {"atoms": submission.TENSORMAPS_PER_GROUP}  # the B200 builder's five TMA atoms
    builder_tables = {parameter_index(builder, n, atoms) for n in ("problem_sizes", "abc_ptrs", "sf_ptrs")}
    for kernel in (k for k in report["kernels"] if "-offs" not in k["config"]):  # the MoE form: the next test
        for path, tables in ((kernel["ptx_file"], gemm_tables), (kernel["builder_ptx_file"], None)):
            (entry,) = re.split(r"\.entry\s", open(path).read())[1:]
            reads = global_reads(entry)
            assert any(before for _, before, _ in reads), (path, "no read before the wait: the premise changed")
            for instruction, before, params in reads:
                allowed = builder_tables if tables is None else tables[instruction.split(".")[0] + (
                    ".proxy" if instruction.startswith("fence") else ".global")]
                assert params and params <= allowed, (
                    f"{kernel['config']}: {instruction} ({'before' if before else 'after'} the wait) reads from "
                    f"parameters {sorted(map(str, params))}, not only the plan's tables {sorted(allowed)}")


def test_the_moe_forms_read_nothing_before_their_waits(report):
    """The MoE form's tables are a kernel's output (its builder computes them from offs, which may itself be the
    previous kernel's output): its builder and its GEMM read no global memory before griddepcontrol.wait, and
    the group sizes reach them through offs alone (the builder's host function has no size table)."""
    moe_kernels = [k for k in report["kernels"] if "-offs" in k["config"]]
    assert len(moe_kernels) == 2  # fp16 and bf16 output
    for path in (p for k in moe_kernels for p in (k["ptx_file"], k["offsets_builder_ptx_file"])):
        (entry,) = re.split(r"\.entry\s", open(path).read())[1:]
        reads = global_reads(entry)
        assert reads, (path, "no global read at all: the premise changed")
        early = [(instruction, sorted(map(str, params))) for instruction, before, params in reads if before]
        assert not early, f"{path}: read before griddepcontrol.wait: {early}"
    builder = moe_tables.OffsetsBuilder.offsets_builder
    inputs = {parameter_index(builder, name, {"atoms": submission.TENSORMAPS_PER_GROUP})
              for name in ("offs", "a_global_address", "b_global_address")}
    (entry,) = re.split(r"\.entry\s", open(moe_kernels[0]["offsets_builder_ptx_file"]).read())[1:]
    loaded_from = set().union(*(params for instruction, _, params in global_reads(entry)
                                if instruction.startswith("ld.global")))
    assert loaded_from == inputs, (f"the builder reads parameters {sorted(map(str, loaded_from))}, expected offs "
                                   "and the global scales alone")


def test_every_lane_shuffle_reads_the_lane_it_names(report):
    """A lane shuffle whose clamp is not its segment's bound compiles and keeps lanes' own values: DSL releases
    before 4.8 pass shfl.sync.up a clamp of 31 by default, under which the MoE form's scans of offs move nothing
    (every group but each round's first empty). No kernel or builder, of either DSL release, has such a shuffle;
    the MoE form's builder scans offs with shfl.sync.up (the check has something to check)."""
    for k in report["kernels"]:
        for key in ("ptx_features", "builder_ptx_features", "offsets_builder_ptx_features"):
            assert k.get(key, {}).get("misclamped_shuffles", []) == [], (k["config"], k["cutlass_dsl"], key)
    moe = next(k for k in report["kernels"] if k["config"] == compile_gate.kernel_name(moe_tables.MOE_CONFIG))
    assert moe["offsets_builder_ptx_features"]["shuffles_up"] > 0


def test_the_gate_finds_a_shuffle_whose_clamp_keeps_lanes_own_values():
    """`compile_gate.misclamped_shuffles` on PTX lines as the DSL releases write them."""
    good = ("shfl.sync.up.b32 \t%r301, %r1368, 1, 0, -1;\n"
            "shfl.sync.bfly.b32\t%r346, %r1369, 16, 31, -1;\n"
            "shfl.sync.idx.b32 %r1, %r2, 31, 0x1f, -1;\n"
            "shfl.sync.down.b32 %r5|%p1, %r6, 2, 31, -1;\n"
            "shfl.sync.up.b32 %r7, %r8, 1, 0x1800, -1;\n"  # an 8-lane segment (CUDA's width 8), clamp 0
            "shfl.sync.up.b32 %r7, %r8, 1, %r9, -1;\n")  # a clamp in a register: not judged
    assert compile_gate.misclamped_shuffles(good) == []
    bad = ("shfl.sync.up.b32\t%r301, %r1368, 1, 31, -1;\n"  # DSL 4.5.2's shuffle_sync_up
           "shfl.sync.bfly.b32 %r346, %r1369, 16, 0, -1;\n")
    assert compile_gate.misclamped_shuffles(bad) == ["shfl.sync.up.b32 %r301, %r1368, 1, 31, -1;",
                                                     "shfl.sync.bfly.b32 %r346, %r1369, 16, 0, -1;"]
    assert compile_gate.ptx_features(good + bad)["shuffles_up"] == 4


@pytest.mark.parametrize("bf16", [False, True], ids=["fp16", "bf16"])
def test_the_b200_moe_form_scales_each_group_by_its_alpha_and_rounds_once_to_its_type(report, bf16):
    """The arithmetic the MoE form adds to the reviewed kernel: every accumulator element multiplied by one
    register, alpha, loaded after the wait from an address that follows the tile's group (not group 0's for
    every group); then the one rounding, to the output's type only; and the builder's P_g, the groups' rows
    each rounded up to 128 (not the rows themselves), from offs."""
    kernels = {k["config"]: k for k in report["kernels"]}
    config = dataclasses.replace(moe_tables.MOE_CONFIG, bf16_output=bf16)
    kernel = kernels[compile_gate.kernel_name(config)]
    (entry,) = re.split(r"\.entry\s", open(kernel["ptx_file"]).read())[1:]
    reviewed = open(kernels["128x128"]["ptx_file"]).read()
    wanted, other = ("bf16x2", "f16x2") if bf16 else ("f16x2", "bf16x2")
    conversions = len(re.findall(rf"cvt\.rn\.{wanted}\.f32", entry))
    assert conversions == len(re.findall(r"cvt\.rn\.f16x2\.f32", reviewed)) > 0
    assert not re.search(rf"cvt\.rn\.{other}\.f32", entry) and not re.search(r"cvt\.rn\.b?f16\.f32", entry)
    elements, alpha, shared = multiplier_of(entry)
    assert multiplier_of(reviewed)[0] == 0
    assert elements == 2 * conversions and shared == len(PTX_MULTIPLY.findall(entry)), (elements, alpha, shared)
    wait = entry.index("griddepcontrol.wait")
    assert group_dependent_loads(Dataflow(entry), alpha, after=wait), f"{alpha}: not the tile's group's alpha"
    (builder,) = re.split(r"\.entry\s", open(kernel["offsets_builder_ptx_file"]).read())[1:]
    offs = parameter_index(moe_tables.OffsetsBuilder.offsets_builder, "offs",
                           {"atoms": submission.TENSORMAPS_PER_GROUP})
    assert offs_rounded_to_128(Dataflow(builder), offs), "P_g: no group's rows rounded up to 128"


def test_the_b200_warp_roles_are_checked_where_a_kernel_is_made():
    """Roles are one frozen value; the arrive counts derive from it, and a kernel refuses roles that would hang."""
    roles = submission.SM100_ROLES
    assert roles.threads == 192 and roles.epilogue_threads == 128 and roles.acc_consumer_arrives == 4
    assert submission.pipeline_arrive_counts(roles) == (1, 4)
    for bad, why in ((dataclasses.replace(roles, mma_warp=3), "each warp has one role"),
                     (dataclasses.replace(roles, epilogue_warps=(0, 1, 2, 4), mma_warp=3),
                      "the epilogue warps cover TMEM's lanes"),
                     (dataclasses.replace(roles, epilogue_warps=(1, 2, 3, 4), mma_warp=0, tma_warp=5),
                      "dispatches the epilogue"),
                     (dataclasses.replace(roles, tmem_alloc_barrier=1), "named barriers are distinct")):
        with pytest.raises(ValueError, match=why):
            submission.Sm100GroupedGemmKernel(submission.TILE_CONFIGS["128x128"], bad)


def test_the_b200_moe_form_is_the_reviewed_128x128_kernel_plus_its_wait(report):
    """The MoE form's GEMM is the 128x128 kernel (whose PTX the review compared with NVIDIA's example) with one
    more griddepcontrol.wait, the one before it reads the tables: every other instruction class counts the same
    (scripts/ptx_counts.py's classes), the MMA forms too."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import ptx_counts
    kernels = {k["config"]: k for k in report["kernels"]}
    reviewed = open(kernels["128x128"]["ptx_file"]).read()
    moe = open(kernels[compile_gate.kernel_name(moe_tables.MOE_CONFIG)]["ptx_file"]).read()
    before, after = ptx_counts.counts(reviewed), ptx_counts.counts(moe)
    assert after.pop("griddepcontrol") == before.pop("griddepcontrol") + 1
    assert after == before
    mma = re.compile(r"tcgen05\.mma\S*")
    assert sorted(mma.findall(moe)) == sorted(mma.findall(reviewed))
