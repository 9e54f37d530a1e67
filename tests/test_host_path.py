"""The B200 host path's plan cache: never stale, bounded, validated once per input.

On the CPU the launcher runs with a recording stand-in for LaunchPlan (no CUDA
needed); on a CUDA GPU the real LaunchPlan launches a stand-in kernel with the
B200 kernel's parameters that records the arguments it received."""
import gc

import pytest
import torch

import submission
from conftest import HAS_CUDA, needs_cuda
from reference import generate_input


class RecordingPlan:
    """What LaunchPlan would compute, without a GPU: the packed tables."""
    built = []

    def __init__(self, data, config, compiled, device):
        self.words, *_ = submission.pack_metadata(data, config)
        self.config = config
        self.launches = 0
        RecordingPlan.built.append(self)

    def launch(self):
        self.launches += 1


def cpu_launcher(**kwargs):
    RecordingPlan.built = []
    validated = []

    def validate(data):
        validated.append(1)
        submission.validate_structure(data)
    launcher = submission.B200Launcher(compile_fn=lambda config: (None, None),
                                       plan_factory=RecordingPlan, validate=validate, **kwargs)
    return launcher, validated


def make(ms, seed=1):
    g = len(ms)
    return generate_input(ms, (256,) * g, (512,) * g, g, seed=seed, device="cpu")


def expected_words(data):
    return submission.pack_metadata(data, submission.choose_config(data[3]))[0]


def test_reused_inputs_reuse_their_plan_and_validate_once():
    launcher, validated = cpu_launcher()
    inputs = [make((64, 200), seed=s) for s in range(3)]
    for _ in range(4):
        for data in inputs:
            out = launcher(data)
            assert [o.data_ptr() for o in out] == [c.data_ptr() for _, _, c in data[0]]
    assert len(RecordingPlan.built) == 3 and len(validated) == 3
    assert [p.launches for p in RecordingPlan.built] == [4, 4, 4]  # C recomputed every call
    assert [p.words for p in RecordingPlan.built] == [expected_words(d) for d in inputs]


def test_freed_inputs_drop_their_plan_even_at_reused_addresses():
    launcher, _ = cpu_launcher()
    data = make((64, 200))
    launcher(data)
    assert len(launcher.plans) == 1
    del data
    gc.collect()
    assert len(launcher.plans) == 0  # its tensors died: the plan went with them
    for ms in [(128, 40, 300), (64,), (1, 1024)]:  # other shapes, likely at reused addresses
        data = make(ms, seed=len(ms))
        launcher(data)
        plan = launcher.plans[submission.input_key(data)]
        assert plan.words == expected_words(data)
        del data, plan
        gc.collect()


def test_cloned_inputs_get_their_own_plan():
    launcher, validated = cpu_launcher()
    data = make((64, 200))
    clone = tuple([tuple(t.clone() for t in g) for g in part] if i < 3 else list(part)
                  for i, part in enumerate(data))
    launcher(data)
    launcher(clone)
    assert len(RecordingPlan.built) == 2 and len(validated) == 2
    assert RecordingPlan.built[0].words != RecordingPlan.built[1].words  # other addresses
    assert RecordingPlan.built[1].words == expected_words(clone)


def test_a_group_list_that_changes_length_is_another_input():
    launcher, _ = cpu_launcher()
    data = make((64, 200, 96))
    shorter = tuple(part[:2] for part in data)
    launcher(data)
    launcher(shorter)
    assert len(RecordingPlan.built) == 2
    assert RecordingPlan.built[1].words == expected_words(shorter)


def test_a_replaced_tensor_is_another_input():
    launcher, _ = cpu_launcher()
    data = make((64, 200))
    launcher(data)
    a, b, c = data[0][1]
    data[0][1] = (a, b, c.clone())  # same list object, new C
    launcher(data)
    assert len(RecordingPlan.built) == 2
    assert RecordingPlan.built[1].words == expected_words(data)


def test_the_cache_is_bounded():
    launcher, _ = cpu_launcher(max_plans=4)
    inputs = [make((64,), seed=s) for s in range(7)]
    for data in inputs:
        launcher(data)
    assert len(launcher.plans) == 4
    assert list(launcher.plans) == [submission.input_key(d) for d in inputs[3:]]


def test_bad_input_is_rejected_before_any_plan():
    launcher, _ = cpu_launcher()
    data = make((64, 200))
    bad = (data[0], data[1], data[2], [(64, 256, 384, 1), data[3][1]])
    with pytest.raises(ValueError, match="group 0: K=384"):
        launcher(bad)
    assert not launcher.plans and not RecordingPlan.built


def test_pack_metadata_layout():
    data = make((64, 200, 40))
    for config in submission.TILE_CONFIGS.values():
        words, abc_at, sf_at, sizes_at = submission.pack_metadata(data, config)
        assert (abc_at, sf_at, sizes_at) == (0, 10, 16)  # 16-byte aligned parts for G = 3
        for g, ((a, b, c), (sfa, sfb), size) in enumerate(zip(data[0], data[2], data[3])):
            first, second = (b, a) if config.swap_ab else (a, b)
            sf_first, sf_second = (sfb, sfa) if config.swap_ab else (sfa, sfb)
            assert words[3 * g: 3 * g + 3] == [first.data_ptr(), second.data_ptr(), c.data_ptr()]
            assert words[sf_at + 2 * g: sf_at + 2 * g + 2] == [sf_first.data_ptr(), sf_second.data_ptr()]
            mp, np_, k, l = submission.kernel_problem(size, config)
            low, high = words[sizes_at + 2 * g], words[sizes_at + 2 * g + 1]
            assert (low & 0xFFFFFFFF, low >> 32, high & 0xFFFFFFFF, high >> 32) == (mp, np_, k, l)


# ---- on a CUDA GPU: the real LaunchPlan with the stand-in kernel ----------------
def recorded(launcher, data):
    """What the stand-in kernel wrote: num_groups, tiles, CTAs, last K, last D' address."""
    torch.cuda.synchronize()
    plan = launcher.plans[submission.input_key(data)]
    return plan.workspace.view(-1)[:5].tolist()


def expected_record(data):
    config = submission.choose_config(data[3])
    sizes, tiles, ctas = submission.launch_plan(data[3], config,
                                                torch.cuda.get_device_properties(0).multi_processor_count)
    return [len(sizes), tiles, ctas, sizes[-1][2], data[0][-1][2].data_ptr()]


@needs_cuda
def test_gpu_launcher_arguments_arrive_and_survive_reallocation_and_streams():
    import hostbench
    launcher = submission.B200Launcher(compile_fn=hostbench.standin_compile)
    data = generate_input((64, 200), (256, 512), (512, 256), 2, seed=3)
    launcher(data)
    assert recorded(launcher, data) == expected_record(data)
    del data
    gc.collect()
    for ms, ks in [((128, 40, 300), (256, 512, 768)), ((1,), (1024,))]:
        data = generate_input(ms, (128,) * len(ms), ks, len(ms), seed=5)
        launcher(data)
        assert recorded(launcher, data) == expected_record(data)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        launcher.plans[submission.input_key(data)].workspace.zero_()
        launcher(data)  # same plan, another stream
    side.synchronize()
    assert recorded(launcher, data) == expected_record(data)
