"""On a CUDA GPU: custom_kernel against the reference, and generate_input's determinism.
B200-only tests run the tcgen05 kernel; everything here skips without CUDA."""
import importlib
import importlib.util
import os
import sys

import pytest
import torch

from nvfp4_group_gemm import launch, peers, submission
from test_host_path import warm_up_graph_capture
from conftest import BENCHMARK_CASES, TEST_CASES, needs_b200, needs_cuda, needs_hopper, needs_hopper_or_b200
from nvfp4_group_gemm.reference import check_implementation, generate_input

pytestmark = needs_cuda.marks


def _bytes(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t


def _all_tensors(data):
    abc, sf, sf_r, _ = data
    return [t for group in abc + sf + sf_r for t in group]


def run_and_check(data):
    inputs_before = [_bytes(t).clone() for t in _all_tensors(data)
                     if not any(t is c for _, _, c in data[0])]
    for _, _, c in data[0]:
        c.fill_(float("nan"))  # every element must be written
    output = submission.custom_kernel(data)
    torch.cuda.synchronize()
    assert [o.data_ptr() for o in output] == [c.data_ptr() for _, _, c in data[0]]
    inputs_after = [_bytes(t) for t in _all_tensors(data) if not any(t is c for _, _, c in data[0])]
    assert all(torch.equal(x, y) for x, y in zip(inputs_before, inputs_after))  # inputs untouched
    ok, message = check_implementation(data, output)
    assert ok, message


@pytest.mark.parametrize("case", TEST_CASES, ids=lambda c: c.spec)
def test_custom_kernel_matches_reference_on_every_test_shape(case):
    run_and_check(generate_input(**case.args))


@pytest.mark.parametrize("ms", [(1,), (33, 129), (1, 33, 129, 300, 7)])
def test_custom_kernel_outside_the_task_shapes(ms):
    g = len(ms)
    run_and_check(generate_input(ms, tuple(128 * (i % 3 + 1) for i in range(g)),
                                 tuple(256 * (i % 2 + 1) for i in range(g)), g, seed=99))


def random_contract_sizes(seed: int):
    """G 1..32, M 1..1024, N a multiple of 128, K a multiple of 256 (the contract)."""
    import random
    rng = random.Random(seed)
    g = rng.randint(1, 32)
    return ([rng.randint(1, 1024) for _ in range(g)], [128 * rng.randint(1, 16) for _ in range(g)],
            [256 * rng.randint(1, 16) for _ in range(g)])


@pytest.mark.parametrize("seed", range(8))
def test_custom_kernel_on_random_contract_shapes(seed):
    ms, ns, ks = random_contract_sizes(seed)
    run_and_check(generate_input(tuple(ms), tuple(ns), tuple(ks), len(ms), seed=1000 + seed))


def test_code_path_label():
    capability = torch.cuda.get_device_capability()
    # conftest imported hopper and portable: their paths are registered
    hopper_policy = importlib.import_module("nvfp4_group_gemm.hopper_policy")
    portable = importlib.import_module("nvfp4_group_gemm.portable")
    expected = {(10, 0): submission.PATH_B200, (9, 0): hopper_policy.PATH_HOPPER}.get(capability,
                                                                                      portable.PATH_PORTABLE)
    assert launch.code_path(torch.device("cuda")) == expected


@pytest.mark.parametrize("case", BENCHMARK_CASES, ids=lambda c: c.spec)
def test_calls_do_not_block_the_host(case):
    """The leaderboard times 15 calls issued while its L2 flush still runs on the GPU: a call that waits for
    the GPU would put its host time into the score. With ~1 s of GPU work queued, 15 cold calls (inputs never
    seen) and then 15 warm calls (the same again) all return while the stream is still busy."""
    from nvfp4_group_gemm.harness import benchmark_inputs
    kernel_paths = (submission.PATH_B200, importlib.import_module("nvfp4_group_gemm.hopper_policy").PATH_HOPPER)
    if launch.code_path(torch.device("cuda")) not in kernel_paths:
        pytest.skip("only the kernel paths are non-blocking (the portable path copies a table to the GPU)")
    submission.custom_kernel(benchmark_inputs(case.args)[0])  # compiles outside the timed part, as a warm-up does
    inputs = benchmark_inputs(case.args)
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second at H200/B200 clocks
    for data in inputs + inputs:
        submission.custom_kernel(data)
    busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert busy, "a call waited for the GPU"
    ok, message = check_implementation(inputs[-1], [c for _, _, c in inputs[-1][0]])
    assert ok, message


def test_generate_input_is_deterministic_on_cuda():
    case = TEST_CASES[8].args
    first, again = generate_input(**case), generate_input(**case)
    assert first[0][0][0].is_cuda
    assert all(torch.equal(_bytes(x), _bytes(y)) for x, y in zip(_all_tensors(first), _all_tensors(again)))
    other = generate_input(**dict(case, seed=case["seed"] + 1))
    assert not torch.equal(_bytes(first[0][0][0]), _bytes(other[0][0][0]))


LEADERBOARD_DIR = os.environ.get("LEADERBOARD_REFERENCE_DIR")


@pytest.mark.skipif(not LEADERBOARD_DIR, reason="set LEADERBOARD_REFERENCE_DIR to a copy of the "
                    "leaderboard's reference.py and utils.py to compare bit for bit")
@pytest.mark.parametrize("case", TEST_CASES + BENCHMARK_CASES, ids=lambda c: c.spec)
def test_generate_input_is_the_leaderboards_bit_for_bit(case):
    sys.path.insert(0, LEADERBOARD_DIR)
    try:
        spec = importlib.util.spec_from_file_location(
            "leaderboard_reference", os.path.join(LEADERBOARD_DIR, "reference.py"))
        theirs_module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(theirs_module)
    finally:
        sys.path.remove(LEADERBOARD_DIR)
    ours = generate_input(**case.args)
    theirs = theirs_module.generate_input(**case.args)
    assert ours[3] == theirs[3]
    for x, y in zip(_all_tensors(ours), _all_tensors(theirs)):
        assert x.shape == y.shape and x.stride() == y.stride() and x.dtype == y.dtype
        assert x.device == y.device
        assert torch.equal(_bytes(x), _bytes(y))


@needs_b200
@pytest.mark.parametrize("case", BENCHMARK_CASES, ids=lambda c: c.spec)
def test_b200_kernel_on_benchmark_shapes(case):
    run_and_check(generate_input(**case.args))


def run_config_and_check(data, config, launcher=None):
    """`config` forced on `data` (every output element poisoned first), checked against the reference."""
    for _, _, c in data[0]:
        c.fill_(float("nan"))
    output = (launcher or peers.run_b200)(data, config)
    torch.cuda.synchronize()
    ok, message = check_implementation(data, output)
    assert ok, f"{config.name}: {message}"


# every configuration (the model's) under every schedule
CANDIDATES = {c.name: c for c in submission.policy_candidates()}


@needs_b200
@pytest.mark.parametrize("config", list(CANDIDATES))
@pytest.mark.parametrize("case", TEST_CASES + BENCHMARK_CASES, ids=lambda c: c.spec)
def test_b200_every_configuration_on_every_test_and_benchmark_shape(case, config):
    run_config_and_check(generate_input(**case.args), CANDIDATES[config])


@needs_b200
@pytest.mark.parametrize("schedule", list(submission.SCHEDULES))
@pytest.mark.parametrize("m", [1, 40, 72, 129, 200, 257])
def test_b200_swapped_configuration_on_awkward_token_counts(m, schedule):
    """A' = weights, B' = tokens: M lands on the MMA's N side, partial token tiles and C^T's column-major stores."""
    config = CANDIDATES[f"swap-128x256/{schedule}"]
    run_config_and_check(generate_input((m, 3 * m % 500 + 1), (256, 512), (512, 256), 2, seed=m), config)


class FewCtasLauncher(submission.GroupedGemmLauncher):
    """The B200 launcher as if the GPU had `SMS` SMs: a grid of that many CTAs at most."""
    SMS = 1

    @classmethod
    def num_sms(cls, device_index: int) -> int:
        return cls.SMS


def many_small_groups(seed: int):
    """24 groups of 1-130 tokens, N = 128, K 256 or 512: every tile a group change."""
    g = 24
    return generate_input(tuple(1 + 37 * i % 130 for i in range(g)), (128,) * g, (256, 512) * (g // 2), g, seed=seed)


def run_on_one_and_two_units(data, config, monkeypatch):
    """`config` on `data` with a grid of 1, then 2 CTAs (pairs for cta_group 2)."""
    for units in (1, 2):
        monkeypatch.setattr(FewCtasLauncher, "SMS", units * config.cta_group)
        run_config_and_check(data, config, FewCtasLauncher(config=config))


@needs_b200
@pytest.mark.parametrize("sms", [1, 2])
@pytest.mark.parametrize("config", list(CANDIDATES))
def test_b200_one_or_two_ctas_over_many_small_groups(config, sms, monkeypatch):
    """Every tile a group change: each CTA fetches new descriptors for each of its tiles, all through its
    pipelines without a pause (a race between a descriptor's update and its use in a 2-CTA grouped GEMM, one
    reported publicly in this kernel family (docs/contract.md), would show here first)."""
    monkeypatch.setattr(FewCtasLauncher, "SMS", sms)
    run_config_and_check(many_small_groups(seed=sms), CANDIDATES[config], FewCtasLauncher())


@needs_hopper
@pytest.mark.parametrize("schedule", list(submission.SCHEDULES))
def test_hopper_kernel_under_every_schedule(schedule, monkeypatch):
    """The scheduler both kernels share, under each schedule, on the Hopper kernel: every test shape, one
    benchmark, and 1-2 CTAs over many small groups."""
    hopper_policy = importlib.import_module("nvfp4_group_gemm.hopper_policy")
    config = hopper_policy.config_from_setting(f"/{schedule}")
    launcher = submission.GroupedGemmLauncher(config=config)
    for case in TEST_CASES + BENCHMARK_CASES[3:]:
        run_config_and_check(generate_input(**case.args), config, launcher)
    run_on_one_and_two_units(many_small_groups(seed=5), config, monkeypatch)


@needs_hopper
@pytest.mark.parametrize("name", list(importlib.import_module("nvfp4_group_gemm.hopper").SM90_CONFIGS))
def test_every_hopper_form_on_every_test_shape(name, monkeypatch):
    """Each form (those CONFIG_ENV names, `sm90_choice`'s or not) under its schedule per shape set: every
    test shape (N / 128 odd included: a pair's half past N), the last benchmark (all four:
    scripts/max_error.py, variants-device.sh EXACT=1), and 1-2 CTAs (or pairs) over many small groups."""
    hopper, hopper_policy = (importlib.import_module(f"nvfp4_group_gemm.{m}") for m in ("hopper", "hopper_policy"))
    form = hopper.SM90_CONFIGS[name]
    launcher = submission.GroupedGemmLauncher()
    sms = submission.sm_count(torch.cuda.current_device())
    for case in TEST_CASES + BENCHMARK_CASES[3:]:
        data = generate_input(**case.args)
        sizes = tuple(map(tuple, data[3]))
        run_config_and_check(data, form.with_schedule(hopper_policy.sm90_schedule(sizes, sms, form)), launcher)
    run_on_one_and_two_units(many_small_groups(seed=7), form, monkeypatch)


# ---- consecutive calls overlap (programmatic dependent launch), CUDA graphs, streams --------------------------
def kernel_path_or_skip():
    kernel_paths = (submission.PATH_B200, importlib.import_module("nvfp4_group_gemm.hopper_policy").PATH_HOPPER)
    if launch.code_path(torch.device("cuda")) not in kernel_paths:
        pytest.skip("the portable path is not launched with programmatic dependent launch")


def with_outputs_of(data, other):
    """`data` computing into `other`'s C tensors."""
    abc = [(a, b, c) for (a, b, _), (_, _, c) in zip(data[0], other[0])]
    return (abc, *data[1:])


def outputs(data):
    return [c for _, _, c in data[0]]


def test_back_to_back_calls_sharing_outputs_and_read_by_the_next_op():
    """Call 2 overwrites call 1's outputs, a torch op reads them in between, and call 2's tokens are written by
    a torch op just before it; no synchronization anywhere: each kernel touches memory only once the kernel
    before it has finished."""
    kernel_path_or_skip()
    ms, ns, ks = (40, 200, 129), (256, 384, 512), (512, 1536, 256)
    first = generate_input(ms, ns, ks, 3, seed=21)
    second = with_outputs_of(generate_input(ms, ns, ks, 3, seed=22), first)
    tokens = [a.clone() for a, _, _ in second[0]]
    submission.custom_kernel(first)  # plans built (cold calls)
    submission.custom_kernel(second)
    torch.cuda.synchronize()
    snapshots = []
    for _ in range(10):
        for a, _, _ in second[0]:
            _bytes(a).zero_()
        submission.custom_kernel(first)
        snapshots.append([c.clone() for c in outputs(first)])
        for (a, _, _), t in zip(second[0], tokens):
            _bytes(a).copy_(_bytes(t))
        submission.custom_kernel(second)
        snapshots.append([c.clone() for c in outputs(second)])
    torch.cuda.synchronize()
    for i, snapshot in enumerate(snapshots):
        ok, message = check_implementation(second if i % 2 else first, snapshot)
        assert ok, (i, message)


def test_two_streams_at_once_and_one_plan_on_two_streams():
    kernel_path_or_skip()
    inputs = [generate_input((64, 300), (256, 128), (1024, 512), 2, seed=s) for s in (31, 32)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    main = torch.cuda.current_stream()
    for _ in range(5):
        for data, stream in zip(inputs, streams):
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                for c in outputs(data):
                    c.fill_(float("nan"))
                submission.custom_kernel(data)
        for stream in streams:
            main.wait_stream(stream)
        for data in inputs:
            ok, message = check_implementation(data, outputs(data))
            assert ok, message
    # the first input's plan, now on the second stream (after the main stream's work)
    streams[1].wait_stream(main)
    with torch.cuda.stream(streams[1]):
        for c in outputs(inputs[0]):
            c.fill_(float("nan"))
        submission.custom_kernel(inputs[0])
    main.wait_stream(streams[1])
    ok, message = check_implementation(inputs[0], outputs(inputs[0]))
    assert ok, message


def test_a_warm_call_is_captured_in_a_cuda_graph_and_replays_on_new_values():
    """As MoE servers call grouped GEMMs: the same tensors, new contents, one graph replay per step."""
    kernel_path_or_skip()
    ms, ns, ks = (72, 256), (384, 256), (768, 512)
    data = generate_input(ms, ns, ks, 2, seed=41)
    submission.custom_kernel(data)  # the warm-up call
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        submission.custom_kernel(data)
    for seed in (42, 43):
        fresh = generate_input(ms, ns, ks, 2, seed=seed)
        for group, new in zip(data[0] + data[1] + data[2], fresh[0] + fresh[1] + fresh[2]):
            for t, n in zip(group, new):
                if t.dtype != torch.float16:  # everything but C
                    _bytes(t).copy_(_bytes(n))
        for c in outputs(data):
            c.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ok, message = check_implementation(data, outputs(data))
        assert ok, (seed, message)


def test_a_cold_call_during_graph_capture_says_to_warm_up_first():
    kernel_path_or_skip()
    data = generate_input((64,), (128,), (256,), 1, seed=51)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="call it once before capturing"):
        with torch.cuda.graph(graph):
            submission.custom_kernel(data)
    torch.cuda.synchronize()
    run_and_check(data)  # and the input still works outside a capture


def test_a_raw_capture_right_after_a_cold_call_replays_after_the_descriptors_are_built():
    """No synchronization between a cold call and a raw capture on another stream: the captured launch waits
    for the plan's builder through an external event-wait node, so a replay cannot read descriptors that are not
    written yet. The plan's own stream is held busy (~0.5 s) so that the builder is still queued when the graph
    is captured and replayed. (Before that wait, on an H100: an illegal instruction, the GEMM reading descriptors
    not yet written.)"""
    kernel_path_or_skip()
    data = generate_input((72, 200), (256, 384), (512, 768), 2, seed=61)
    submission.custom_kernel(generate_input((64,), (128,), (256,), 1, seed=62))  # compiles outside the test
    side = torch.cuda.Stream()
    warm_up_graph_capture(side)  # torch's first capture in a process waits for the device
    for c in outputs(data):
        c.fill_(float("nan"))
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)
    submission.custom_kernel(data)  # cold: builder and first GEMM queued behind the sleep
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        graph.capture_begin()
        submission.custom_kernel(data)
        # what the replay's GEMM wrote, copied in the graph right after it: NaN if it ran before the first GEMM
        snapshots = [c.clone() for c in outputs(data)]
        graph.capture_end()
        graph.replay()
    assert not torch.cuda.current_stream().query(), "the plan's stream was not busy: the test proves nothing"
    torch.cuda.synchronize()
    ok, message = check_implementation(data, snapshots)
    assert ok, message
    for c in outputs(data):  # and again, now that everything is complete
        c.fill_(float("nan"))
    with torch.cuda.stream(side):
        graph.replay()
    torch.cuda.synchronize()
    ok, message = check_implementation(data, outputs(data))
    assert ok, message


# ---- the MoE op (moe.grouped_mm_nvfp4) on the GPU -----------------------------------------------------------------
def moe_inputs(sizes, n=256, k=512, seed=0, global_scales=False):
    """The op's arguments for group sizes `sizes` (tests/test_moe.py's `routed`) on the GPU."""
    from test_moe import routed
    args, _ = routed(sizes, n=n, k=k, seed=seed, global_scales=global_scales)
    return {name: (v.cuda() if isinstance(v, torch.Tensor) else v) for name, v in args.items()}


def random_routing(experts: int, tokens: int, seed: int, empty_share: float = 0.25):
    """Group sizes summing to `tokens` over `experts`, about `empty_share` of the experts with no token."""
    gen = torch.Generator().manual_seed(seed)
    live = torch.rand(experts, generator=gen) >= empty_share
    if not live.any():
        live[0] = True
    choice = torch.multinomial(live.float(), tokens, replacement=True, generator=gen) if tokens else []
    return tuple(torch.bincount(torch.as_tensor(choice, dtype=torch.long), minlength=experts).tolist())


@pytest.mark.parametrize("experts,tokens", [(1, 300), (8, 1000), (64, 4096), (256, 16384), (8, 0), (300, 2000)])
def test_moe_op_under_random_routings(experts, tokens):
    """E in {1, 8, 64, 256}, T up to 16,384, a quarter of the experts empty, T = 0: equal to the CPU's result
    (bf16, no global scales: one rounding of fp32 sums on both); more experts than the Hopper form's tables
    hold (hopper.MOE_MAX_EXPERTS) there by the portable computation."""
    from nvfp4_group_gemm import moe
    sizes = random_routing(experts, tokens, seed=experts + tokens)
    args = moe_inputs(sizes, n=256, k=256)
    out = moe.grouped_mm_nvfp4(**args)
    cpu = moe.grouped_mm_nvfp4(**{n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in args.items()})
    assert out.shape == (tokens, 256)
    within_one_rounding(out, cpu)  # the Hopper kernel's sums run in another order


def test_moe_op_with_global_scales_on_the_gpu_within_one_rounding():
    """Per-expert global scales, bf16: within one bf16 rounding of the CPU's (the portable path on a GPU scales
    torch._grouped_mm's rounded output; the Hopper kernel scales its fp32 sums, in another order)."""
    from nvfp4_group_gemm import moe
    args = moe_inputs((72, 0, 129, 1), global_scales=True)
    out = moe.grouped_mm_nvfp4(**args).float().cpu()
    cpu = moe.grouped_mm_nvfp4(**{n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in args.items()})
    assert ((out - cpu.float()).abs() <= 2 ** -7 * cpu.float().abs()).all()


@pytest.mark.parametrize("sizes", [(72, 0, 129, 1), (0, 0, 300, 0), (0,) * 7 + (40,) + (3,) * 8],
                         ids=["mixed", "all on one expert", "a quarter empty or more"])
def test_moe_op_on_the_gpu_matches_the_cpu_and_never_synchronizes(sizes):
    from nvfp4_group_gemm import moe
    args = moe_inputs(sizes)
    expected = moe.grouped_mm_nvfp4(**{n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in args.items()})
    moe.grouped_mm_nvfp4(**args)  # warm-up: the decoding tables reach the GPU once
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    out = moe.grouped_mm_nvfp4(**args)
    assert not torch.cuda.current_stream().query(), "the op waited for the GPU (read offs on the host?)"
    within_one_rounding(out, expected)


# ---- the MoE op's kernel path (sm_90, sm_100): the GPU's kernel, the group sizes from offs on the device -------
def kernel_takes(args, validated: bool = False) -> bool:
    from nvfp4_group_gemm import moe
    a_global, b_global = args.get("a_global"), args.get("b_global")
    problem = moe.Problem(args["a"], args["b"], args["a_scale"], args["b_scale"], args["offs"], a_global, b_global,
                          torch.float16, None, validated=validated)
    out = torch.empty(problem.tokens, problem.n, dtype=torch.float16, device="cuda")
    return moe.kernel_forms(problem, args["a"], args["b_scale"], args["a_scale"], a_global, b_global,
                           out) is not None


def within_one_rounding(out, expected):
    """The kernel's fp32 sums run in another order than the CPU's: each may round to the other neighbour in the
    output's type (fp16: 11 significant bits, bf16: 8)."""
    ulp = 2 ** -10 if out.dtype == torch.float16 else 2 ** -7
    out, expected = out.float().cpu(), expected.float().cpu()
    assert ((out - expected).abs() <= ulp * expected.abs() + 2 ** -24).all(), (out - expected).abs().max()


@needs_hopper_or_b200
@pytest.mark.parametrize("experts,tokens", [(1, 300), (8, 1000), (64, 4096), (256, 16384), (8, 0), (16, 5)])
def test_moe_kernel_path_under_random_routings(experts, tokens):
    """E in {1, 8, 64, 256}, T up to 16,384, a quarter of the experts empty, T = 0: the kernel's result within
    one fp16 rounding of the CPU's, rows past the groups untouched."""
    from nvfp4_group_gemm import moe
    sizes = random_routing(experts, tokens, seed=experts + tokens)
    args = moe_inputs(sizes, n=256, k=256)
    args.update(a_global=None, b_global=None)
    assert tokens == 0 or kernel_takes(args)
    out = torch.full((tokens + 3, 256), float("nan"), dtype=torch.float16, device="cuda")[:tokens]
    moe.grouped_mm_nvfp4(**args, out=out)
    cpu = moe.grouped_mm_nvfp4(**{n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in args.items()},
                               out_dtype=torch.float16)
    assert out.shape == (tokens, 256)
    within_one_rounding(out, cpu)


@needs_hopper_or_b200
def test_moe_kernel_rows_past_the_last_group_are_not_written_and_all_tokens_on_one_expert():
    from nvfp4_group_gemm import moe
    args = moe_inputs((0, 0, 300, 0), n=384, k=512)
    args["offs"] = torch.tensor([0, 0, 250, 250], dtype=torch.int32, device="cuda")  # rows 250.. in no group
    out = torch.full((300, 384), float("nan"), dtype=torch.float16, device="cuda")
    moe.grouped_mm_nvfp4(**args, out=out, validate=True)
    cpu = moe.grouped_mm_nvfp4(**{n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in args.items()},
                               out_dtype=torch.float16)
    within_one_rounding(out[:250], cpu[:250])
    assert out[250:].isnan().all()


@needs_b200
@pytest.mark.parametrize("sizes", [(72, 0, 129, 1), (0,) * 7 + (40,) + (3,) * 8])
def test_moe_kernel_builder_writes_the_tables_the_host_would(sizes):
    """The B200 form's builder's tables (from offs on the device) word for word as moe.device_tables computes
    them, and the tile count after them (the Hopper form keeps its groups in each CTA's shared memory)."""
    from nvfp4_group_gemm import moe
    args = moe_inputs(sizes, n=256, k=512)
    args.update(a_global=None, b_global=None)
    out = moe.grouped_mm_nvfp4(**args, out_dtype=torch.float16)
    torch.cuda.synchronize()
    problem = moe.Problem(args["a"], args["b"], args["a_scale"], args["b_scale"], args["offs"], None, None,
                          torch.float16, out)
    configs = moe.kernel_forms(problem, args["a"], args["b_scale"], args["a_scale"], None, None, out)
    plan = next(p for key, p in moe._kernel_plans.plans.items()
                if key[2:] == (configs.names, len(sizes), 256, 512, moe.token_capacity(sum(sizes))))
    config, = configs
    words = moe.device_tables(problem, args["a"], args["a_scale"], args["b_scale"], args["offs"], out)
    assert torch.equal(plan.tables[:len(words)], words)
    assert int(plan.tables[len(words)]) & 0xFFFFFFFF == submission.tile_count([(m, 256, 512, 1) for m in sizes if m],
                                                                                config)


@needs_hopper_or_b200
def test_moe_kernel_path_never_synchronizes():
    from nvfp4_group_gemm import moe
    args = moe_inputs((72, 0, 129, 1))
    args.update(a_global=None, b_global=None)
    expected = moe.grouped_mm_nvfp4(**args, out_dtype=torch.float16)  # warm-up: compiles, plans
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    out = moe.grouped_mm_nvfp4(**args, out_dtype=torch.float16)
    assert not torch.cuda.current_stream().query(), "the op waited for the GPU (read offs on the host?)"
    assert torch.equal(out, expected)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_moe_op_replays_in_a_cuda_graph_under_new_routings(out_dtype):
    """Captured once; each replay takes new offs (experts going to and from zero rows) and new tokens: equal to
    the same call made outside the graph (the kernel path on sm_90 and sm_100, the portable one elsewhere)."""
    from nvfp4_group_gemm import moe
    first = moe_inputs((40, 0, 60, 28), seed=1)
    first.update(a_global=None, b_global=None)
    out = torch.empty(128, 256, dtype=out_dtype, device="cuda")
    moe.grouped_mm_nvfp4(**first, out=out)  # warm-up outside the capture: compiles, plans
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        moe.grouped_mm_nvfp4(**first, out=out)
    for seed, sizes in enumerate(((0, 128, 0, 0), (1, 1, 1, 125), (40, 0, 60, 28)), start=2):
        routing = moe_inputs(sizes, seed=seed)
        for name in ("a", "a_scale", "offs"):
            first[name].copy_(routing[name])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        expected = moe.grouped_mm_nvfp4(**first, out_dtype=out_dtype)
        assert torch.equal(out, expected), sizes


@needs_hopper_or_b200
def test_moe_kernel_first_called_inside_a_capture_then_outside_it_on_that_stream():
    """The op's first call on a stream inside a capture (its plan made there), then a call outside the capture on
    that stream before any replay, then the replay: each within one fp16 rounding of the CPU's result."""
    from nvfp4_group_gemm import moe
    args = moe_inputs((0, 130, 5, 60), n=384, k=256, seed=5)
    args.update(a_global=None, b_global=None)
    cpu = moe.grouped_mm_nvfp4(**{n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in args.items()},
                               out_dtype=torch.float16)
    stream = torch.cuda.Stream()
    out = torch.full((195, 384), float("nan"), dtype=torch.float16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        moe.grouped_mm_nvfp4(**args, out=out)
    with torch.cuda.stream(stream):
        eager = moe.grouped_mm_nvfp4(**args, out_dtype=torch.float16)
    torch.cuda.synchronize()
    within_one_rounding(eager, cpu)
    graph.replay()
    torch.cuda.synchronize()
    within_one_rounding(out, cpu)


@needs_hopper_or_b200
def test_moe_kernel_under_torch_compile_fullgraph():
    """A toy MoE block (route, sort, quantize outside; the op; un-sort) compiled whole-graph."""
    from nvfp4_group_gemm import moe
    args = moe_inputs((72, 0, 129, 1))
    args.update(a_global=None, b_global=None)

    class Block(torch.nn.Module):
        def forward(self, a, b, a_scale, b_scale, offs):
            y = moe.grouped_mm_nvfp4(a, b, a_scale, b_scale, offs, out_dtype=torch.float16)
            return y.float().relu()
    block = Block()
    plain = block(args["a"], args["b"], args["a_scale"], args["b_scale"], args["offs"])
    compiled = torch.compile(block, fullgraph=True)
    got = compiled(args["a"], args["b"], args["a_scale"], args["b_scale"], args["offs"])
    assert torch.equal(got, plain)


@needs_hopper
@pytest.mark.parametrize("name", list(importlib.import_module("nvfp4_group_gemm.hopper").SM90_MOE_CONFIGS))
@pytest.mark.parametrize("contiguous", [False, True])
def test_moe_every_hopper_form_under_a_routing_with_empty_experts(name, contiguous):
    """Each form `hopper_policy.moe_choice` may pick, under both compiled schedules, on a routing with empty experts,
    a group of one row and groups past one tile."""
    from nvfp4_group_gemm import hopper, moe
    config = hopper.SM90_MOE_CONFIGS[name].with_schedule(submission.Schedule(contiguous=contiguous))
    sizes = (0, 200, 1, 0, 64, 129, 0, 300)
    args = moe_inputs(sizes, n=384, k=512)
    args.update(a_global=None, b_global=None)
    problem = moe.Problem(args["a"], args["b"], args["a_scale"], args["b_scale"], args["offs"], None, None,
                          torch.float16, None)
    out = torch.full((sum(sizes), 384), float("nan"), dtype=torch.float16, device="cuda")
    moe.run_kernel((config,), problem, args["a"], args["a_scale"], args["b_scale"], args["offs"], out)
    cpu = moe.grouped_mm_nvfp4(**{n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in args.items()},
                               out_dtype=torch.float16)
    within_one_rounding(out, cpu)


@needs_hopper
def test_moe_two_forms_per_call_the_device_runs_the_one_its_rule_names():
    """hopper_policy.moe_forms' two launches per call (the 192-token pair, then the default form), on a routing whose
    default-form tiles fit the default form's grid in one wave (rows multiples of 128) and on one whose tiles do
    not: within one rounding of the CPU's. Each launch alone under its rule computes the calls the rule gives
    it and leaves `out` untouched on the others."""
    from nvfp4_group_gemm import hopper, hopper_policy, moe, submission
    forms = (hopper.SM90_MOE_CONFIGS["sm90-192x256-k64-wr-pair-offs"],
             hopper.SM90_MOE_CONFIGS["sm90-128x128-k128-wr-n16-64-offs"])
    n, k, tokens = 1024, 256, 2048
    one_wave = hopper_policy.moe_one_wave_ctas(moe.token_capacity(tokens), 4, n, submission.sm_count(0))
    for sizes, fits in (((512, 512, 768, 256), True), ((500, 530, 770, 248), False)):
        default_tiles = sum(submission.ceil_div(m, 128) for m in sizes) * n // 128
        assert (default_tiles <= one_wave) == fits, (sizes, default_tiles, one_wave)  # the routings' premise
        args = moe_inputs(sizes, n=n, k=k)
        args.update(a_global=None, b_global=None)
        problem = moe.Problem(args["a"], args["b"], args["a_scale"], args["b_scale"], args["offs"], None, None,
                              torch.float16, None)
        cpu = moe.grouped_mm_nvfp4(**{name: (v.cpu() if isinstance(v, torch.Tensor) else v)
                                      for name, v in args.items()}, out_dtype=torch.float16)
        out = torch.full((tokens, n), float("nan"), dtype=torch.float16, device="cuda")
        moe.run_kernel(forms, problem, args["a"], args["a_scale"], args["b_scale"], args["offs"], out)
        within_one_rounding(out, cpu)
        stream = submission.current_stream_handle(0)
        for form, rule in zip(forms, hopper_policy.MOE_TWO_FORM_RULES):
            plan = moe.KernelPlan((form,), 0, stream, 4, n, k, moe.token_capacity(tokens), rules=(rule,))
            assert plan.one_wave_ctas == one_wave
            out = torch.full((tokens, n), float("nan"), dtype=torch.float16, device="cuda")
            plan.launch(args["a"], args["b"], args["a_scale"], args["b_scale"], args["offs"], out)
            torch.cuda.synchronize()
            if (rule == hopper.MOE_IN_ONE_WAVE) == fits:
                within_one_rounding(out, cpu)
            else:
                assert out.isnan().all(), (form.name, sizes)


@needs_hopper_or_b200
def test_moe_kernel_with_malformed_offs_stays_inside_its_tensors():
    """offs that break the caller's promise (decreasing, past T) give some rows, never a fault or a write outside
    out: the builder ends each group at the running maximum of the ends, at most T."""
    from nvfp4_group_gemm import moe
    args = moe_inputs((100, 50, 80, 70), n=256, k=256)
    args.update(a_global=None, b_global=None)
    buffer = torch.full((300 + 64, 256), float("nan"), dtype=torch.float16, device="cuda")
    out = buffer[:300]
    for bad in ([100, 50, 200, 250], [0, 400, 10, 900], [300, 300, 299, 1 << 30]):
        args["offs"] = torch.tensor(bad, dtype=torch.int32, device="cuda")
        moe.grouped_mm_nvfp4(**args, out=out)
        torch.cuda.synchronize()
        assert buffer[300:].isnan().all(), bad


@needs_hopper_or_b200
@pytest.mark.parametrize("rows", [0, 1024], ids=["the blocks alone (torch's tests)", "padded past the worst case"])
def test_moe_kernel_reads_scale_buffers_as_laid_out_by_torch_and_by_stacked_quantizers(rows):
    """rows=0: each group's block and nothing after (P_E rows: validate=True checks the routing fits); 1024: more
    than the worst case, as stacked quantizers pad. The kernel reads group g's SFA from row P_g either way."""
    from nvfp4_group_gemm import moe
    from test_moe import routed
    args, _ = routed((40, 0, 200, 17), n=256, k=512, rows=rows)
    args = {name: (v.cuda() if isinstance(v, torch.Tensor) else v) for name, v in args.items()}
    cpu = moe.grouped_mm_nvfp4(**{n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in args.items()},
                               out_dtype=torch.float16, validate=True)
    assert kernel_takes(args, validated=True)
    out = moe.grouped_mm_nvfp4(**args, out_dtype=torch.float16, validate=True)
    within_one_rounding(out, cpu)


@needs_hopper_or_b200
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("per_expert_a", [False, True])
def test_moe_kernel_applies_global_scales_before_its_one_rounding(out_dtype, per_expert_a):
    """a_global () or (E,), b_global (E,): alpha_g multiplies the fp32 sums, then one rounding to fp16 or bf16;
    within one rounding of the CPU's (fp32 sums times alpha, rounded once)."""
    from nvfp4_group_gemm import moe
    args = moe_inputs((72, 0, 129, 1, 300), n=256, k=512, global_scales=True)
    if per_expert_a:
        args["a_global"] = torch.tensor([0.5, 2.0, 0.25, 1.5, 0.75], device="cuda")
    assert kernel_takes(args)
    out = moe.grouped_mm_nvfp4(**args, out_dtype=out_dtype)
    cpu = moe.grouped_mm_nvfp4(**{n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in args.items()},
                               out_dtype=out_dtype)
    within_one_rounding(out, cpu)


@needs_hopper_or_b200
def test_moe_kernel_takes_vllms_expert_offsets_view():
    """offs = expert_offsets[1:], 4 bytes past its storage's start: the builder reads it as an int32 array."""
    from nvfp4_group_gemm import moe
    args = moe_inputs((72, 0, 129, 1))
    args.update(a_global=None, b_global=None)
    expert_offsets = torch.cat((torch.zeros(1, dtype=torch.int32, device="cuda"), args["offs"]))
    expected = moe.grouped_mm_nvfp4(**args, out_dtype=torch.float16)
    got = moe.grouped_mm_nvfp4(**{**args, "offs": expert_offsets[1:]}, out_dtype=torch.float16)
    assert torch.equal(got, expected)


@needs_hopper_or_b200
def test_the_expert_mlp_runs_the_kernels_and_replays_under_new_routings():
    """moe_mlp_nvfp4 on the GPU: both GEMMs on the kernels, near the bf16 MLP (two roundings of the activations
    to NVFP4), and a CUDA graph captured on one routing replayed under three, each equal to an eager call."""
    from nvfp4_group_gemm import mlp, mlp_report, moe
    device = torch.device("cuda")
    experts = mlp_report.make_experts(4, 512, 256, device)
    x, offs = mlp_report.top2_routing(600, 4, 512, device, seed=0)
    x_global, h_global = mlp_report.activation_scales(x, offs, experts)
    out = mlp.moe_mlp_nvfp4(x, offs, experts.w13, experts.w13_scale, experts.w2, experts.w2_scale,
                            w13_global=experts.w13_global, w2_global=experts.w2_global, x_global=x_global,
                            h_global=h_global)
    want = mlp_report.bf16_mlp(x, offs, experts).float()
    assert float((out.float() - want).norm() / want.norm()) < 0.25
    a, a_scale = mlp.quantize_tokens_device(x, offs, x_global)  # the first GEMM's operands: a kernel takes them
    problem = moe.Problem(a, experts.w13, a_scale, experts.w13_scale, offs, x_global, experts.w13_global,
                          torch.bfloat16, None)
    assert moe.kernel_forms(problem, a, experts.w13_scale, a_scale, x_global, experts.w13_global,
                            problem.new_output()) is not None
    assert mlp_report.replays_follow_new_routings(experts, 4, 512, device, gpu=True)


# token_quantizer.PAIRED, THRESHOLD_TABLE (which takes one decode scale or none) and LEAN_LOOP (not yet timed)
QUANTIZER_CONFIGURATIONS = {"value by value": (False, False, False), "paired": (True, False, False),
                            "paired, threshold table": (True, True, False),
                            "value by value, lean loop": (False, False, True), "paired, lean loop": (True, False, True),
                            "paired, threshold table, lean loop": (True, True, True)}


@needs_hopper_or_b200
@pytest.mark.parametrize("configuration", QUANTIZER_CONFIGURATIONS)
@pytest.mark.parametrize("scale", [None, "one", "per expert"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sizes", [(300,), (0, 129, 0, 7, 260, 1), (0, 0, 0), (5, 0, 64), (1,) * 40],
                         ids=["one expert", "empty experts", "no token", "rows past offs[-1]", "40 experts"])
def test_the_token_quantizer_kernel_is_the_torch_recipe_bit_for_bit(sizes, dtype, scale, configuration,
                                                                    monkeypatch):
    """mlp.quantize_tokens_device on the GPU runs token_quantizer.py's kernel, in each configuration
    (token_quantizer.PAIRED, THRESHOLD_TABLE, LEAN_LOOP): the same packed codes and the same blocked scale bytes
    (padding zero) as the torch composition on the CPU, for blocks of zeros, of -0, of values past 448 x 6, of
    tiny values and on E2M1's ties; rows past offs[-1] quantized, their scales not stored."""
    from nvfp4_group_gemm import mlp, token_quantizer
    paired, table, lean = QUANTIZER_CONFIGURATIONS[configuration]
    monkeypatch.setattr(token_quantizer, "PAIRED", paired)
    monkeypatch.setattr(token_quantizer, "THRESHOLD_TABLE", table)
    monkeypatch.setattr(token_quantizer, "LEAN_LOOP", lean)
    gen = torch.Generator().manual_seed(len(sizes))
    tokens, k, experts = sum(sizes) + (9 if sizes == (5, 0, 64) else 0), 192, len(sizes)
    x = torch.randn(tokens, k, generator=gen) * torch.logspace(-3, 3, tokens).view(-1, 1)
    if tokens > 4:
        x[0, :16], x[1, 16:32], x[2, :16], x[3, 32:48] = 0.0, -0.0, 5000.0, 1e-30
        x[4, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2) * torch.tensor([1.0, -1.0]).repeat(8)
    x = x.to(dtype)
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)
    global_scale = {None: None, "one": torch.tensor(0.37), "per expert": torch.rand(experts, generator=gen) + 0.1}[
        scale]
    cuda = lambda t: None if t is None else t.cuda()
    assert token_quantizer.runs_on(x.cuda(), offs.cuda(), cuda(global_scale))
    packed, blocked = mlp.quantize_tokens_device(x.cuda(), offs.cuda(), cuda(global_scale))
    rows = mlp.worst_case_scale_rows(tokens, experts)
    want_packed, want_blocked = mlp.quantize_tokens_torch(x, offs, global_scale, rows)
    assert torch.equal(packed.cpu(), want_packed)
    assert torch.equal(blocked.cpu().view(torch.uint8), want_blocked.view(torch.uint8))


@needs_hopper_or_b200
@pytest.mark.parametrize("configuration", QUANTIZER_CONFIGURATIONS)
def test_the_token_quantizer_on_a_small_grid_takes_many_blocks_a_thread(configuration, monkeypatch):
    """The grid as on a GPU of one SM (a few CTAs), so that each thread quantizes many blocks in turn (its loads
    a block ahead, in the paired configuration, and past the last block not, or the last again with a lean loop;
    a thread's group changing between its blocks): the same bytes as the torch composition (per-expert decode
    scales; one with the threshold table)."""
    from nvfp4_group_gemm import mlp, submission, token_quantizer
    paired, table, lean = QUANTIZER_CONFIGURATIONS[configuration]
    monkeypatch.setattr(token_quantizer, "PAIRED", paired)
    monkeypatch.setattr(token_quantizer, "THRESHOLD_TABLE", table)
    monkeypatch.setattr(token_quantizer, "LEAN_LOOP", lean)
    monkeypatch.setattr(submission, "sm_count", lambda index: 1)
    gen = torch.Generator().manual_seed(3)
    sizes = (700, 0, 333, 1024, 17)
    x = (torch.randn(sum(sizes) + 5, 512, generator=gen) * 3).to(torch.bfloat16)
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    scale = torch.rand(1 if table else len(sizes), generator=gen) + 0.1
    packed, blocked = mlp.quantize_tokens_device(x.cuda(), offs.cuda(), scale.cuda())
    want_packed, want_blocked = mlp.quantize_tokens_torch(x, offs, scale, mlp.worst_case_scale_rows(x.shape[0], 5))
    assert torch.equal(packed.cpu(), want_packed)
    assert torch.equal(blocked.cpu().view(torch.uint8), want_blocked.view(torch.uint8))


@needs_hopper_or_b200
def test_the_token_quantizer_kernel_takes_offs_as_int64_or_a_strided_view():
    """offs as int64, or every other element of a longer tensor: the kernel reads it as an int32 array (a copy
    where it is not one), the same bytes as contiguous int32 offs."""
    from nvfp4_group_gemm import mlp
    x = torch.randn(300, 256, device="cuda").to(torch.bfloat16)
    offs = torch.tensor([100, 100, 300], dtype=torch.int32, device="cuda")
    strided = torch.stack((offs, torch.zeros_like(offs)), dim=1).reshape(-1)[0::2]
    assert strided.stride(0) == 2
    want = mlp.quantize_tokens_device(x, offs)
    for other in (offs.long(), strided):
        got = mlp.quantize_tokens_device(x, other)
        assert all(torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in zip(got, want))


@needs_hopper_or_b200
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (1.702, 1.0), (0.5, -1.0)],
                         ids=["silu", "gpt-oss", "negative-beta"])
@pytest.mark.parametrize("layout,limit", [("halves", None), ("interleaved", None), ("interleaved", 7.0)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("configuration", QUANTIZER_CONFIGURATIONS)
def test_the_swiglu_quantizer_kernel_is_torchs_steps_bit_for_bit(configuration, dtype, layout, limit, alpha, beta,
                                                                 monkeypatch):
    """mlp.swiglu_quantized on the GPU runs one kernel (SwiGLU as the quantizer loads h), in each configuration
    (token_quantizer.PAIRED, THRESHOLD_TABLE, LEAN_LOOP): the same bytes as torch's ops on the GPU (mlp.swiglu,
    then the torch quantizer composition), per-expert decode scales (one with the threshold table), empty experts
    and rows past offs[-1]."""
    from nvfp4_group_gemm import mlp, token_quantizer
    paired, table, lean = QUANTIZER_CONFIGURATIONS[configuration]
    monkeypatch.setattr(token_quantizer, "PAIRED", paired)
    monkeypatch.setattr(token_quantizer, "THRESHOLD_TABLE", table)
    monkeypatch.setattr(token_quantizer, "LEAN_LOOP", lean)
    gen = torch.Generator().manual_seed(5)
    sizes, inter = (0, 129, 0, 7, 160, 4), 192
    tokens = sum(sizes) + 3
    h = (torch.randn(tokens, 2 * inter, generator=gen) * 4).to(dtype).cuda()
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32).cuda()
    scale = (torch.rand(1 if table else len(sizes), generator=gen) + 0.1).cuda()
    assert token_quantizer.runs_on(h, offs, scale, swiglu=True)
    packed, blocked = mlp.swiglu_quantized(h, offs, scale, layout, alpha, beta, limit)
    rows = mlp.worst_case_scale_rows(tokens, len(sizes))
    want_packed, want_blocked = mlp.quantize_tokens_torch(mlp.swiglu(h, layout, alpha, beta, limit), offs, scale, rows)
    wrong = int((packed != want_packed).sum()), int((blocked.view(torch.uint8) != want_blocked.view(torch.uint8)).sum())
    assert wrong == (0, 0), f"bytes differing (codes, scales): {wrong}"
