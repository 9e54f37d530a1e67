"""Tuning snapshots of the Hopper path: which form and schedule custom_kernel picks per shape set, as measured
fastest on an H200 (docs/hopper.md). They are not correctness: a new measurement that changes a pick changes
the snapshot with it (each message says so)."""
import pytest

from conftest import BENCHMARK_CASES

hopper = pytest.importorskip("nvfp4_group_gemm.hopper")
hopper_policy = pytest.importorskip("nvfp4_group_gemm.hopper_policy")
from nvfp4_group_gemm import submission  # noqa: E402  (after hopper, which registers its path)

SNAPSHOT = "tuning snapshot (docs/hopper.md's measurements): update it with a new measurement, not to pass"


def test_snapshot_schedules_each_shape_set_as_measured_fastest_unless_the_setting_names_one():
    """More tiles than SMs: contiguous ranges, balanced CTAs, groups by M (plan tables in that order); one
    wave: round-robin; a setting with "/SCHEDULE" fixes the schedule for every shape set."""
    from nvfp4_group_gemm.reference import generate_input
    sms = 132
    multi_wave = ((80, 4096, 7168, 1), (176, 4096, 7168, 1), (248, 4096, 7168, 1), (64, 4096, 7168, 1),
                  (128, 4096, 7168, 1))  # 7 x 32 = 224 tiles of 128 x 128, 6 x 16 = 96 pair tiles of 192 x 256
    one_wave = ((128, 4096, 1536, 1), (384, 4096, 1536, 1))  # 128 tiles, 48 pair tiles
    assert submission.tile_count(multi_wave, hopper.SM90_CONFIG) > sms >= submission.tile_count(
        one_wave, hopper.SM90_CONFIG)
    for setting in (None, "", hopper.SM90_CONFIG.tile_name, "sm90-192x256-k64-wr-pair"):
        launcher = hopper_policy.launcher_for_setting(setting)
        base = hopper_policy.config_from_setting(setting)  # unset: sm90_choice keeps the default form on these
        assert launcher.config is None
        plan = submission.shape_plan(multi_wave, -1, sms, launcher.config, launcher.choose)
        assert plan.config.schedule == submission.Schedule(True, True, True), SNAPSHOT
        assert plan.config.name == f"{base.tile_name}/contiguous+balanced+by-m"
        assert plan.config.with_schedule(base.schedule) == base
        assert plan.order == (2, 1, 4, 0, 3)  # descending M
        units = sms // base.cta_group  # CTAs or pairs
        assert plan.ctas == submission.persistent_ctas(plan.tiles, units, balanced=True) < units
        plan = submission.shape_plan(one_wave, -1, sms, launcher.config, launcher.choose)
        assert plan.config.schedule == submission.Schedule() and plan.order == (0, 1) and plan.ctas == plan.tiles
    fixed = hopper_policy.launcher_for_setting("/contiguous")
    assert fixed.config.schedule == submission.Schedule(contiguous=True)
    assert submission.shape_plan(one_wave, -1, sms, fixed.config, fixed.choose).config is fixed.config
    # the launcher passes the device's SM count to its chooser
    data = generate_input((300, 40), (256, 128), (512, 256), 2, seed=3, device="cpu")
    seen = []
    launcher = submission.GroupedGemmLauncher(
        choose=lambda sizes, num_sms: seen.append((sizes, num_sms)) or hopper.SM90_CONFIG)
    launcher.num_sms = lambda index: 7
    shape, _, _ = launcher.check_and_gather(data, None)
    assert seen == [(tuple(map(tuple, data[3])), 7)] and shape.config is hopper.SM90_CONFIG


def test_snapshot_a_pair_form_where_the_cost_model_says_it_cuts_the_busiest_pair_by_more_than_its_cost():
    """sm90_choice on the benchmarks as measured (docs/hopper.md): the narrow pair on benchmark 0 (2 wide tiles
    and a narrow one per busiest pair, for 3 per CTA), the 192-token pair on benchmark 1 (252 tiles, 4 per pair,
    for 728, 6 per CTA), the default on the one-wave benchmarks; the busiest CTA's cost counts each tile's K."""
    sms = 132
    picks = [hopper_policy.sm90_choice(tuple((m, n, k, 1) for m, n, k in zip(c.args["m"], c.args["n"], c.args["k"])),
                                sms).name for c in BENCHMARK_CASES]
    assert picks == ["sm90-128x256-k128-wr-pair-narrow-n16-64/by-m",
                     "sm90-192x256-k64-wr-pair/contiguous+balanced+by-m",
                     "sm90-128x128-k128-wr-n16-64/round-robin", "sm90-128x128-k128-wr-n16-64/round-robin"], SNAPSHOT
    wide, default = hopper.SM90_CONFIGS["sm90-192x256-k64-wr-pair"], hopper.SM90_CONFIG
    sizes = tuple((m, 7168, 2048, 1) for m in (40, 76, 168, 72, 164, 148, 196, 160))
    cost = hopper_policy.SM90_TILE_COST_NS
    assert hopper_policy.busiest_cta_cost(sizes, sms, default) == 6 * 2048 * cost[default.tile_name]
    assert hopper_policy.busiest_cta_cost(sizes, sms, wide) == 4 * 2048 * cost[wide.tile_name]
    # one tile per CTA or pair: a pair's tile costs more than the default's
    assert all(hopper_policy.SM90_TILE_COST_NS[name] > hopper_policy.SM90_TILE_COST_NS[default.tile_name]
               for name in hopper_policy.SM90_TILE_COST_NS if hopper.SM90_CONFIGS[name].cta_group == 2)
    # groups of different K: the CTA holding the long group's tiles is the busiest
    mixed = ((128, 128, 8192, 1), (128, 128, 256, 1))
    assert hopper_policy.busiest_cta_cost(mixed, 1, default) == (8192 + 256) * cost[default.tile_name]
    assert hopper_policy.busiest_cta_cost(mixed, 2, default) == 8192 * cost[default.tile_name]
    assert hopper_policy.launcher_for_setting(None).choose is hopper_policy.sm90_choice


def test_snapshot_decode_takes_the_narrow_token_forms_and_prefill_does_not():
    """At 16 and 32 tokens a group the 32-token form, at 48 and 64 the 64-token form (measured fastest at 16 and
    64 on an H100, docs/hopper.md "Decode"); from 96 on the forms chosen before them (a decode form's tile costs
    less but there are twice as many or more)."""
    picks = {(n, m): hopper_policy.sm90_choice(((m, n, k, 1),) * 8, 132).tile_name
             for n, k in ((4096, 7168), (7168, 2048)) for m in (1, 16, 32, 48, 64, 96, 128)}
    for (n, m), name in picks.items():
        expected = ("sm90-32x128-k128-wr-n16" if m <= 32 else "sm90-64x128-k128-wr-n16" if m <= 64 else None)
        if expected:
            assert name == expected, (n, m, SNAPSHOT)
        else:
            assert hopper.SM90_CONFIGS[name].tile_m >= 128, (n, m, SNAPSHOT)
