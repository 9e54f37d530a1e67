"""The B200 host path's plan cache: never stale, bounded, validated once per input.

On the CPU the launcher runs as a subclass with a recording stand-in for
LaunchPlan and an SM count for CPU tensors (no CUDA needed); on a CUDA GPU the
real LaunchPlan launches a stand-in kernel with the B200 kernel's parameters
that records the arguments it received."""
import ctypes
import dataclasses
import gc
import time

import pytest
import torch

from nvfp4_group_gemm import submission
from conftest import needs_cuda
from nvfp4_group_gemm.reference import generate_input


CPU_STREAM = 0  # what the CPU launcher's plans file their launch under


class RecordingPlan:
    """What LaunchPlan receives, without a GPU: the table words it would copy."""
    built = []

    def __init__(self, words, shape, compiled, device_index, owner):
        self.words, self.shape = words, shape
        self.launches = 0
        self.released = False
        self.captured = False
        self.device_index = device_index
        self.launch_by_stream = {CPU_STREAM: self.launch}
        RecordingPlan.built.append(self)

    def launch(self):
        self.launches += 1

    def release(self):
        self.released = True


class CpuLauncher(submission.GroupedGemmLauncher):
    """The launcher on CPU tensors: recording plans, and a B200's SM count
    for device index -1 (the real launcher refuses CPU tensors there)."""
    plan_class = RecordingPlan

    @staticmethod
    def num_sms(device_index):
        return submission.SM100_SM_COUNT


@pytest.fixture
def cpu_launcher(monkeypatch):
    """A factory of CPU launchers; `validated` counts calls of the full
    validation, which only inputs not exactly in the leaderboard's layout reach."""
    validated, check = [], submission.validate_input

    def validate(data):
        validated.append(1)
        check(data, devices=False)
    monkeypatch.setattr(submission, "validate_input", validate)
    monkeypatch.setattr(submission, "current_stream_handle", lambda device_index: CPU_STREAM)

    def make_launcher(**kwargs):
        RecordingPlan.built = []
        validated.clear()
        return CpuLauncher(compile_fn=lambda config: submission.CompiledGemm(None, {}), **kwargs), validated
    return make_launcher


def make(ms, seed=1):
    g = len(ms)
    return generate_input(ms, (256,) * g, (512,) * g, g, seed=seed, device="cpu")


def table_words(data, config):
    """The table words of a valid CPU input under `config` (the layout's own computation)."""
    shape = submission.shape_plan(tuple(map(tuple, data[3])), -1, submission.SM100_SM_COUNT, config)
    return submission.gather_tables(data, shape, check=False)


def expected_words(data):
    return table_words(data, submission.choose_config(data[3]))


def test_reused_inputs_reuse_their_plan_and_are_checked_once(cpu_launcher):
    launcher, validated = cpu_launcher()
    inputs = [make((64, 200), seed=s) for s in range(3)]
    for _ in range(4):
        for data in inputs:
            out = launcher(data)
            assert [o.data_ptr() for o in out] == [c.data_ptr() for _, _, c in data[0]]
    assert len(RecordingPlan.built) == 3
    assert len(validated) == 0  # the leaderboard's layout: the one-pass check accepted them
    assert [p.launches for p in RecordingPlan.built] == [4, 4, 4]  # C recomputed every call
    assert [p.words for p in RecordingPlan.built] == [expected_words(d) for d in inputs]


def test_freed_inputs_drop_their_plan_even_at_reused_addresses(cpu_launcher):
    launcher, _ = cpu_launcher()
    data = make((64, 200))
    launcher(data)
    assert len(launcher.plans) == 1
    first = RecordingPlan.built[0]
    del data
    gc.collect()
    assert len(launcher.plans) == 0 and first.released  # its tensors died: the plan went with them
    for ms in [(128, 40, 300), (64,), (1, 1024)]:  # other shapes, likely at reused addresses
        data = make(ms, seed=len(ms))
        launcher(data)
        plan = launcher.plans[submission.input_key(data)]
        assert plan.words == expected_words(data)
        del data, plan
        gc.collect()


def test_cloned_inputs_get_their_own_plan(cpu_launcher):
    launcher, validated = cpu_launcher()
    data = make((64, 200))
    clone = tuple([tuple(t.clone() for t in g) for g in part] if i < 3 else list(part)
                  for i, part in enumerate(data))
    launcher(data)
    launcher(clone)
    assert len(RecordingPlan.built) == 2 and len(validated) == 0
    assert RecordingPlan.built[0].words != RecordingPlan.built[1].words  # other addresses
    assert RecordingPlan.built[1].words == expected_words(clone)


def test_a_group_list_that_changes_length_is_another_input(cpu_launcher):
    launcher, _ = cpu_launcher()
    data = make((64, 200, 96))
    shorter = tuple(part[:2] for part in data)
    launcher(data)
    launcher(shorter)
    assert len(RecordingPlan.built) == 2
    assert RecordingPlan.built[1].words == expected_words(shorter)


def test_a_replaced_tensor_is_another_input(cpu_launcher):
    launcher, _ = cpu_launcher()
    data = make((64, 200))
    launcher(data)
    a, b, c = data[0][1]
    data[0][1] = (a, b, c.clone())  # same list object, new C
    launcher(data)
    assert len(RecordingPlan.built) == 2
    assert RecordingPlan.built[1].words == expected_words(data)


def test_the_cache_is_bounded(cpu_launcher):
    launcher, _ = cpu_launcher(max_plans=4)
    inputs = [make((64,), seed=s) for s in range(7)]
    for data in inputs:
        launcher(data)
    assert len(launcher.plans) == 4
    assert list(launcher.plans) == [submission.input_key(d) for d in inputs[3:]]
    assert [p.released for p in RecordingPlan.built] == [True] * 3 + [False] * 4


def test_bad_input_is_rejected_before_any_plan(cpu_launcher):
    launcher, _ = cpu_launcher()
    data = make((64, 200))
    bad = (data[0], data[1], data[2], [(64, 256, 384, 1), data[3][1]])
    with pytest.raises(ValueError, match="group 0: K=384"):
        launcher(bad)
    assert not launcher.plans and not RecordingPlan.built


def mutations(data):
    """(what, bad input, the message validate_input gives) for inputs that
    differ from the leaderboard's layout in one way."""
    (a, b, c), rest = data[0][0], data[0][1:]
    sfa, sfb = data[2][0]

    def with_group0(abc=None, sf=None):
        return ([abc or (a, b, c)] + rest, data[1], [sf or (sfa, sfb)] + data[2][1:], data[3])
    wide = torch.empty(a.shape[0], a.shape[1] + 8, 1, dtype=a.dtype)[:, :a.shape[1]]
    shifted = torch.empty(c.numel() + 8, dtype=c.dtype)[4:4 + c.numel()].view(c.shape)  # 8 bytes in
    return [
        ("dtype", with_group0(abc=(a, b, c.float())), "group 0: c has dtype torch.float32"),
        ("shape", with_group0(abc=(a, b, c[:-1])), "group 0: c has shape"),
        ("strides", with_group0(abc=(wide, b, c)), "group 0: a has strides"),
        ("alignment", with_group0(abc=(a, b, shifted)), "group 0: c is not 16-byte aligned"),
        ("not a tensor", with_group0(sf=(sfa, None)), "group 0: sfb_reordered is NoneType"),
        ("K", (data[0], data[1], data[2], [(64, 256, 384, 1)] + data[3][1:]), "group 0: K=384"),
        ("lengths", (data[0], data[1], data[2][:1], data[3]), "group lists disagree in length"),
    ]


@pytest.mark.parametrize("what", [m[0] for m in mutations(make((64, 200)))])
def test_the_one_pass_check_leaves_every_bad_input_to_validation(what, cpu_launcher):
    data = make((64, 200))
    _, bad, message = next(m for m in mutations(data) if m[0] == what)
    launcher, validated = cpu_launcher()
    with pytest.raises(ValueError, match=message):
        launcher(bad)
    assert len(validated) == 1 and not launcher.plans and not RecordingPlan.built


def test_an_input_validation_accepts_but_the_one_pass_check_does_not_is_served(cpu_launcher):
    # The stride of an extent-1 dimension is free: validate_input accepts it,
    # the one-pass check compares strides exactly and hands the input over.
    data = make((64, 200))
    a, b, c = data[0][0]
    odd = c.as_strided(c.shape, (c.stride(0), 1, 7))
    data[0][0] = (a, b, odd)
    launcher, validated = cpu_launcher()
    launcher(data)
    assert len(validated) == 1
    assert RecordingPlan.built[0].words == expected_words(data)


def test_table_layout():
    data = make((64, 200, 40))
    for config in submission.TILE_CONFIGS.values():
        words = table_words(data, config)
        abc_at, sf_at, sizes_at = submission.table_offsets(len(data[3]))
        assert (abc_at, sf_at, sizes_at) == (0, 10, 16)  # 16-byte aligned parts for G = 3
        for g, ((a, b, c), (sfa, sfb), size) in enumerate(zip(data[0], data[2], data[3])):
            first, second = (b, a) if config.swap_ab else (a, b)
            sf_first, sf_second = (sfb, sfa) if config.swap_ab else (sfa, sfb)
            assert words[3 * g: 3 * g + 3] == [first.data_ptr(), second.data_ptr(), c.data_ptr()]
            assert words[sf_at + 2 * g: sf_at + 2 * g + 2] == [sf_first.data_ptr(), sf_second.data_ptr()]
            mp, np_, k, l = submission.kernel_problem(size, config)
            low, high = words[sizes_at + 2 * g], words[sizes_at + 2 * g + 1]
            assert (low & 0xFFFFFFFF, low >> 32, high & 0xFFFFFFFF, high >> 32) == (mp, np_, k, l)


def test_groups_by_m_permutes_every_table_consistently():
    """Under `groups_by_m` the kernel's group i is the input's group `order[i]`, in every table alike."""
    data = make((64, 200, 40, 200))
    for config in submission.TILE_CONFIGS.values():
        by_m = dataclasses.replace(config, schedule=submission.Schedule(groups_by_m=True))
        shape = submission.shape_plan(tuple(map(tuple, data[3])), -1, submission.SM100_SM_COUNT, by_m)
        assert shape.order == (1, 3, 0, 2)  # descending M, ties in input order
        plain, permuted = table_words(data, config), table_words(data, by_m)
        _, sf_at, sizes_at = submission.table_offsets(4)
        for i, g in enumerate(shape.order):
            assert permuted[3 * i: 3 * i + 3] == plain[3 * g: 3 * g + 3]
            assert permuted[sf_at + 2 * i: sf_at + 2 * i + 2] == plain[sf_at + 2 * g: sf_at + 2 * g + 2]
            assert permuted[sizes_at + 2 * i: sizes_at + 2 * i + 2] == plain[sizes_at + 2 * g: sizes_at + 2 * g + 2]
        assert submission.shape_plan(tuple(map(tuple, data[3])), -1, 148, config).order == (0, 1, 2, 3)


@pytest.mark.parametrize("tiles,sms", [(352, 148), (148, 148), (149, 148), (5, 148), (10_000, 132), (1, 1)])
def test_every_schedule_gives_each_tile_to_one_cta(tiles, sms):
    for schedule in submission.SCHEDULES.values():
        ctas = submission.persistent_ctas(tiles, sms, schedule.balanced_ctas)
        taken = [t for cta in range(ctas) for t in submission.cta_tiles(cta, ctas, tiles, schedule)]
        assert sorted(taken) == list(range(tiles)), schedule.name
        counts = [len(submission.cta_tiles(cta, ctas, tiles, schedule)) for cta in range(ctas)]
        rounds = -(-tiles // min(tiles, sms))
        assert max(counts) == rounds and min(counts) >= rounds - 1 >= 0  # as many rounds as one CTA per SM
        assert 1 <= ctas <= min(tiles, sms)
        if schedule.contiguous:  # each CTA a run of consecutive tiles
            assert all(list(r) == list(range(r.start, r.stop)) for r in
                       (submission.cta_tiles(cta, ctas, tiles, schedule) for cta in range(ctas)))


def test_balanced_grids_are_smaller_where_the_last_round_is_short():
    assert submission.persistent_ctas(352, 148) == 148 and submission.persistent_ctas(352, 148, True) == 118
    assert submission.persistent_ctas(296, 148, True) == 148  # full rounds: nothing to even out
    assert submission.persistent_ctas(20, 148, True) == 20


def test_schedule_names_round_trip_and_unknown_names_are_refused():
    for schedule in submission.SCHEDULES.values():
        assert submission.Schedule.from_name(schedule.name) == schedule
    with pytest.raises(ValueError, match="unknown spiral"):
        submission.Schedule.from_name("contiguous+spiral")


def test_only_the_compiled_schedule_choice_is_part_of_the_compile_key():
    base = submission.TILE_CONFIGS["128x128"]
    host_only = base.with_schedule(submission.Schedule(balanced_ctas=True, groups_by_m=True))
    compiled = base.with_schedule(submission.Schedule(contiguous=True))
    assert host_only.compile_key == base.compile_key != compiled.compile_key


# ---- the host function's argument storage --------------------------------------
class FakeExecutionArgs:
    """Converts arguments the way a DSL release might: `widths` bytes per value."""

    def __init__(self, widths, drop_last=False):
        self.widths, self.drop_last, self.keep = widths, drop_last, []

    def generate_execution_args(self, args, kwargs):
        ptrs = [a._pointer for a in args[:4]]  # the DSL runtime pointer's address
        values = ptrs + [int(a) for a in args[4:8]] + [int(args[8])]  # counts, plan_ready, the stream
        if self.drop_last:
            values = values[:-1]
        converted = []
        for value, width in zip(values, self.widths):
            cell = ctypes.create_string_buffer((value % (1 << 8 * width)).to_bytes(width, "little"), 8)
            self.keep.append(cell)
            converted.append(ctypes.c_void_p(ctypes.addressof(cell)))
        return converted, self.keep


class FakeCompiled:
    def __init__(self, execution_args):
        self.execution_args = execution_args


def test_the_argument_layout_check_can_fail():
    spec = submission.GEMM_ARGUMENTS
    widths = spec.widths
    assert submission.argument_layout_matches(FakeCompiled(FakeExecutionArgs(widths)), spec)
    narrow = tuple(4 for _ in widths)  # pointers cut to 4 bytes
    assert not submission.argument_layout_matches(FakeCompiled(FakeExecutionArgs(narrow)), spec)
    assert not submission.argument_layout_matches(FakeCompiled(FakeExecutionArgs(widths, drop_last=True)), spec)
    assert not submission.argument_layout_matches(object(), spec)  # no execution_args at all

    class Release43:  # nvidia-cutlass-dsl 4.3 calls the converter args_spec
        args_spec = FakeExecutionArgs(widths)
    assert submission.argument_layout_matches(Release43(), spec)


def test_host_functions_take_their_arguments_by_name():
    """Each host function's arguments are its jit signature's names (less the stream), bound by name: a value
    the caller does not name is an error naming it, and values other functions take may come along."""
    import inspect
    from nvfp4_group_gemm import hopper, moe_tables
    for function, spec in ((submission.Sm100GroupedGemmKernel.__call__, submission.GEMM_ARGUMENTS),
                           (submission.DescriptorBuilder.build_tensormaps, submission.GEMM_ARGUMENTS),
                           (moe_tables.OffsetsBuilder.build_from_offsets, moe_tables.OFFSETS_BUILDER_ARGUMENTS),
                           (hopper.Sm90GroupedGemmKernel.moe_call, hopper.MOE_GEMM_ARGUMENTS),
                           (hopper.Sm90GroupedGemmKernel.__call__, submission.GEMM_ARGUMENTS)):
        names = [p for p in inspect.signature(function).parameters if p not in ("self", "stream")]
        assert list(spec.names) == names and len(spec.widths) == len(names) + 1
    spec = submission.GEMM_ARGUMENTS
    values = {name: i for i, name in enumerate(spec.names)}
    assert spec.ordered({**values, "ptr_offs": 99}) == tuple(range(len(spec.names)))
    del values["num_ctas"]
    with pytest.raises(ValueError, match="missing: num_ctas"):
        spec.ordered(values)
    from cutlass import cute

    def unknown(ptr_bytes: cute.Pointer, stream):
        pass
    with pytest.raises(TypeError, match="ptr_bytes"):  # a pointer parameter the table does not know
        submission.argument_spec(unknown)


def test_packed_host_arguments_point_at_their_values():
    values = (0x7F00_0000_1000, 0x7F00_0000_2000, 0x7F00_0000_3000, 0x7F00_0000_4400, 8, 300, 132, 1)
    stream, extras = 0x5A5A_0000, (0x1111, 0x2222)
    buffer, array = submission.pack_host_arguments(values, stream, extras)
    count = len(submission.GEMM_ARGUMENTS.widths)
    addresses = [ctypes.c_uint64.from_address(array + 8 * i).value for i in range(count + len(extras))]
    assert addresses[count:] == list(extras)
    for address, width, want in zip(addresses, submission.GEMM_ARGUMENTS.widths, values + (stream,)):
        cell = ctypes.c_uint32 if width == 4 else ctypes.c_uint64
        assert cell.from_address(address).value == want
    assert ctypes.addressof(buffer) <= min(addresses[:count]) and max(addresses[:count]) < array


# ---- on a CUDA GPU: the real LaunchPlan with the stand-in kernel ----------------
def recorded(launcher, data):
    """What the stand-in kernel (as builder and GEMM) wrote into the plan's
    memory: num_groups, tiles, CTAs, last K, last D' address, plan_ready."""
    torch.cuda.synchronize()
    return launcher.plans[submission.input_key(data)].memory[:6].tolist()


def expected_record(data, plan_ready=1):
    """plan_ready: 0 for the launch right after the builder (the cold call), else 1."""
    config = submission.choose_config(data[3])
    tiles = submission.tile_count(data[3], config)
    ctas = submission.persistent_ctas(tiles, torch.cuda.get_device_properties(0).multi_processor_count)
    return [len(data[3]), tiles, ctas, data[3][-1][2], data[0][-1][2].data_ptr(), plan_ready]


@needs_cuda
def test_gpu_launcher_arguments_arrive_and_survive_reallocation_and_streams():
    from nvfp4_group_gemm import hostbench
    launcher = submission.GroupedGemmLauncher(compile_fn=hostbench.standin_compile)
    data = generate_input((64, 200), (256, 512), (512, 256), 2, seed=3)
    launcher(data)
    assert recorded(launcher, data) == expected_record(data, plan_ready=0)
    launcher(data)  # warm: the tables and descriptors are known complete
    assert recorded(launcher, data) == expected_record(data, plan_ready=1)
    slot = launcher.plans[submission.input_key(data)].slot.data_ptr()
    del data
    gc.collect()
    for ms, ks in [((128, 40, 300), (256, 512, 768)), ((1,), (1024,))]:
        data = generate_input(ms, (128,) * len(ms), ks, len(ms), seed=5)
        launcher(data)
        assert recorded(launcher, data) == expected_record(data, plan_ready=0)
        assert launcher.plans[submission.input_key(data)].slot.data_ptr() == slot  # the freed slot, reused
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        launcher(data)  # same plan, another stream
        assert recorded(launcher, data) == expected_record(data)
    plan = launcher.plans[submission.input_key(data)]
    assert plan.used_on_other_stream
    del data, plan
    gc.collect()
    data = generate_input((64,), (128,), (256,), 1, seed=9)
    launcher(data)  # a slot read on two streams is not handed on
    assert launcher.plans[submission.input_key(data)].slot.data_ptr() != slot
    assert recorded(launcher, data) == expected_record(data, plan_ready=0)


def warm_up_graph_capture(stream):
    """A first CUDA graph capture in this process on `stream`: torch's first capture_begin waits for the whole
    device (seen on an H100: 505 ms behind a busy stream), later ones do not."""
    scratch = torch.zeros(1, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        scratch.add_(1)
        graph.capture_end()
    torch.cuda.synchronize()


@needs_cuda
@pytest.mark.parametrize("how", ["another stream", "raw capture on another stream"])
def test_gpu_launches_not_ordered_by_their_stream_wait_for_the_plans_first_launch(how):
    """The plan's own stream held busy (~0.5 s), a cold call queued behind it, then at once a launch on another
    stream, plain or captured with CUDAGraph.capture_begin and replayed: it runs after the builder and the
    first GEMM (the last write is its plan_ready 1), not before them."""
    from nvfp4_group_gemm import hostbench
    launcher = submission.GroupedGemmLauncher(compile_fn=hostbench.standin_compile)
    launcher(generate_input((64,), (128,), (256,), 1, seed=1))  # compiles outside the test
    data = generate_input((64, 200), (256, 512), (512, 256), 2, seed=3)
    side = torch.cuda.Stream()
    warm_up_graph_capture(side)
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)
    launcher(data)
    steps = [("start", time.perf_counter())]  # where the host spent its time, should it have waited
    with torch.cuda.stream(side):
        if how == "another stream":
            launcher(data)
        else:
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin()
            steps.append(("capture_begin", time.perf_counter()))
            launcher(data)
            steps.append(("launch", time.perf_counter()))
            graph.capture_end()
            steps.append(("capture_end", time.perf_counter()))
            graph.replay()
    steps.append(("replay", time.perf_counter()))
    spent = ", ".join(f"{name} {1e3 * (t - before):.1f} ms" for (_, before), (name, t) in zip(steps, steps[1:]))
    assert not torch.cuda.current_stream().query(), f"the plan's stream was not busy: proves nothing ({spent})"
    plan = launcher.plans[submission.input_key(data)]
    assert not plan.built_seen and side.cuda_stream not in plan.launch_by_stream
    assert recorded(launcher, data) == expected_record(data, plan_ready=1)
    with torch.cuda.stream(side):
        launcher(data)  # now seen complete: this stream's launch becomes its warm path, with no wait
    assert plan.built_seen and side.cuda_stream in plan.launch_by_stream


@needs_cuda
def test_gpu_a_launch_beside_another_streams_capture_does_not_break_it():
    """While torch.cuda.graph captures on its own stream, a launch of a plan not yet seen complete on another
    stream asks whether the builder is done: a query a global-mode capture forbids, made in relaxed mode."""
    from nvfp4_group_gemm import hostbench
    launcher = submission.GroupedGemmLauncher(compile_fn=hostbench.standin_compile)
    launcher(generate_input((64,), (128,), (256,), 1, seed=1))  # compiles outside the test
    data = generate_input((64, 200), (256, 512), (512, 256), 2, seed=3)
    scratch, other = torch.zeros(1, device="cuda"), torch.cuda.Stream()
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    launcher(data)  # cold, still queued: the next launch elsewhere queries its event
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        scratch.add_(1)
        with torch.cuda.stream(other):
            launcher(data)  # not captured: `other` is not the capturing stream
    graph.replay()
    torch.cuda.synchronize()
    assert scratch.item() == 1 and recorded(launcher, data) == expected_record(data, plan_ready=1)


@needs_cuda
def test_gpu_launcher_uses_the_direct_argument_path_where_the_release_allows():
    from nvfp4_group_gemm import hostbench
    compiled = hostbench.standin_compile(None).functions["gemm"][0]
    host = submission.HostFunction(compiled, submission.GEMM_ARGUMENTS, torch.cuda.current_device())
    assert (host.capi is not None) == submission.argument_layout_matches(compiled, submission.GEMM_ARGUMENTS)
    print("direct host arguments:", host.capi is not None)


def test_the_real_launcher_refuses_cpu_tensors_with_the_group_named():
    launcher = submission.GroupedGemmLauncher(compile_fn=lambda config: submission.CompiledGemm(None, {}))
    with pytest.raises(ValueError, match="group 0: a is on cpu, expected a CUDA device"):
        launcher(make((64, 200)))
    assert not launcher.plans


def test_a_compile_freezes_the_objects_alive_then_and_only_the_first_time(monkeypatch):
    """The first compile of a configuration moves every live object out of the collector's full collections
    (a collection inside a timed loop stalled samples by 65-130 ms on the H200); a memoized one does not."""
    frozen = []
    monkeypatch.setattr(submission, "_compiled", {})
    monkeypatch.setattr(submission, "compile_with_placeholders", lambda fn, spec=None: ("compiled", fn))
    monkeypatch.setattr(submission, "freeze_long_lived_objects", lambda: frozen.append(True))
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_100a")  # no GPU to ask
    config = submission.TILE_CONFIGS["128x128"]
    first = submission.compile_grouped_gemm(config)
    assert submission.compile_grouped_gemm(config) is first and frozen == [True]


def test_freezing_takes_every_live_object_out_of_full_collections():
    gc.unfreeze()
    try:
        tracked = [[i] for i in range(1000)]  # container objects: tracked by the collector
        submission.freeze_long_lived_objects()
        assert gc.get_freeze_count() >= len(tracked)
        assert gc.get_objects(generation=2).count(tracked[0]) == 0  # frozen, not in the oldest generation
    finally:
        gc.unfreeze()


def test_a_pair_grid_is_capped_at_the_clusters_the_device_holds():
    """A persistent grid of CTA pairs (hopper.py's pair forms) is sized by the 2-SM clusters that fit at once (as
    NVIDIA's examples size theirs), never above SMs // 2; one-CTA configurations are unaffected."""
    from nvfp4_group_gemm import hopper
    pair, single = hopper.SM90_CONFIGS["sm90-192x256-k64-wr-pair"], submission.TILE_CONFIGS["128x128"]
    sizes = ((512, 4096, 7168, 1),) * 8
    assert submission.shape_plan(sizes, -1, 132, pair).ctas == 66
    assert submission.shape_plan(sizes, -1, 132, pair, max_pairs=60).ctas == 60
    assert submission.shape_plan(sizes, -1, 132, pair, max_pairs=80).ctas == 66
    assert submission.shape_plan(sizes, -1, 148, single, max_pairs=70).ctas == 148


def test_resident_clusters_asks_the_dsls_occupancy_query_and_caps_it(monkeypatch):
    """On the CPU, with a stand-in for the DSL's HardwareInfo: the query's answer, at most SMs // 2."""
    import contextlib
    answers = {}

    class StandIn:
        def __init__(self, index):
            self.index = index

        def get_max_active_clusters(self, size):
            return answers[(self.index, size)]
    monkeypatch.setattr(submission.utils, "HardwareInfo", StandIn)
    monkeypatch.setattr(submission.torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(submission, "sm_count", lambda index: 148)
    submission.resident_clusters.cache_clear()
    try:
        answers.update({(0, 2): 70, (1, 2): 80})
        assert submission.resident_clusters(0, 2) == 70  # a GPC with an odd SM count: fewer than 74
        assert submission.resident_clusters(1, 2) == 74  # never above SMs // 2
        assert submission.GroupedGemmLauncher.max_pairs(0) == 70
        assert submission.resident_clusters(2, 2) == 74  # no answer (here: a KeyError): SMs // 2, as before
    finally:
        submission.resident_clusters.cache_clear()


def test_the_builder_query_runs_in_relaxed_capture_mode_and_restores_the_threads(monkeypatch):
    """event_done swaps this thread to relaxed capture mode for the query and back to the mode it had."""
    modes, queried = [0], []  # the thread's mode, as the driver keeps it

    def exchange(pointer):
        modes[0], pointer._obj.value = pointer._obj.value, modes[0]
        return 0

    class Event:
        def query(self):
            queried.append(modes[0])
            return True
    monkeypatch.setattr(submission, "_exchange_capture_mode", lambda: exchange)
    assert submission.event_done(Event()) is True
    assert queried == [submission.CAPTURE_MODE_RELAXED] and modes == [0]

    def missing():
        raise OSError("no libcuda here")
    monkeypatch.setattr(submission, "_exchange_capture_mode", missing)
    assert submission.event_done(Event()) is True  # a plain query
