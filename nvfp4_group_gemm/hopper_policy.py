"""The Hopper kernel's policy beside it (hopper.py holds the kernel): which form and schedule custom_kernel
runs per shape set (`sm90_choice`, from a cost model per tile: SM90_TILE_COST_NS, fitted to H200 sweeps in
docs/hopper.md), which forms the MoE op launches for T tokens over E experts (`moe_forms`, from routings sampled
as an unbalanced router makes them), the configuration settings people name (CONFIG_ENV, MOE_FORM_ENV), and the
sm_90 path's launcher, which registers itself with submission.py (`launch.register_path`) when this module is
imported (`harness.load_submission` does)."""
import functools
import os
from typing import Optional

from . import launch, moe_tables, submission
from .hopper import (MOE_IN_ONE_WAVE, MOE_PAST_ONE_WAVE, SM90_CANDIDATES, SM90_CONFIG, SM90_CONFIGS,
                     SM90_MOE_CONFIGS, SM90_MOE_DEFAULT, SM90_NO_PDL, Sm90TileConfig, ceil_div, narrow_last_tiles)


PATH_HOPPER = "hopper-sm90"  # custom_kernel's label for this path (launch.code_path)
CONFIG_ENV = "NVFP4_SM90_CONFIG"  # "NAME[/SCHEDULE]" (`config_from_setting`); unset: `sm90_choice` per shape set


def sm90_schedule(problem_sizes, num_sms: int, config: Sm90TileConfig = SM90_CONFIG) -> submission.Schedule:
    """The schedule measured fastest on the H200 (docs/hopper.md, "The forms"): with more tiles than SMs
    (SM pairs for cta_group 2), contiguous tile ranges over balanced CTAs, groups by descending M (3 and 7 % faster
    than round-robin on benchmarks 0 and 1); within one wave every CTA takes one tile under any schedule:
    round-robin. A form with narrow tiles: round-robin over every SM (pair), groups by descending M, so that the
    narrow tiles are the last ones of the CTAs that run one (`NarrowLastScheduler`; benchmark 0, measured only
    this way)."""
    if submission.tile_count(problem_sizes, config) > num_sms // config.cta_group:
        if config.narrow_tokens:  # round-robin over every SM: the narrow tiles are the CTAs' last ones
            return submission.Schedule(groups_by_m=True)
        return submission.Schedule(contiguous=True, balanced_ctas=True, groups_by_m=True)
    return submission.Schedule()


def scheduled_by_shape(config: Sm90TileConfig):
    """The launcher's `choose` for `config` under `sm90_schedule`, per shape set."""
    return lambda problem_sizes, num_sms: config.with_schedule(sm90_schedule(problem_sizes, num_sms, config))


# The forms custom_kernel chooses among when CONFIG_ENV names none, with their cost of one tile per K (ns; a
# pair's tile: each CTA's half): time ~ a fixed part + the busiest CTA's (or pair's) sum of K x cost. Ratios of
# same-run H200 means (docs/hopper.md, "The forms, and why each exists"): the default's 6.64 (fitted on the
# four benchmarks before the pairs); the narrow pair's wide tile x 30.8 / 30.4 (benchmark 2,
# one wide tile per CTA either way) and its narrow tile's share from benchmark 0 (2 wide + 1 narrow per pair
# against 3: 128.7 against 131.1 us); the 192-token pair x 72.5 / 78.5 of 192 x 128 on one CTA (benchmark 1,
# 4 tiles per pair or CTA either way; that form's cost was 8.30). One wave (benchmarks 2, 3): the default.
# The decode forms (32 and 64 tokens a tile), from same-run H100 means against the form chosen before them, at
# 16 and 64 tokens a group (scripts/m_sweep.py, CONFIG_ENV naming each; docs/hopper.md, "Decode"): the chosen
# form's modeled busiest CTA times the measured ratio, over that CTA's tiles x K, averaged over the points
# (32: 60.3 / 84.3 and 36.9 / 66.7 us at 16; 64: 65.4 / 84.3, 42.3 / 66.7 at 16, 70.0 / 85.0, 45.2 / 54.0 at 64).
SM90_TILE_COST_NS = {"sm90-128x128-k128-wr-n16-64": 6.64, "sm90-128x256-k128-wr-pair-narrow-n16-64": 6.73,
                     "sm90-192x256-k64-wr-pair": 7.66, "sm90-32x128-k128-wr-n16": 3.88,
                     "sm90-64x128-k128-wr-n16": 4.70}
# A narrow form's narrow tile, as a share of its wide tile's cost (fitted on benchmark 0, where it also absorbs
# round-robin's cost against contiguous ranges: the model has no schedule term; docs/hopper.md says where
# that makes it weak). Likely near 1 because a narrow tile halves wgmma's work but converts all its weights.
SM90_NARROW_TILE_SHARE = {"sm90-128x256-k128-wr-pair-narrow-n16-64": 0.91}


def tile_weights(problem_sizes, config: Sm90TileConfig, schedule: submission.Schedule) -> list:
    """Each linear tile's K, times the narrow share for a narrow tile, in the kernel's order: groups in
    `submission.group_order`, numbered as the form's scheduler numbers tiles (`narrow_last_tiles`). A tile's
    token width (`Sm90TileConfig.widths`) has no term: a 16-token tile cost 0.94 of a 128-token one
    (docs/hopper.md, "Token widths")."""
    ordered = [problem_sizes[g] for g in submission.group_order(problem_sizes, schedule)]
    if config.narrow_tokens:
        share = SM90_NARROW_TILE_SHARE[config.base_form.tile_name]
        return [ordered[g][2] * (share if narrow else 1.0)
                for g, _, _, narrow in narrow_last_tiles(ordered, config.tile_m, config.tile_n, config.narrow_tokens)]
    return [size[2] for size in ordered for _ in range(submission.tile_count([size], config))]


def busiest_cta_cost(problem_sizes, num_sms: int, config: Sm90TileConfig) -> float:
    """Modeled ns of the busiest CTA (or pair) of `config` under `sm90_schedule` (SM90_TILE_COST_NS per tile
    and K, `tile_weights`)."""
    schedule = sm90_schedule(problem_sizes, num_sms, config)
    weights = tile_weights(problem_sizes, config, schedule)
    ctas = submission.persistent_ctas(len(weights), num_sms // config.cta_group, schedule.balanced_ctas)
    return SM90_TILE_COST_NS[config.base_form.tile_name] * max(
        sum(weights[t] for t in submission.cta_tiles(cta, ctas, len(weights), schedule)) for cta in range(ctas))


def sm90_choice(problem_sizes, num_sms: int) -> Sm90TileConfig:
    """custom_kernel's configuration per shape set when CONFIG_ENV names none: the form of SM90_TILE_COST_NS
    whose busiest CTA costs least (ties: the default), under `sm90_schedule`."""
    config = min((SM90_CONFIGS[name] for name in SM90_TILE_COST_NS),
                 key=lambda c: busiest_cta_cost(problem_sizes, num_sms, c))
    return config.with_schedule(sm90_schedule(problem_sizes, num_sms, config))


MOE_ROUTING_SAMPLES = 16
MOE_LOAD_VARIATION = 0.5  # coefficient of variation of the experts' loads the op's form is chosen for


def moe_routings(tokens: int, experts: int, samples: int = MOE_ROUTING_SAMPLES) -> list:
    """`samples` group sizes of `tokens` over `experts` as an unbalanced router makes them (seeded: the same
    every time): the experts' shares drawn from a symmetric Dirichlet whose loads vary by MOE_LOAD_VARIATION
    (concentration ((E - 1) / cv^2 - 1) / E), then each token's expert from those shares."""
    import random
    import torch
    seed = tokens * 1009 + experts
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    concentration = max(((experts - 1) / MOE_LOAD_VARIATION ** 2 - 1) / experts, 0.05)
    routings = []
    for _ in range(samples):
        shares = torch.tensor([rng.gammavariate(concentration, 1.0) for _ in range(experts)]) + 1e-12
        choice = torch.multinomial(shares, tokens, replacement=True, generator=generator) if tokens else \
            torch.zeros(0, dtype=torch.long)
        routings.append(torch.bincount(choice, minlength=experts).tolist())
    return routings


@functools.lru_cache(maxsize=256)
def moe_choice(tokens: int, experts: int, n: int, k: int, num_sms: int) -> Sm90TileConfig:
    """The MoE op's form for T tokens over E experts when only the host's sizes are known (`sm90_choice` needs
    the group sizes): the form of SM90_MOE_CONFIGS whose busiest CTA costs least on average over `moe_routings`,
    under `moe_scheduled`'s schedule."""
    routings = [[(m, n, k, 1) for m in counts if m] for counts in moe_routings(tokens, experts)]
    routings = [r for r in routings if r] or [[(1, n, k, 1)]]

    def mean_cost(config):
        return sum(busiest_cta_cost(r, num_sms, config) for r in routings) / len(routings)
    best = min((SM90_CONFIGS[name] for name in SM90_TILE_COST_NS), key=mean_cost)
    return moe_scheduled(best.moe_form, tokens, experts, n, num_sms)


def moe_scheduled(config: Sm90TileConfig, tokens: int, experts: int, n: int, num_sms: int) -> Sm90TileConfig:
    """A MoE form under the schedule the host's sizes allow: contiguous tile ranges where its most tiles exceed
    one wave, except a narrow form (`sm90_schedule`; no balancing, no order by M: those need the sizes)."""
    contiguous = moe_tables.most_tiles(tokens, experts, n, config) > num_sms // config.cta_group
    return config.with_schedule(submission.Schedule(contiguous=contiguous and not config.narrow_tokens))


MOE_FORM_ENV = "NVFP4_SM90_MOE_FORM"  # "NAME[/SCHEDULE]" of SM90_MOE_CONFIGS (`moe_forms`); unset: `moe_choice`
# the MoE op's form setting: MOE_FORM_ENV's value when this module is imported, then what `set_moe_form` sets (the
# op reads this on every call, the environment once: a lookup of the environment is a slow part of a warm call)
moe_form: Optional[str] = os.environ.get(MOE_FORM_ENV) or None


def set_moe_form(name: Optional[str]) -> None:
    """The MoE op's form from now on in this process, as MOE_FORM_ENV names one (checked now), or None for
    `moe_choice`'s; to time each form on a workload (scripts/moe_forms.py)."""
    global moe_form
    if name:
        submission.parse_config(name, SM90_MOE_CONFIGS, MOE_FORM_ENV)
    moe_form = name or None


def moe_one_wave_ctas(tokens: int, experts: int, n: int, num_sms: int) -> int:
    """The default MoE form's grid: where a call's default-form tiles fit it, one wave takes the call."""
    return submission.persistent_ctas(moe_tables.most_tiles(tokens, experts, n, SM90_MOE_DEFAULT), num_sms)


def moe_forms(tokens: int, experts: int, n: int, k: int, num_sms: int) -> tuple:
    """The MoE op's forms on sm_90, launched in this order: the one `moe_form` names (MOE_FORM_ENV, or
    `set_moe_form`: to time each form on a workload), else `moe_choice`'s, and after it the default form where
    some routing's tiles, not every one's, fit the default form's grid in one wave (their rows multiples of 128,
    as routers that pad each expert's rows to a block, or give each the same capacity, make them): there the
    default form's busiest CTA runs one 128 x 128 tile. With two, the device chooses from the routing
    (`MOE_TWO_FORM_RULES`: the default form takes the calls that fit, the other the rest; the launch not taking a
    call ends after its wait)."""
    setting = moe_form
    if setting:
        return (submission.parse_config(setting, SM90_MOE_CONFIGS, MOE_FORM_ENV),)
    choice = moe_choice(tokens, experts, n, k, num_sms)
    default = moe_scheduled(SM90_MOE_DEFAULT, tokens, experts, n, num_sms)
    fewest_tiles = ceil_div(tokens, default.tile_m) * ceil_div(n, default.tile_n)  # every group's rows full tiles
    # its grid (`moe_one_wave_ctas`) is min(most tiles, SMs): a routing fits it where its tiles are at most the SMs
    if choice.tile_name == default.tile_name or not fewest_tiles <= num_sms < moe_tables.most_tiles(
            tokens, experts, n, default):
        return (choice,)  # the default form itself, or no routing fits its one wave, or every one does
    return (choice, default)


# Which calls each launch of two forms takes (`moe_forms`' order: `moe_choice`'s form, then the default)
MOE_TWO_FORM_RULES = (MOE_PAST_ONE_WAVE, MOE_IN_ONE_WAVE)


def config_from_setting(setting) -> Sm90TileConfig:
    """The configuration a CONFIG_ENV setting names (unset or empty: the default): a configuration's
    `tile_name`, optionally followed by "/" and a schedule (`submission.parse_config`, e.g.
    "sm90-128x128-k128-wr-n16-64/contiguous+balanced"), or "/SCHEDULE" alone for the default configuration under
    that schedule; a form of SM90_CANDIDATES likewise (to time it). How custom_kernel uses it:
    `launcher_for_setting`."""
    if setting in (None, ""):
        return SM90_CONFIG
    if setting.startswith("/"):
        setting = SM90_CONFIG.tile_name + setting
    return submission.parse_config(setting, {**SM90_CONFIGS, **SM90_CANDIDATES, SM90_NO_PDL.tile_name: SM90_NO_PDL},
                                   CONFIG_ENV)


def launcher_for_setting(setting) -> submission.GroupedGemmLauncher:
    """The shared host path for a CONFIG_ENV setting: unset or empty, `sm90_choice` per shape set; a
    configuration and schedule, those; a configuration alone, it under `sm90_schedule` per shape set."""
    config = config_from_setting(setting)
    if setting in (None, ""):
        return submission.GroupedGemmLauncher(choose=sm90_choice)
    if "/" in setting:
        return submission.GroupedGemmLauncher(config=config)
    return submission.GroupedGemmLauncher(choose=scheduled_by_shape(config))


_launcher = None


def run_sm90(data):
    """custom_kernel on sm_90: the shared host path with the Hopper configuration
    (compiled by `submission.compile_grouped_gemm` through `Sm90TileConfig.make_kernel`)."""
    global _launcher
    if _launcher is None:  # the configuration setting is read once, at the first call
        _launcher = launcher_for_setting(os.environ.get(CONFIG_ENV))
    return _launcher(data)


launch.register_path((9, 0), PATH_HOPPER, run_sm90)
