"""The Hopper (sm_90a) kernel's correctness on the CPU: its dequantization identity holds for every
E2M1 x E4M3 pair (the conversion's PTX emulated bit for bit), its scale-factor offsets address the blocked
layout the leaderboard makes, its schedulers take every tile once, its shared-memory staging is conflict-free,
its settings parse. Compile and PTX checks: test_hopper_ptx.py; tuning snapshots:
test_hopper_tuning_snapshots.py. It runs on a Hopper GPU through custom_kernel (tests/test_gpu.py)."""
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import BENCHMARK_CASES, TEST_CASES

from nvfp4_group_gemm import launch, peers

hopper = pytest.importorskip("nvfp4_group_gemm.hopper")
hopper_policy = pytest.importorskip("nvfp4_group_gemm.hopper_policy")
from nvfp4_group_gemm import submission  # noqa: E402  (after hopper, which registers its path)



# ---- the arithmetic, emulated bit for bit on the CPU ------------------------------
def f16(bits: int) -> float:
    return float(torch.tensor([bits], dtype=torch.int32).to(torch.int16).view(torch.float16)[0])


def e2m1(nibble: int) -> float:
    magnitude = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)[nibble & 7]
    return -magnitude if nibble & 8 else magnitude


def test_the_dequantization_identity_holds_for_every_pair():
    # dequant_word: nibble n at bits 12-15 of a half -> (n & 8) << 12 | (n & 7) << 9 = value * 2^-14
    for nibble in range(16):
        half = nibble << 12
        pattern = (half & 0x8000) | ((half & 0x7000) >> 3)
        assert f16(pattern) == e2m1(nibble) * 2.0 ** -14
    # scale_f16x2: fp16(E4M3) * 2^7; the product rounded once to fp16 is exact
    scales = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    finite = scales[torch.isfinite(scales)]
    values = torch.tensor([e2m1(n) for n in range(16)])
    scale16 = (finite.half() * 128).float()
    assert torch.equal(scale16, finite * 128)  # every finite scale * 2^7 is exact in fp16
    operand = (values[:, None] * 2.0 ** -14).half().float() * scale16[None, :]
    assert torch.equal(operand.half().float(), values[:, None] * finite[None, :] * 2.0 ** -7)
    assert operand.abs().max() < 65504  # no fp16 overflow
    assert hopper.ACC_SCALE == 2.0 ** 14


def run_ptx(ptx: str, operands: dict) -> dict:
    """Emulate the integer and f16x2 instructions of the inline PTX bit for bit."""
    regs = dict(operands)
    value = lambda x: regs[x] if x in regs else int(x, 0)
    for line in ptx.replace("{", "").replace("}", "").split(";"):
        parts = line.replace(",", " ").split()
        if not parts or parts[0] == ".reg":
            continue
        op, dst, args = parts[0], parts[1], [value(x) for x in parts[2:]]
        if op == "mov.b32":
            result = args[0]
        elif op == "shl.b32":
            result = args[0] << args[1]
        elif op == "shr.b32":
            result = args[0] >> args[1]
        elif op == "and.b32":
            result = args[0] & args[1]
        elif op == "or.b32":
            result = args[0] | args[1]
        elif op == "lop3.b32":  # bit i of the result: the table's bit at (a_i << 2 | b_i << 1 | c_i)
            a, b, c, table = args
            result = sum(((table >> ((a >> i & 1) << 2 | (b >> i & 1) << 1 | (c >> i & 1))) & 1) << i
                         for i in range(32))
        elif op == "mul.rn.f16x2":
            halves = torch.tensor([[args[0] & 0xFFFF, args[0] >> 16], [args[1] & 0xFFFF, args[1] >> 16]],
                                  dtype=torch.int32).to(torch.int16).view(torch.float16)
            product = (halves[0] * halves[1]).view(torch.int16).to(torch.int32) & 0xFFFF
            result = int(product[0]) | int(product[1]) << 16
        else:
            raise AssertionError(f"unexpected instruction {op}")
        regs[dst] = result & 0xFFFFFFFF
    return regs


def test_the_conversion_ptx_yields_each_pair_times_the_scale():
    """DEQUANT_WORD_PTX, emulated: pair j of a word is the nibbles j and j + 4
    as value * 2^-14 times the fp16 scale, exactly."""
    scale = 0x4C00  # fp16 16.0 in both halves
    scale2 = scale | scale << 16
    # every nibble value at every place (each pair's masks drop the other nibbles' bits, whatever they are)
    words = [0x76543210, 0xFEDCBA98, 0x19E2B7C4, 0x8F0F70F0, 0xFFFFFFFF]
    words += [v << 4 * place ^ fill for v in range(16) for place in range(8) for fill in (0, 0xFFFFFFFF)]
    for word in words:
        out = run_ptx(hopper.DEQUANT_WORD_PTX, {"$4": word, "$5": scale2})
        for j in range(4):
            got = out[f"${j}"]
            for half, nibble in ((got & 0xFFFF, word >> 4 * j & 15), (got >> 16, word >> 4 * (j + 4) & 15)):
                assert f16(half) == e2m1(nibble) * 2.0 ** -14 * 16.0, (hex(word), j)


@pytest.mark.parametrize("tile_k", sorted({c.tile_k for c in hopper.SM90_CONFIGS.values()}))
def test_scale_factor_offsets_address_the_blocked_layout(tile_k):
    from nvfp4_group_gemm.reference import generate_input
    from nvfp4_group_gemm import submission
    m, n, k = 200, 256, 768
    data = generate_input((m,), (n,), (k,), 1, seed=7, device="cpu")
    sfa_plain = data[1][0][0]  # [M, K/16, 1] E4M3 in row order
    blocked = data[2][0][0].permute(5, 2, 4, 0, 1, 3).contiguous().view(torch.uint8).flatten()
    assert blocked.numel() == submission.ceil_div(m, 128) * 128 * k // 16
    row_blocks_k = k // 64
    for row in (0, 1, 31, 32, 77, 127, 128, 199):
        for k_block in range(k // 16):
            stage, kb = divmod(k_block, tile_k // 16)
            stage_bytes = hopper.Sm90GroupedGemmKernel(hopper.SM90_CONFIGS[
                next(n for n, c in hopper.SM90_CONFIGS.items() if c.tile_k == tile_k)]).sf_stage_bytes
            base = (row // 128) * row_blocks_k * hopper.SF_BLOCK_BYTES + stage * stage_bytes
            got = blocked[base + hopper.sf_offset(row % 128, kb)]
            assert got == sfa_plain[row, k_block, 0].view(torch.uint8), (row, k_block)


# ---- dispatch ------------------------------------------------------------------
def test_sm90_goes_to_the_registered_hopper_kernel_and_falls_back_without_it(monkeypatch):
    from nvfp4_group_gemm import submission
    capability = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability[0])
    submission._path_for_index.cache_clear()
    try:
        # importing hopper registered it (submission never imports hopper)
        assert submission.EXTRA_PATHS[(9, 0)] == (hopper_policy.PATH_HOPPER, hopper_policy.run_sm90)
        assert submission._path_for_index(0) == (hopper_policy.PATH_HOPPER, hopper_policy.run_sm90)
        submission._path_for_index.cache_clear()
        monkeypatch.setattr(submission, "EXTRA_PATHS", {})  # hopper.py absent (the leaderboard)
        assert submission._path_for_index(0) == (submission.PATH_NONE, None)
        submission._path_for_index.cache_clear()
        capability[0] = (10, 0)
        assert submission._path_for_index(0) == (submission.PATH_B200, None)
        with pytest.raises(ValueError, match="sm_100 runs this module's B200 kernel"):
            launch.register_path((10, 0), "other", lambda data: None)
    finally:
        submission._path_for_index.cache_clear()
    assert launch.code_path(torch.device("cpu")) == submission.PATH_NONE


def test_the_launcher_uses_the_hopper_tile_for_its_tables():
    from nvfp4_group_gemm import submission
    from nvfp4_group_gemm.reference import generate_input
    data = generate_input((80, 300), (256, 128), (512, 256), 2, seed=3, device="cpu")
    shape = submission.shape_plan(tuple(map(tuple, data[3])), -1, 132, hopper.SM90_CONFIG)
    assert shape.config is hopper.SM90_CONFIG
    # 128 x 128 tiles: 1 x 2 for (80, 256), 3 x 1 for (300, 128)
    assert shape.tiles == 2 + 3 and shape.ctas == 5


PAIR = "sm90-128x256-k128-wr-pair-narrow-n16-64"


def test_a_pair_takes_each_tile_of_two_weight_blocks_and_every_block_once():
    """cta_group 2: the launcher counts tiles of 128 tokens x 256 weight rows and pairs of CTAs (at most one
    per two SMs); rank r of a pair takes weight block 2 n_tile + r, which covers every block of a group
    once, plus one past N where N / 128 is odd (its loads read zeros, its stores are left out)."""
    pair = hopper.SM90_CONFIGS[PAIR]
    assert pair.cta_group == 2 and pair.tile_n == 2 * hopper.WEIGHT_ROWS and pair.tile_m == hopper.SM90_CONFIG.tile_m
    # each pair form won a benchmark on an H200 (docs/hopper.md): sm90_choice's
    assert {name for name in hopper_policy.SM90_TILE_COST_NS if hopper.SM90_CONFIGS[name].cta_group == 2} == {
        PAIR, "sm90-192x256-k64-wr-pair"}
    assert hopper.ab_consumer_arrives(pair) == 2 * hopper.WARP_ROLES.consumer_warps
    assert hopper.ab_consumer_arrives(hopper.SM90_CONFIG) == hopper.WARP_ROLES.consumer_warps
    # the pipeline's release reach (check_ab_arrivals) against those counts: the kernels' clusters pass, a
    # cluster whose releases or token loads reach other CTAs than counted fails before anything is launched
    hopper.check_ab_arrivals(pair, (1, 1, 2, 1))
    hopper.check_ab_arrivals(hopper.SM90_CONFIG, (1, 1, 1, 1))
    for config, cluster in ((pair, (1, 2, 2, 1)), (pair, (1, 2, 1, 1)), (hopper.SM90_CONFIG, (1, 1, 2, 1))):
        with pytest.raises(ValueError, match="ab consumers"):
            hopper.check_ab_arrivals(config, cluster)
    kernel = pair.make_kernel()
    for n in (128, 384, 4096, 7168):
        blocks = [kernel.weight_tile(submission.WorkTile(0, 0, t, False, None, 128), r)
                  for t in range(submission.ceil_div(n, pair.tile_n)) for r in range(2)]
        assert sorted(b for b in blocks if b < n // 128) == list(range(n // 128))
        assert len(blocks) - n // 128 == (n // 128) % 2
    bench0 = tuple((m, 4096, 7168, 1) for m in (80, 176, 128, 72, 64, 248, 96, 160))
    plan = submission.shape_plan(bench0, -1, 132, pair.with_schedule(hopper_policy.sm90_schedule(bench0, 132, pair)))
    assert plan.tiles == 11 * 16 and plan.ctas == 66  # more tiles than pairs: round-robin (narrow tiles last)
    assert plan.config.schedule == submission.Schedule(groups_by_m=True)
    pair192 = hopper.SM90_CONFIGS["sm90-192x256-k64-wr-pair"]
    plan = submission.shape_plan(bench0, -1, 132,
                                 pair192.with_schedule(hopper_policy.sm90_schedule(bench0, 132, pair192)))
    assert plan.tiles == 9 * 16 and plan.ctas == submission.persistent_ctas(144, 66, balanced=True) <= 66
    assert plan.config.schedule == submission.Schedule(True, True, True)  # more tiles than pairs
    one_wave = ((128, 4096, 1536, 1), (384, 4096, 1536, 1))
    assert hopper_policy.sm90_schedule(one_wave, 132, pair) == submission.Schedule()  # 64 tiles, 66 pairs
    assert submission.shape_plan(one_wave, -1, 132, pair).ctas == 64


NARROW = "sm90-128x256-k128-wr-pair-narrow-n16-64"


def test_a_token_tile_runs_the_narrowest_width_that_holds_its_rows():
    """width_index (the kernel's choice, on host ints): the first width >= the tile's rows, the widest for more
    (a group's earlier tiles); every form's widths ascend to tile_m, at most MAX_TOKEN_WIDTHS of them, its narrow
    width among them."""
    widths = (16, 64, 128)
    assert [widths[hopper.width_index(r, widths)] for r in (1, 16, 17, 64, 65, 128, 129, 1000)] == \
        [16, 16, 64, 64, 128, 128, 128, 128]
    assert hopper.width_index(5, (128,)) == 0
    for config in [*hopper.SM90_CONFIGS.values(), *hopper.SM90_CANDIDATES.values()]:
        assert config.token_widths[-1] == config.tile_m and list(config.token_widths) == sorted(config.token_widths)
        assert len(config.token_widths) <= hopper.MAX_TOKEN_WIDTHS
        assert config.narrow_tokens in (0, *config.token_widths)


def test_narrow_tiles_come_last_and_every_tile_once():
    """narrow_last_tiles (the host's twin of NarrowLastScheduler): every (group, token tile, weight tile)
    once, the narrow ones (a group's last token tile of at most narrow_tokens rows) after all wide ones;
    round-robin over 66 pairs on benchmark 0 then gives the busiest pairs two wide tiles and a narrow one
    instead of three wide ones, which the cost model counts at the narrow share."""
    narrow = hopper.SM90_CONFIGS[NARROW]
    assert narrow.narrow_tokens == 64 and narrow.tile_m == 128 and narrow.tile_n == 256
    for sizes in [tuple((m, n, k, 1) for m, n, k in zip(c.args["m"], c.args["n"], c.args["k"]))
                  for c in TEST_CASES + BENCHMARK_CASES]:
        tiles = hopper.narrow_last_tiles(sizes, 128, 256, 64)
        expected = {(g, mt, nt) for g, (m, n, _, _) in enumerate(sizes)
                    for mt in range(submission.ceil_div(m, 128)) for nt in range(submission.ceil_div(n, 256))}
        assert sorted((g, mt, nt) for g, mt, nt, _ in tiles) == sorted(expected)
        assert len(tiles) == submission.tile_count(sizes, narrow)
        flags = [is_narrow for _, _, _, is_narrow in tiles]
        assert flags == sorted(flags)  # wide first
        assert all(is_narrow == (sizes[g][0] - 128 * mt <= 64) for g, mt, _, is_narrow in tiles)
        assert sum(hopper.wide_m_tiles(m, 128, 64) * submission.ceil_div(n, 256)
                   for m, n, _, _ in sizes) == flags.count(False)
    bench0 = tuple((m, 4096, 7168, 1) for m in (80, 176, 128, 72, 64, 248, 96, 160))
    schedule = hopper_policy.sm90_schedule(bench0, 132, narrow)
    assert schedule == submission.Schedule(groups_by_m=True)
    order = submission.group_order(bench0, schedule)
    tiles = hopper.narrow_last_tiles([bench0[g] for g in order], 128, 256, 64)
    pairs = submission.persistent_ctas(len(tiles), 66, schedule.balanced_ctas)
    per_pair = [[tiles[t][3] for t in submission.cta_tiles(c, pairs, len(tiles), schedule)] for c in range(pairs)]
    assert pairs == 66 and max(len(p) - sum(p) for p in per_pair) == 2  # at most two wide tiles per pair
    assert max(len(p) for p in per_pair) == 3
    # the cost model in that order
    share = hopper_policy.SM90_NARROW_TILE_SHARE[NARROW]
    assert 0 < share < 1
    assert hopper_policy.tile_weights(bench0, narrow, schedule) == [7168 * (share if t[3] else 1.0) for t in tiles]
    assert hopper_policy.busiest_cta_cost(bench0, 132, narrow) == pytest.approx(
        (2 + share) * 7168 * hopper_policy.SM90_TILE_COST_NS[NARROW])
    assert hopper_policy.busiest_cta_cost(bench0, 132, hopper.SM90_CONFIG) == (
        3 * 7168 * hopper_policy.SM90_TILE_COST_NS[hopper.SM90_CONFIG.tile_name])


def config_setting_names():
    """The names CONFIG_ENV accepts (each must resolve; an unknown one raises): the forms, the forms not yet
    timed and the exact no-pdl one, never a Diagnostic (only the sweep reaches those)."""
    names = set(hopper.SM90_CONFIGS) | set(hopper.SM90_CANDIDATES) | {c.tile_name for c in hopper.SM90_DIAGNOSTICS}
    accepted = set()
    for name in names:
        try:
            assert hopper_policy.config_from_setting(name).tile_name == name
            accepted.add(name)
        except ValueError:
            pass
    return accepted


def test_a_plan_owns_its_descriptor_table_token_counters_and_scratch():
    from nvfp4_group_gemm import submission
    sizes = ((80, 256, 512, 1), (300, 128, 256, 1))
    table_words = 2 * submission.TENSORMAP_I64_PER_GROUP  # (G, 5, 16) Int64
    # the counters after the table, each on its own 128-byte line; the scratch after them, 128-byte aligned
    offsets = (hopper.CLAIMED, hopper.CONVERTED, hopper.PASSED)
    assert sorted({o // 128 for o in offsets}) == [0, 1, 2] and all(o % 4 == 0 for o in offsets)
    assert hopper.COUNTER_BYTES == 3 * 128
    layout = hopper.SM90_PLAN_LAYOUT  # what the host sizes and the kernels address: one object
    assert layout.fixed_offset(2) == 8 * table_words and layout.scratch_offset(2) == 8 * table_words + 384
    for config in hopper.SM90_CONFIGS.values():
        assert config.plan_layout is layout
        assert config.plan_words(sizes) == table_words + 3 * 128 // 8 + (80 * 512 + 300 * 256) * 2 // 8
        assert submission.shape_plan(sizes, -1, 132, config).plan_words == config.plan_words(sizes)
    for config in submission.TILE_CONFIGS.values():  # the B200 kernel: the descriptor table only
        assert config.plan_words(sizes) == table_words


def test_the_token_conversion_addresses_each_scale_factor_in_the_blocked_layout():
    """locate_token_unit: the scale factor of row `row` and 16-K block kb of A
    (`token_scale_offset`); convert_token_units reads a row's 4 scale factors of
    a 64-K block as one word, the next 64 K's SF_BLOCK_BYTES further."""
    from nvfp4_group_gemm.reference import generate_input
    m, n, k = 300, 128, 1024
    data = generate_input((m,), (n,), (k,), 1, seed=11, device="cpu")
    sfa_plain = data[1][0][0].view(torch.uint8)[:, :, 0]  # [M, K/16]
    blocked = data[2][0][0].permute(5, 2, 4, 0, 1, 3).contiguous().view(torch.uint8).flatten()
    for row in (0, 5, 31, 32, 127, 128, 200, 299):
        for kb in range(k // 16):
            assert blocked[hopper.token_scale_offset(row, kb, k)] == sfa_plain[row, kb], (row, kb)
            first = hopper.token_scale_offset(row, kb - kb % 4, k)
            assert first % 4 == 0 and hopper.token_scale_offset(row, kb, k) == first + kb % 4
            if kb % 8 < 4:  # a 128-K stage's second scale word
                assert hopper.token_scale_offset(row, kb + 4, k) == hopper.token_scale_offset(row, kb, k) + \
                    hopper.SF_BLOCK_BYTES


# A form not yet timed, for the tests of how such forms are reached (hopper.SM90_CANDIDATES may be empty)
UNTIMED = hopper.Sm90TileConfig(256, hopper.WEIGHT_ROWS, tile_k=64, widths=(64, 128))


def test_the_configuration_setting(monkeypatch):
    monkeypatch.setitem(hopper.SM90_CANDIDATES, UNTIMED.tile_name, UNTIMED)
    assert hopper_policy.config_from_setting(None) is hopper_policy.config_from_setting("") is hopper.SM90_CONFIG
    assert (hopper_policy.config_from_setting("sm90-192x256-k64-wr-pair")
            == hopper.SM90_CONFIGS["sm90-192x256-k64-wr-pair"])
    assert hopper_policy.config_from_setting("sm90-192x256-k64-wr-pair/round-robin") == hopper.SM90_CONFIGS[
        "sm90-192x256-k64-wr-pair"]
    assert config_setting_names() == (set(hopper.SM90_CONFIGS) | set(hopper.SM90_CANDIDATES)
                                      | {hopper.SM90_NO_PDL.tile_name})
    # custom_kernel's choice and the MoE op's take only timed forms (the cost model prices no other)
    assert not set(hopper.SM90_CANDIDATES) & (set(hopper.SM90_CONFIGS) | set(hopper_policy.SM90_TILE_COST_NS))
    # a form not yet timed: by name, and under the shape's schedule as a timed form (`launcher_for_setting`)
    candidate = next(iter(hopper.SM90_CANDIDATES))
    assert hopper_policy.config_from_setting(candidate) == hopper.SM90_CANDIDATES[candidate]
    bench0 = [(m, 4096, 7168, 1) for m in (80, 176, 128, 72, 64, 248, 96, 160)]
    chosen = hopper_policy.launcher_for_setting(candidate).choose(bench0, 132)
    assert chosen.tile_name == candidate and chosen.schedule == hopper_policy.sm90_schedule(
        bench0, 132, hopper.SM90_CANDIDATES[candidate])
    with pytest.raises(ValueError, match="NVFP4_SM90_CONFIG 'k99': expected one of sm90-"):
        hopper_policy.config_from_setting("k99")


def test_the_register_budget_counts_warps_per_scheduler():
    """ptxas caps a CTA's registers by the warps one of the SM's four
    schedulers holds: 12 warps (two MMA warpgroups and the producer's) -> 3 on
    each -> 168 (what it did for that warp count); setmaxnreg's shares fit."""
    roles = hopper.WARP_ROLES
    assert roles.threads == 12 * 32
    assert hopper.register_budget() == 168
    assert 128 * (roles.producer_registers + 2 * roles.consumer_registers) <= 65536


def test_sweep_picks_configurations_by_name(monkeypatch):
    monkeypatch.setitem(hopper.SM90_CANDIDATES, UNTIMED.tile_name, UNTIMED)
    assert peers.sweep_configs() == list(hopper.SM90_CONFIGS.values())
    # --candidates: the forms not yet timed after the timed ones, selected by name as they are
    assert peers.sweep_configs(candidates=True) == [*hopper.SM90_CONFIGS.values(), *hopper.SM90_CANDIDATES.values()]
    assert [c.tile_name for c in peers.sweep_configs(["256x"], candidates=True)] == [
        name for name in hopper.SM90_CANDIDATES if "256x" in name] != []
    assert peers.sweep_configs(["256x"]) == []
    assert peers.sweep_configs(["128x128"]) == [hopper.SM90_CONFIG]
    assert [c.tile_name for c in peers.sweep_configs(["x256-k64"])] == ["sm90-192x256-k64-wr-pair"]
    with_diagnostics = peers.sweep_configs(["k128-wr"], diagnose=True)
    assert hopper.SM90_CONFIG in with_diagnostics and any(c.diagnostic for c in with_diagnostics)
    assert peers.sweep_configs(["no-such-form"]) == []
    # --diagnose: each selected form's own variants (a decode form's at decode shapes), after the forms
    decode = hopper.SM90_CONFIGS["sm90-32x128-k128-wr-n16"]
    assert peers.sweep_configs(["32x128"], diagnose=True) == [decode, *hopper.diagnostics_of(decode)]
    assert {(c.diagnostic, c.pdl) for c in hopper.diagnostics_of(decode)} == {
        *((d, True) for d in hopper.Diagnostic), (None, False)}
    assert all(dataclasses.replace(c, diagnostic=None, pdl=True) == decode for c in hopper.diagnostics_of(decode))


@pytest.mark.parametrize("tile_k", sorted({c.tile_k for c in hopper.SM90_CONFIGS.values()}))
def test_the_token_conversion_stores_the_tokens_in_the_k_order_the_weights_fragments_have(tile_k):
    """Both operands of wgmma must hold the same physical K at each logical K:
    the weights as dequantize_a_fragment places them (`stage_k_order`), the
    tokens as convert_token_units stores them (chunk g of a stage: word
    q * lane_words + g of quarter q, its pair jj at `token_pair`)."""
    order = hopper.stage_k_order(tile_k)
    assert sorted(order) == list(range(tile_k))  # a permutation of the stage's K
    words = hopper.lane_words(tile_k)
    stored = [None] * tile_k
    for g in range(tile_k // hopper.TOKEN_CHUNK_K):
        for q in range(4):
            word = q * words + g
            for jj in range(4):
                pair = 16 * g + hopper.token_pair(q, jj)  # fp16 pair index within the stage's row
                for p in range(2):
                    assert stored[2 * pair + p] is None
                    stored[2 * pair + p] = 8 * word + jj + 4 * p
    assert stored == order
    # the two values of each fp16 pair come from one 16-K block: one scale factor per pair on both sides
    for logical in range(0, tile_k, 2):
        assert order[logical] // 16 == order[logical + 1] // 16


@pytest.mark.parametrize("tile_k", sorted({c.tile_k for c in hopper.SM90_CONFIGS.values()}))
def test_a_warps_fragment_loads_read_consecutive_bytes(tile_k):
    """dequantize_a_fragment: lane (q, row r of 8) reads quarter q of row r's
    packed stage, so a warp's 32 lanes read 8 consecutive rows' bytes once
    each (no bank conflicts, no broadcast)."""
    row_bytes = tile_k // 2
    quarter = row_bytes // 4
    for first in range(0, 128, 8):
        spans = sorted((r * row_bytes + q * quarter, quarter) for r in range(first, first + 8) for q in range(4))
        assert [start for start, _ in spans] == list(range(first * row_bytes, (first + 8) * row_bytes, quarter))


def test_a_setting_may_name_a_schedule():
    """CONFIG_ENV "NAME/SCHEDULE" (or "/SCHEDULE" for the default form): how the schedules are timed on an H200."""
    config = hopper_policy.config_from_setting("/contiguous+balanced")
    assert config.schedule == submission.Schedule(contiguous=True, balanced_ctas=True)
    assert config.with_schedule(submission.Schedule()) == hopper.SM90_CONFIG
    assert config.name == f"{hopper.SM90_CONFIG.tile_name}/contiguous+balanced"
    named = hopper_policy.config_from_setting(f"{hopper.SM90_CONFIG.tile_name}-no-pdl/by-m")
    assert not named.pdl and named.diagnostic is None
    assert named.schedule.groups_by_m and not named.schedule.contiguous
    with pytest.raises(ValueError, match="unknown"):
        hopper_policy.config_from_setting("/diagonal")
    with pytest.raises(ValueError, match="expected one of"):
        hopper_policy.config_from_setting("sm90-nonesuch/contiguous")


@pytest.mark.parametrize("tile_k", sorted({c.tile_k for c in hopper.SM90_CONFIGS.values()}))
def test_the_token_staging_is_conflict_free_and_its_stores_cover_the_claim_once_in_order(tile_k):
    """convert_token_units: lane l stages its unit at row l (`token_staging_stride`), then store c of lane l
    writes the claim's bytes 512 c + 16 l from (row, byte) `staged_chunk`. Shared memory serves a 16-byte
    access 8 lanes (128 bytes) per phase: no two lanes of a phase may share a bank. Every staged byte goes
    to the scratch once, to unit row's place (row tile_k 2 + byte)."""
    stride, unit_bytes = hopper.token_staging_stride(tile_k), tile_k * 2
    units = 32 * hopper.TOKEN_UNITS_PER_LANE

    def conflict_free(addresses):  # one 16-byte access per lane
        for phase in range(0, 32, 8):
            banks = [(a // 4 + w) % 32 for a in addresses[phase:phase + 8] for w in range(4)]
            if len(set(banks)) != len(banks):
                return False
        return True
    for i in range(hopper.TOKEN_UNITS_PER_LANE):
        for piece in range(unit_bytes // 16):  # the lanes' staging stores: row 32 i + lane
            assert conflict_free([(lane + 32 * i) * stride + 16 * piece for lane in range(32)])
    written = []
    for c in range(units * unit_bytes // 512):
        chunks = [hopper.staged_chunk(c, lane, tile_k) for lane in range(32)]
        assert conflict_free([row * stride + byte for row, byte in chunks])
        written += [(row, byte, 512 * c + 16 * lane) for lane, (row, byte) in enumerate(chunks)]
    assert sorted((row, byte) for row, byte, _ in written) == [(r, b) for r in range(units)
                                                              for b in range(0, unit_bytes, 16)]
    assert all(scratch == row * unit_bytes + byte for row, byte, scratch in written)
    # the padding keeps no unit's bytes: a row's 16-byte pieces end before the next row starts
    assert unit_bytes < stride and stride % 16 == 0


def test_the_epilogue_staging_is_conflict_free_and_its_pieces_cover_it_once():
    """Epilogue: a warp's 2-byte staging stores (thread quad lane q, row r of 8:
    token 2 q + p + 8 j, weight column r + 8 i of its warp's 16) fall in
    different banks for different words; the 16-byte pieces the warpgroup's
    128 threads store cover each staged row's 64 columns once, aligned, and no row past the tile."""
    halves = hopper.EPILOGUE_ROW_HALVES
    for warp in range(4):
        for i in range(2):
            for j in range(hopper.EPILOGUE_TOKENS // 8):
                for p in range(2):
                    words = {((2 * (lane % 4) + p + 8 * j) * halves + 16 * warp + lane // 4 + 8 * i) * 2 // 4
                             for lane in range(32)}
                    assert len({w % 32 for w in words}) == len(words)  # one word per bank
    assert halves >= 64
    # a pass stores EPILOGUE_TOKENS rows, or a tile's, where the tile is narrower (`epilogue`'s pieces): the
    # pieces cover exactly those rows, so a tile never stores the rows of the tile after it
    for config in hopper.SM90_CONFIGS.values():
        assert config.tile_m % hopper.EPILOGUE_TOKENS == 0 or hopper.EPILOGUE_TOKENS % config.tile_m == 0
        rows = min(hopper.EPILOGUE_TOKENS, config.tile_m)
        pieces = sorted(t + 128 * r for t in range(128) for r in range(rows * 64 // 8 // 128))
        assert pieces == list(range(rows * 8))
        assert all((piece // 8 * halves + 8 * (piece % 8)) * 2 % 16 == 0 for piece in pieces)


def test_the_moe_forms_choice_needs_only_the_hosts_sizes():
    """moe_choice: a device_offsets form the op's plans compile, the same for the same (T, E, N, K, SMs), its
    schedule contiguous only past one wave (never for a narrow form); moe_routings: T tokens each time, loads
    that vary by about MOE_LOAD_VARIATION."""
    import statistics
    for shape in ((1024, 8, 4096, 7168), (1024, 8, 7168, 2048), (16384, 256, 256, 256), (1, 1, 256, 256),
                  (5, 16, 256, 256)):
        config = hopper_policy.moe_choice(*shape, 132)
        assert config.device_offsets and config.tile_name in hopper.SM90_MOE_CONFIGS
        hopper_policy.moe_choice.cache_clear()
        assert hopper_policy.moe_choice(*shape, 132) == config
        tokens, experts, n, _ = shape
        most = ((tokens + (config.tile_m - 1) * min(experts, tokens)) // config.tile_m
                * submission.ceil_div(n, config.tile_n))
        assert config.schedule.contiguous == (most > 132 // config.cta_group and not config.narrow_tokens)
    routings = hopper_policy.moe_routings(16384, 64, samples=8)
    assert all(sum(r) == 16384 and len(r) == 64 for r in routings)
    variation = statistics.mean(statistics.pstdev(r) / statistics.mean(r) for r in routings)
    assert abs(variation - hopper_policy.MOE_LOAD_VARIATION) < 0.15, variation


def test_the_moe_form_setting_names_a_form_or_says_which_there_are(monkeypatch):
    """The form setting (MOE_FORM_ENV at import, then set_moe_form: to time each form on a workload): a form of
    SM90_MOE_CONFIGS with its schedule, alone; a wrong name is a ValueError naming the setting and the forms,
    from set_moe_form at once; unset, moe_choice's first."""
    monkeypatch.setattr(hopper_policy, "moe_form", hopper_policy.moe_form)  # restored after the test
    hopper_policy.set_moe_form("sm90-128x128-k128-wr-n16-64-offs/contiguous")
    form, = hopper_policy.moe_forms(512, 2, 4096, 1536, 132)
    assert form.tile_name == "sm90-128x128-k128-wr-n16-64-offs" and form.schedule.contiguous
    with pytest.raises(ValueError, match=f"{hopper_policy.MOE_FORM_ENV}.*sm90-128x128-k128-wr-n16-64-offs"):
        hopper_policy.set_moe_form("sm90-128x128-k128-wr-n16-64")
    assert hopper_policy.moe_form == "sm90-128x128-k128-wr-n16-64-offs/contiguous"  # unchanged by the refusal
    monkeypatch.setattr(hopper_policy, "moe_form", "sm90-128x128-k128-wr-n16-64")  # as a bad environment sets it
    with pytest.raises(ValueError, match=f"{hopper_policy.MOE_FORM_ENV}.*sm90-128x128-k128-wr-n16-64-offs"):
        hopper_policy.moe_forms(512, 2, 4096, 1536, 132)
    hopper_policy.set_moe_form(None)
    assert hopper_policy.moe_forms(512, 2, 4096, 1536, 132)[0] == hopper_policy.moe_choice(512, 2, 4096, 1536, 132)


def test_the_moe_form_setting_is_the_environments_at_import():
    """hopper_policy reads MOE_FORM_ENV once, when imported (a fresh interpreter with it set, and without)."""
    code = "from nvfp4_group_gemm import hopper_policy as p; print(p.moe_form)"
    for value, expected in (("sm90-128x128-k128-wr-n16-64-offs", "sm90-128x128-k128-wr-n16-64-offs"),
                            ("", "None")):
        env = dict(os.environ, **{hopper_policy.MOE_FORM_ENV: value})
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                              cwd=Path(__file__).resolve().parents[1])
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().splitlines()[-1] == expected


@pytest.mark.parametrize("shape", [(512, 2, 4096, 1536), (1024, 8, 4096, 7168), (1024, 8, 7168, 2048),
                                   (512, 8, 256, 256), (16384, 256, 256, 256), (1, 1, 256, 256)])
def test_the_default_form_follows_where_some_routing_fits_its_grid_in_one_wave(shape):
    """moe_forms: moe_choice's form, then the default form exactly where moe_choice's is another and the
    routings whose rows are multiples of 128 fit the default form's grid in one wave, and not every routing
    does."""
    tokens, experts, n, k = shape
    forms = hopper_policy.moe_forms(*shape, 132)
    choice = hopper_policy.moe_choice(*shape, 132)
    default = hopper.SM90_CONFIG.tile_name + "-offs"
    default_ctas = min(132, (tokens + 127 * min(experts, tokens)) // 128 * (n // 128))
    assert hopper_policy.moe_one_wave_ctas(tokens, experts, n, 132) == default_ctas
    most = (tokens + 127 * min(experts, tokens)) // 128 * (n // 128)
    fits = -(-tokens // 128) * (n // 128) <= default_ctas < most
    assert forms[0] == choice
    assert [f.tile_name for f in forms[1:]] == ([default] if choice.tile_name != default and fits else [])
    assert len(forms) == len(hopper_policy.MOE_TWO_FORM_RULES) or len(forms) == 1
