"""The Hopper (sm_90a) kernel's compile and PTX checks: it compiles on the CPU for every task shape without
spills or serialized wgmma, and its PTX has the designed instructions (every form, every timing diagnostic)."""
import dataclasses
import json
import re
import subprocess
import sys

import pytest

from conftest import BENCHMARK_CASES, ROOT, TEST_CASES
from test_compile import DSL_INSTALLS, env_for

from nvfp4_group_gemm import compile_gate

hopper = pytest.importorskip("nvfp4_group_gemm.hopper")
hopper_policy = pytest.importorskip("nvfp4_group_gemm.hopper_policy")
# the kernels the Hopper compile gate compiles
SM90_FORMS = {**hopper.SM90_CONFIGS, **hopper.SM90_CANDIDATES, **hopper.SM90_MOE_CONFIGS,
              **{f"{name}-bf16": dataclasses.replace(c, bf16_output=True)
                 for name, c in hopper.SM90_MOE_CONFIGS.items()}}

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
    # each configuration round-robin and with contiguous tile ranges (sm90_schedule picks either), then the MoE
    # op's forms likewise (moe_choice): one kernel each, no builder
    assert [k["config"] for k in report["kernels"]] == [
        n for forms in (hopper.SM90_CONFIGS, hopper.SM90_CANDIDATES, hopper.SM90_MOE_CONFIGS)
        for name in forms for n in (name, f"{name}/contiguous")] + [
        f"{name}-bf16" for name in hopper.SM90_MOE_CONFIGS]
    for kernel in report["kernels"]:
        config = SM90_FORMS[kernel["config"].split("/")[0]]
        assert kernel["ok"], kernel
        assert "offsets_builder_registers" not in kernel
        assert config.device_offsets != ("builder_registers" in kernel)
    # the MoE forms' groups in shared memory (hopper.MOE_MAX_EXPERTS of them) cost no stage
    stages = {k["config"]: k["stages_ab"] for k in report["kernels"]}
    for name, count in stages.items():
        assert count == stages[name.replace("-offs", "").replace("-bf16", "")], name
        assert kernel["spill_store_bytes"] == 0 and kernel["spill_load_bytes"] == 0 and kernel["stack_bytes"] == 0
        assert kernel["wgmma_serialized"] is False  # ptxas overlaps the wgmma with what follows
        # one CTA fits an SM: registers and shared memory
        assert 0 < kernel["registers"] <= hopper.register_budget() == kernel["register_budget"]
        assert 0 < kernel["dynamic_smem_bytes"] <= hopper.SMEM_CAPACITY
        assert kernel["tile_k"] == config.tile_k
        assert kernel["direct_host_arguments"] is True
        # one entry point: the GEMM, whose MMA warps convert the tokens
        assert kernel["kernels"] == 1
    expected = [[[m, n, k, 1] for m, n, k in zip(c.args["m"], c.args["n"], c.args["k"])]
                for c in TEST_CASES + BENCHMARK_CASES]
    plans = report["shape_sets"]
    assert [p["problem_sizes"] for p in plans[:14]] == expected
    # custom_kernel's choice (sm90_choice): benchmark 0 takes the narrow pair, benchmark 1 the 192-token pair,
    # every shape set its schedule
    assert all(p["config"] == hopper_policy.sm90_choice(tuple(map(tuple, p["problem_sizes"])), 132).name
               and p["tiles"] >= 1 for p in plans)
    assert plans[10]["config"] == "sm90-128x256-k128-wr-pair-narrow-n16-64/by-m"
    assert plans[11]["config"] == "sm90-192x256-k64-wr-pair/contiguous+balanced+by-m"
    assert {p["config"].split("/")[1] for p in plans} == {"round-robin", "by-m", "contiguous+balanced+by-m"}
    assert {p["kernel"] for p in plans} <= {k["config"] for k in report["kernels"]}


@pytest.mark.parametrize("name", [*hopper.SM90_CONFIGS, *hopper.SM90_CANDIDATES])
def test_ptx_has_the_designed_instructions(report, name):
    (kernel,) = [k for k in report["kernels"] if k["config"] == name]
    config = SM90_FORMS[name]
    with open(kernel["ptx_file"]) as f:
        ptx = f.read()
    features = kernel["ptx_features"]
    # fp16 wgmma, fp32 accumulators, wgmma's N = the tile's tokens: one per 16-wide K block of a
    # stage, for each of the two register buffers (stages come in pairs); A (the weights) from registers
    wgmma = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{config.tile_m}k16\.f32\.f16\.f16[^;]*", ptx)
    assert len(wgmma) == hopper.NUM_REGISTER_BUFFERS * config.tile_k // 16
    assert all(re.search(r"\},\s*\{", w) for w in wgmma), wgmma[0]
    # fp16 tokens by TMA in 128-byte swizzle boxes (one copy per 64 K) and packed B through
    # per-CTA descriptors; SFB by bulk copy
    designed = config.tile_k // 64 + 1
    # Each stage's loads appear twice: in the producer's K loop, and split around its wait for the
    # converted tokens (the first stages' weights, B and SFB, before it; their tokens after it). DSL 4.5.2
    # unrolls the loops despite unroll=1 (its PTX repeats a body with k_tile + 1, + 2, ...), so there the
    # loads only keep their proportion; 4.8.1 emits one body each.
    bodies = 2 if kernel["cutlass_dsl"].startswith("4.8") else features["bulk_copy_load"]
    assert bodies >= 2
    assert features["tma_load"] == designed * bodies
    assert features["bulk_copy_load"] == bodies
    # no L2 cache policy on a TMA load (DSL 4.5.2 writes every one with a cache hint operand, 0)
    policies = [re.search(rf"mov\.[bu]64\s+{re.escape(reg)},\s*(\d+);", ptx).group(1) for reg in re.findall(
        r"cp\.async\.bulk\.tensor[^;]*\.L2::cache_hint[^;]*,\s*(%rd\d+);", ptx)]
    assert set(policies) <= {"0"}, name
    (gemm,) = re.split(r"\.entry\s", ptx)[1:]
    # programmatic dependent launch: the producer and the MMA warps read nothing of the inputs before their
    # griddepcontrol.wait; the producer releases the next kernel after its last loads
    assert features["pdl_launch_dependents"] == 1 and features["pdl_wait"] == 2
    before_wait = gemm[:gemm.index("griddepcontrol.wait")]  # the producer's wait comes first
    assert not re.search(compile_gate.PTX_FEATURES["tma_load"], before_wait)
    assert not re.search(compile_gate.PTX_FEATURES["bulk_copy_load"], before_wait)
    # the token conversion: MMA warps claim units (relaxed atomics), store them 16 bytes at a time, fence
    # them for the async proxy (every state space: the scratch, and the staged rows that token loads will
    # overwrite) and count them (release); the producer waits at the tokens' barrier for its
    # CTA's MMA warps, polls the count (acquire), fences, then loads tokens; it counts its CTA as past, and
    # the last CTA sets the three counters back to zero
    producer, mma = gemm[:gemm.rindex("griddepcontrol.wait")], gemm[gemm.rindex("griddepcontrol.wait"):]
    # (DSL 4.5.2 puts a named barrier's id and count in registers; 4.8.1 writes them out)
    tokens_barrier = (rf"(?:{hopper.WARP_ROLES.tokens_ready_barrier}|%r\d+), "
                      rf"(?:{hopper.WARP_ROLES.tokens_ready_threads}|%r\d+);")
    assert len(re.findall(r"atom\.relaxed\.gpu\.global\.add\.u32", mma)) >= 1
    assert len(re.findall(r"red\.release\.gpu\.global\.add\.u32", mma)) == 1
    assert re.search(rf"fence\.proxy\.async;(?:(?!st\.global|ld\.shared|st\.shared).)*red\.release", mma, re.S)
    assert "fence.proxy.async.global;" not in mma
    assert len(re.findall(rf"bar\.arrive\s+{tokens_barrier}", mma)) == 1
    conversion = mma[mma.index("atom.relaxed.gpu"):mma.index("bar.arrive")]
    # each lane's units: tile_k fp16 each, staged in shared memory and stored to the scratch 16 bytes per
    # lane and instruction (`staged_chunk`), both as many as the lane's bytes / 16
    per_lane = hopper.TOKEN_UNITS_PER_LANE * config.tile_k * 2 // 16
    assert len(re.findall(r"st\.shared\.v4", conversion)) == per_lane
    assert len(re.findall(r"ld\.shared\.v4", conversion)) == per_lane
    assert len(re.findall(r"st\.global\.v4", conversion)) == per_lane
    assert conversion.rindex("st.shared.v4") < conversion.index("bar.warp.sync") < conversion.index("ld.shared.v4")
    # the epilogue: per token width w, ceil(w / EPILOGUE_TOKENS) passes, each thread storing 16-byte pieces of the
    # pass's rows, at most the tile's (a tile narrower than a pass stores its own rows, not the next tile's)
    passes = sum(-(-width // hopper.EPILOGUE_TOKENS) for width in config.token_widths)
    per_pass = min(hopper.EPILOGUE_TOKENS, config.tile_m) * 64 // 8 // 128
    assert len(re.findall(r"st\.global\.v4", mma[mma.index("bar.arrive"):])) == passes * per_pass
    # every stage release (the MMA warps' mbarrier arrives) comes after the cross-proxy fence, with no shared
    # read between: this thread's generic reads of the stage (packed B, SFB) ordered before the next TMA write
    arrives = [m.start() for m in re.finditer(r"mbarrier\.arrive[^;]*;", mma)]
    fences = [m.start() for m in re.finditer(r"fence\.proxy\.async\.shared::cta;", mma)]
    assert arrives and len(fences) == len(arrives)
    for at in arrives:
        last_fence = max((f for f in fences if f < at), default=None)
        assert last_fence is not None and "ld.shared" not in mma[last_fence:at], name
    # the MMA warps' staging fits the token stages (the compile checks it too)
    staging = hopper.WARP_ROLES.consumer_warps * config.make_kernel().token_staging_bytes()
    assert staging <= kernel["stages_ab"] * config.tile_m * config.tile_k * 2
    tokens_wait = re.search(rf"bar\.sync\s+{tokens_barrier}(.*?)"
                            r"fence\.proxy\.async\.global;(.*)", producer, re.S)
    assert tokens_wait and "ld.acquire.gpu.global.u32" in tokens_wait.group(1)
    assert re.search(compile_gate.PTX_FEATURES["tma_load"], tokens_wait.group(2))  # the tokens' loads follow
    assert len(re.findall(r"atom\.acq_rel\.gpu\.global\.add\.u32", producer)) == 1
    assert len(re.findall(r"st\.relaxed\.gpu\.global\.u32", producer)) == 3
    # descriptors built once per input (the builder), only acquired and prefetched in the GEMM:
    # the first group's by the producer before its wait (plan ready) and after it, then a tile ahead
    assert features["tensormap_replace"] == features["tensormap_release"] == 0
    assert features["tensormap_acquire"] == features["tensormap_prefetch"] == 3 * hopper.SM90_TENSORMAPS
    assert features["acquires_before_waits"] == [hopper.SM90_TENSORMAPS, 0]  # producer, MMA warps
    built = kernel["builder_ptx_features"]
    assert built["tensormap_replace"] > 0 and built["tensormap_release"] == hopper.SM90_TENSORMAPS
    assert built["pdl_wait"] == 1 and kernel["builder_spill_bytes"] == 0
    # the builder zeroes the plan's three token counters after its wait
    with open(kernel["builder_ptx_file"]) as f:
        builder = f.read()
    assert len(re.findall(r"st\.relaxed\.gpu\.global\.u32", builder[builder.index("griddepcontrol.wait"):])) == 3
    # E4M3 scales converted in pairs; no thread writes an fp16 operand to shared memory (16-byte shared
    # stores only in the token conversion's staging); the weights read with 8-byte loads
    assert features["e4m3_to_f16x2"] >= 1
    assert len(re.findall(r"st\.shared\.v4", ptx)) == per_lane
    assert len(re.findall(r"ld\.shared\.(?:u64|b64|v2\.u32)", ptx)) >= 2
    assert features["threads_per_cta"] == hopper.WARP_ROLES.threads == 32 * 12
    # registers move from the producer warpgroup to the MMA warpgroups (setmaxnreg)
    assert re.findall(r"setmaxnreg\.(dec|inc)\.sync\.aligned\.u32\s+(\d+)", ptx) == [
        ("dec", str(hopper.WARP_ROLES.producer_registers)), ("inc", str(hopper.WARP_ROLES.consumer_registers))]


def test_a_pairs_token_loads_reach_both_ctas_and_each_stage_waits_for_both(report):
    """The pair's PTX: a (2,1,1) cluster; token stages by multicast TMA (each CTA its half: one copy per
    64 K, as alone), weights by plain TMA; each MMA warp releases a stage at both CTAs' barriers; the
    barriers are published cluster-wide before the first load and neither CTA leaves before the other is
    done. The single-CTA forms have none of it."""
    for kernel in report["kernels"]:
        config = SM90_FORMS[kernel["config"].split("/")[0]]
        with open(kernel["ptx_file"]) as f:
            ptx = f.read()
        multicast = re.findall(r"cp\.async\.bulk\.tensor\.2d\.[^;]*multicast::cluster[^;]*;", ptx)
        # (DSL 4.5.2 writes "mbarrier.arrive.release.cta.shared::cluster", 4.8.1 "mbarrier.arrive.shared::cluster")
        remote_arrives = re.findall(r"mbarrier\.arrive(?:\.release\.cta)?\.shared::cluster\.b64", ptx)
        cluster_barriers = re.findall(r"barrier\.cluster\.(arrive(?:\.relaxed)?|wait)", ptx)
        if config.cta_group == 1:
            assert kernel["cluster"] == [1, 1, 1] and not multicast and not remote_arrives and not cluster_barriers
            continue
        assert kernel["cluster"] == [2, 1, 1]
        tma = kernel["ptx_features"]["tma_load"]
        bodies = kernel["ptx_features"]["bulk_copy_load"]  # see test_ptx_has_the_designed_instructions
        assert len(multicast) == config.tile_k // 64 * bodies and tma == len(multicast) + bodies
        assert len(remote_arrives) >= 1
        assert cluster_barriers[:2] == ["arrive.relaxed", "wait"] and cluster_barriers[-2:] == ["arrive", "wait"]
        (gemm,) = re.split(r"\.entry\s", ptx)[1:]
        assert gemm.index("barrier.cluster.wait") < gemm.index("griddepcontrol.wait")


def test_each_token_width_has_its_own_mainloop(report):
    """A form's PTX has one mainloop per token width (`token_widths`: wgmma's N, the stage's first token rows),
    each with as many wgmma as a stage pair has 16-K steps, and no other width; at most three of them (from
    four on, ptxas serializes every wgmma for want of registers: C7512, which the gate also fails)."""
    for kernel in report["kernels"]:
        config = SM90_FORMS[kernel["config"].split("/")[0]]
        with open(kernel["ptx_file"]) as f:
            ptx = f.read()
        found = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16", ptx)
        assert sorted(set(map(int, found))) == list(config.token_widths), kernel["config"]
        assert all(found.count(str(w)) == hopper.NUM_REGISTER_BUFFERS * config.tile_k // 16
                   for w in config.token_widths), kernel["config"]
        assert len(config.token_widths) <= hopper.MAX_TOKEN_WIDTHS


def _kernel_ptx(configs, dump_dir, install: str) -> dict:
    """name -> PTX of each configuration's kernel, compiled for sm_90a in a fresh
    process (the DSL takes its target at first use) under DSL `install`, files kept in `dump_dir`."""
    script = ("import sys, json\nfrom nvfp4_group_gemm import compile_gate, hopper, submission\n"
              "configs = {c.name: c for c in hopper.SM90_DIAGNOSTICS + tuple(hopper.SM90_CONFIGS.values())}\n"
              "out = {}\n"
              "for name in sys.argv[1:]:\n"
              "    kernel = configs[name].make_kernel()\n"
              "    out[name] = compile_gate.ptx_text(\n"
              "        submission.compile_with_placeholders(kernel, submission.GEMM_ARGUMENTS))\n"
              "    assert kernel.smem_bytes <= hopper.SMEM_CAPACITY\n"
              "print(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", script, *(c.name for c in configs)], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800,
                          env=dict(env_for(install), CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx",
                                   CUTE_DSL_DUMP_DIR=str(dump_dir)))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_each_moe_form_is_its_leaderboard_form_reading_its_groups_from_offs(report):
    """Each MoE form (device_offsets, both schedules, and bf16 output) is one kernel with its leaderboard form's
    data movement and MMAs: the same TMA load, bulk copy, mbarrier and named-barrier instructions (each of
    scripts/ptx_counts.py's classes, form by form; how many copies of a loop body the compiler emits differs
    between DSL releases), wgmma form by form and count by count. What differs is where the groups and
    descriptors come from: one griddepcontrol.wait, before which it reads no global memory (offs may be the
    previous kernel's output), and its two descriptors are parameters (prefetched; none acquired from
    memory)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import ptx_counts
    from test_compile import global_reads
    kernels = {k["config"]: k for k in report["kernels"]}
    wgmma = re.compile(r"wgmma\.mma_async\S*")
    moe_forms = [name for name in kernels if "-offs" in name]
    assert len(moe_forms) == 3 * len(hopper.SM90_CONFIGS)  # each form under two schedules, and with bf16 output
    for name in moe_forms:
        leaderboard = open(kernels[name.replace("-offs", "").replace("-bf16", "")]["ptx_file"]).read()
        moe = open(kernels[name]["ptx_file"]).read()
        forms = lambda ptx, pattern: set(re.findall(pattern + r"\S*", ptx))
        for what, pattern in ptx_counts.CLASSES.items():
            if what not in ("griddepcontrol", "prefetch.tensormap", "fence"):  # below
                assert forms(moe, pattern) == forms(leaderboard, pattern), (name, what)
        assert sorted(wgmma.findall(moe)) == sorted(wgmma.findall(leaderboard)), name
        assert len(re.findall(r"griddepcontrol\.wait", moe)) == 1, name
        # the first of two forms lets the second launch before its own wait (one_wave_rule), once
        assert len(re.findall(r"griddepcontrol\.launch_dependents", moe[:moe.index("griddepcontrol.wait")])) == 1
        assert len(re.findall(r"prefetch\.tensormap", moe)) == 2, name
        assert "fence.proxy.tensormap" not in moe and "fence.proxy.tensormap" in leaderboard, name
        (entry,) = re.split(r"\.entry\s", moe)[1:]
        reads = global_reads(entry)
        assert reads, (name, "no global read at all: the premise changed")
        early = [(instruction, sorted(map(str, params))) for instruction, before_wait, params in reads
                 if before_wait]
        assert not early, f"{name}: read before griddepcontrol.wait: {early}"


def test_every_lane_shuffle_reads_the_lane_it_names(report):
    """No Hopper kernel, of either DSL release, has a lane shuffle whose clamp keeps lanes' own values (under
    DSL 4.5.2's default clamp for shfl.sync.up, the MoE forms' scans of offs moved nothing and their results
    were wrong); each MoE form scans offs with shfl.sync.up."""
    for k in report["kernels"]:
        assert k["ok"], k
        assert k["ptx_features"]["misclamped_shuffles"] == [], (k["config"], k["cutlass_dsl"])
        assert k.get("builder_ptx_features", {}).get("misclamped_shuffles", []) == [], k["config"]
        assert (k["ptx_features"]["shuffles_up"] > 0) == ("-offs" in k["config"]), k["config"]


@pytest.mark.slow
def test_each_moe_form_scales_each_group_by_its_alpha_and_rounds_once_to_its_type(report):
    """The arithmetic each MoE form adds to its leaderboard form: the epilogue's factor (2^14 there) becomes a
    register computed from the group's global scales, loaded after the wait from addresses that follow the
    tile's group (not group 0's for every group), two more multiplies; the one rounding goes to the output's
    type only (bf16 forms: cvt.rn.bf16.f32, never fp16's); P_g, each group's rows rounded up to 128, from
    offs."""
    from test_compile import Dataflow, group_dependent_loads, multiplier_of, offs_rounded_to_128, parameter_index
    kernels = {k["config"]: k for k in report["kernels"]}
    offs = parameter_index(hopper.Sm90GroupedGemmKernel.moe_kernel, "offs")
    for name in (n for n in kernels if "-offs" in n):
        leaderboard = open(kernels[name.replace("-offs", "").replace("-bf16", "")]["ptx_file"]).read()
        (entry,) = re.split(r"\.entry\s", open(kernels[name]["ptx_file"]).read())[1:]
        wanted, other = ("bf16", "f16") if name.endswith("-bf16") else ("f16", "bf16")
        assert len(re.findall(rf"cvt\.rn\.{wanted}\.f32", entry)) == len(
            re.findall(r"cvt\.rn\.f16\.f32", leaderboard)) > 0, name
        assert not re.search(rf"cvt\.rn\.{other}\.f32", entry), name
        elements, factor, shared = multiplier_of(entry)
        assert elements == multiplier_of(leaderboard)[0] + 2 and shared == elements - 2, (name, elements, shared)
        flow = Dataflow(entry)
        loads = group_dependent_loads(flow, factor, after=entry.index("griddepcontrol.wait"))
        assert len(loads) == 2, (name, factor, loads)  # a_global[g] and b_global[g]
        assert offs_rounded_to_128(flow, offs), (name, "P_g: no group's rows rounded up to 128")


@pytest.mark.parametrize("install", DSL_INSTALLS)
def test_every_timing_diagnostic_changes_the_default_forms_code(tmp_path, install):
    """`eval.py sweep --diagnose` variants (timing only; each Diagnostic gives wrong results by design; the
    no-pdl form is exact): each is the default form with one part left out or moved, and its PTX shows it
    (no-pdl's part is a launch attribute)."""
    assert [c.diagnostic for c in hopper.SM90_DIAGNOSTICS] == list(hopper.Diagnostic) + [None]
    assert all(dataclasses.replace(c, diagnostic=None, pdl=True) == hopper.SM90_CONFIG
               for c in hopper.SM90_DIAGNOSTICS)
    assert not any(c.diagnostic for c in hopper.SM90_CONFIGS.values())
    ptx = _kernel_ptx((hopper.SM90_CONFIG,) + hopper.SM90_DIAGNOSTICS, tmp_path, install)
    base = ptx.pop(hopper.SM90_CONFIG.name)
    count = lambda pattern, text: len(re.findall(pattern, text))
    by_what = {c.diagnostic.value if c.diagnostic else "no-pdl": ptx[c.name] for c in hopper.SM90_DIAGNOSTICS}
    # no-pdl (exact results): the same device code, launched without programmatic dependent launch (host side)
    assert by_what.pop("no-pdl") == base
    for what, text in by_what.items():
        assert text != base, what
    conversion = r"mul\.rn\.f16x2"
    # skip-convert: the weights' conversion goes (the tokens' stays)
    assert 0 < count(conversion, by_what["skip-convert"]) < count(conversion, base)
    # skip-mma and skip-epilogue: the part stays in the code, behind a branch no run takes (K < 0), so that
    # ptxas keeps the work feeding it (where it was left out, ptxas removed the conversions with the wgmma, and
    # 42 of the 48 wgmma with the epilogue); text != base above: the branch is there
    for what in ("skip-mma", "skip-epilogue"):
        for pattern in (r"wgmma\.mma_async", conversion, r"st\.shared\.b16", r"st\.global\.v4"):
            assert count(pattern, by_what[what]) == count(pattern, base) > 0, (what, pattern)
    # skip-tokens: packed B's TMA loads only (the first stages', then the K loop's): 2 of the default form's 6
    # load sites (a release may emit one site as several instructions: DSL 4.5.2 takes 4 each, 4.8.1 one)
    tma = r"cp\.async\.bulk\.tensor\.\dd\.shared::(?:cta|cluster)\.global"
    assert 0 < 3 * count(tma, by_what["skip-tokens"]) == count(tma, base)
    # skip-weights: the tokens' TMA loads only (4 of the 6 sites), no bulk copy of the weights' scale factors; the
    # weights' conversion stays, on whatever the stages hold
    bulk = compile_gate.PTX_FEATURES["bulk_copy_load"]
    assert 0 < 3 * count(tma, by_what["skip-weights"]) == 2 * count(tma, base)
    assert count(bulk, by_what["skip-weights"]) == 0 < count(bulk, base)
    assert count(conversion, by_what["skip-weights"]) == count(conversion, base)
    # skip-weights-and-convert: both (the loads as skip-weights, the conversions as skip-convert)
    both = by_what["skip-weights-and-convert"]
    assert count(tma, both) == count(tma, by_what["skip-weights"]) and count(bulk, both) == 0
    assert count(conversion, both) == count(conversion, by_what["skip-convert"])
    # skip-token-conversion: no claims, counts, waits, resets or tokens' barrier (the kernel's one named-barrier
    # arrive; DSL 4.5.2 names its id in a register, 4.8.1 as the constant); the weights' conversion stays
    skipped = by_what["skip-token-conversion"]
    for pattern in (r"\batom\.", r"\bred\.", r"ld\.acquire", r"st\.relaxed", r"fence\.proxy\.async\.global",
                    r"fence\.proxy\.async;", r"bar\.arrive\s"):
        assert count(pattern, base) > 0 == count(pattern, skipped), pattern
    assert 0 < count(conversion, skipped) < count(conversion, base)


def test_the_compile_gate_fails_a_kernel_whose_wgmma_ptxas_serializes():
    line = ("ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized "
            "due to insufficient register resources for the function 'kernel'")
    assert compile_gate.PTXAS_WGMMA_SERIALIZED.search(line)
    assert not compile_gate.PTXAS_WGMMA_SERIALIZED.search("ptxas info    : Used 159 registers, used 1 barriers")
