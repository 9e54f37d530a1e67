"""On a GPU: this project's path against torch's grouped GEMM in the same run (`print_peers`), and the sweeps of
every configuration (`eval.py sweep`: the B200's, or hopper.py's forms on a Hopper GPU)."""
import functools
import itertools

from nvfp4_group_gemm.casefile import TESTS_FILE, TestCase, problem_sizes_of, read_test_file
from nvfp4_group_gemm.harness import benchmark_inputs, clone_data, code_path, flush_l2, load_submission
from nvfp4_group_gemm.measure import card_of, describe_error, floor_us, flops_of, geometric_mean, short_spec


# =============================================================================
# Peers on a GPU other than a B200: torch's grouped GEMM in the same run
# =============================================================================
PEER_SAMPLES = 30


def time_loop_us(call, inputs: list, samples: int = PEER_SAMPLES) -> float:
    """Mean microseconds per call over `samples` leaderboard-style samples:
    synchronize, flush L2, events around `call` on every input back to back."""
    import torch
    for data in inputs:  # warm-up: compiles, caches, plans
        call(data)
    total_ms = 0.0
    for _ in range(samples):
        torch.cuda.synchronize()
        flush_l2()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for data in inputs:
            call(data)
        end.record()
        torch.cuda.synchronize()
        total_ms += start.elapsed_time(end)
    return total_ms * 1e3 / samples / len(inputs)


def measured_bf16_peak_tflops() -> float:
    """Dense bf16 TFLOP/s of torch.mm at 8192^3 on this GPU, measured now."""
    import torch
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        torch.mm(a, b)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        torch.mm(a, b)
    end.record()
    torch.cuda.synchronize()
    return 2 * 8192 ** 3 * 20 / (start.elapsed_time(end) * 1e-3) / 1e12


def grouped_operands(data):
    """(A of all groups stacked, B as (G, K, N) with K contiguous, M offsets):
    `torch._grouped_mm`'s operands, bf16, from an input with one N and K."""
    import torch
    from nvfp4_group_gemm import portable
    abc, _, sf_reordered, sizes = data
    a = torch.cat([portable.dequantize_bf16(a, sfa, m, k)
                   for (a, _, _), (sfa, _), (m, _, k, _) in zip(abc, sf_reordered, sizes)])
    b = torch.stack([portable.dequantize_bf16(b, sfb, n, k)
                     for (_, b, _), (_, sfb), (_, n, k, _) in zip(abc, sf_reordered, sizes)])
    offsets = torch.tensor(list(itertools.accumulate(m for m, _, _, _ in sizes)),
                           dtype=torch.int32, device=a.device)
    return a, b.transpose(1, 2), offsets


def grouped_mm_on_bf16(inputs: list):
    """torch._grouped_mm on each input's operands dequantized to bf16
    beforehand (outside the timing): a call taking one of `inputs`."""
    import torch
    prepared = {id(d): grouped_operands(d) for d in inputs}

    def pre_dequantized(data):
        a, b, offsets = prepared[id(data)]
        return torch._grouped_mm(a, b, offs=offsets, out_dtype=torch.bfloat16)
    return pre_dequantized


PEERS_HEADER = (f"  {'#':>2} {'ours':>9} {'grouped_mm':>11} {'deq+gmm':>9} {'portable':>9} "
                f"{'ours TFLOP/s':>12} {'% peak':>7} {'% floor':>8} {'vs gmm':>7}  shape")


def peers_row(index: int, times: tuple, sizes, peak_tflops: float, card, path: str) -> str:
    """One benchmark's line of `print_peers`: `times` (ours, grouped_mm, dequantize-then-grouped_mm, portable;
    us), our TFLOP/s and its share of the measured bf16 peak, and our share of the shape set's floor on `card`
    (`measure.floor_us`: its real FLOPs at the card's fp16 dense rate or its operand and output bytes at its HBM
    bandwidth, whichever takes longer; "-" for a card with no floor known)."""
    ours, gmm, deq, portable_us = times
    tflops = flops_of(sizes) / (ours * 1e-6) / 1e12
    floor = f"{100 * floor_us(sizes, card) / ours:>7.1f}%" if card else f"{'-':>8}"
    return (f"  {index:>2} {ours:>9.2f} {gmm:>11.2f} {deq:>9.2f} {portable_us:>9.2f} "
            f"{tflops:>12.1f} {100 * tflops / peak_tflops:>6.1f}% {floor} {gmm / ours:>6.2f}x  {short_spec(sizes)}"
            f"  [{path}]")


def print_peers(cases: list, rows: list) -> None:
    """Per benchmark: this submission's path, torch._grouped_mm on operands
    already in bf16, dequantize-then-_grouped_mm, and the portable path, all
    timed the same way in this run; TFLOP/s, % of the measured bf16 peak and %
    of the shape set's floor on this card (`peers_row`)."""
    import torch
    from nvfp4_group_gemm import portable
    submission = load_submission()
    if not hasattr(torch, "_grouped_mm"):
        print("\nPeers skipped: this torch has no torch._grouped_mm.")
        return
    peak = measured_bf16_peak_tflops()
    path = code_path(torch.device("cuda"))
    card = card_of(torch.cuda.get_device_name())
    floor = (f"floor: FLOPs at {card.flops_per_s / 1e12:.0f} TFLOP/s or bytes at {card.bytes_per_s / 1e12:.2f} "
             f"TB/s" if card else "no floor known for this card")
    print(f"\nPeers on {torch.cuda.get_device_name()} (mean us per call, leaderboard loop, "
          f"{PEER_SAMPLES} samples; bf16 dense peak measured now: {peak:.0f} TFLOP/s; {floor}):")
    print(PEERS_HEADER)
    for case, row in zip(cases, (r for r in rows if r["kind"] == "benchmark")):
        sizes = problem_sizes_of(case.args)
        if len({(n, k) for _, n, k, _ in sizes}) > 1:  # its B is one (G, K, N) tensor
            print(f"  {row['index']:>2} peers skipped: torch._grouped_mm takes one N and one K for all groups"
                  f"  {short_spec(sizes)}")
            continue
        inputs = benchmark_inputs(case.args)
        ours = row["stats"].mean / 1e3 if row["ok"] else float("nan")
        pre_dequantized = grouped_mm_on_bf16(inputs)

        def dequantize_then(data):
            a, b, offsets = grouped_operands(data)
            return torch._grouped_mm(a, b, offs=offsets, out_dtype=torch.bfloat16)
        try:
            gmm = time_loop_us(pre_dequantized, inputs)
            deq = time_loop_us(dequantize_then, inputs, samples=5)
        except RuntimeError as error:  # e.g. alignment rules of this torch's grouped GEMM
            print(f"  {row['index']:>2} torch._grouped_mm refused: {str(error)[:200]}")
            continue
        portable_us = time_loop_us(portable.run_portable, inputs, samples=5)
        print(peers_row(row["index"], (ours, gmm, deq, portable_us), sizes, peak, card, path))


def sweep_configs(only=None, diagnose: bool = False, candidates: bool = False) -> list:
    """hopper.py's configurations (with `candidates`, also the forms not yet timed: hopper.SM90_CANDIDATES) whose
    names contain any of the substrings in `only` (all when None), and with `diagnose` each one's timing
    diagnostics (`hopper.diagnostics_of`) after them."""
    from nvfp4_group_gemm import hopper
    forms = {**hopper.SM90_CONFIGS, **(hopper.SM90_CANDIDATES if candidates else {})}
    configs = [c for c in forms.values() if not only or any(part in c.tile_name for part in only)]
    return configs + ([d for c in configs for d in hopper.diagnostics_of(c)] if diagnose else [])


def awkward_shape_sets() -> list:
    """Cases beside the task's tests for a first run on new hardware: one and two groups whose M and N leave
    partial tiles."""
    return [TestCase(args={"m": (m, m + 64), "n": (n, n), "k": (512, 256), "g": 2, "seed": m + n},
                     spec=f"m: [{m}, {m + 64}]; n: [{n}, {n}]; k: [512, 256]; g: 2; seed: {m + n}")
            for m in (1, 72, 129, 257) for n in (128, 384)]


@functools.lru_cache(maxsize=None)
def b200_launcher():
    """This module's launcher of submission.py's B200 kernel (its plans apart from custom_kernel's), made once."""
    from nvfp4_group_gemm import submission
    return submission.GroupedGemmLauncher()


def run_b200(data, config):
    """submission.py's B200 kernel on `data` under `config`."""
    return b200_launcher()(data, config)


def sweep_b200(bench_cases: list) -> int:
    """On a B200: every configuration and schedule CONFIG_POLICY may name, checked against the reference on
    the task's tests and `awkward_shape_sets` first; the exact ones timed on the benchmarks (the leaderboard's
    loop); one table to paste into an issue. Exit 1 if any configuration is wrong somewhere."""
    import torch
    from nvfp4_group_gemm import submission
    from nvfp4_group_gemm.reference import check_implementation, generate_input
    checks = read_test_file(TESTS_FILE, check=True) + awkward_shape_sets()
    rows = []
    print(f"sweep on {torch.cuda.get_device_name()}: {len(submission.policy_candidates())} configurations, each "
          f"checked on {len(checks)} cases, then timed on {len(bench_cases)} benchmarks", flush=True)
    for n, config in enumerate(submission.policy_candidates()):
        wrong = []
        for case in checks:
            data = generate_input(**case.args)
            try:
                passed, message = check_implementation(data, run_b200(clone_data(data), config))
            except Exception as error:  # a failed launch is this configuration's verdict
                passed, message = False, describe_error(error)
            if not passed:
                wrong.append(f"{case.spec}: {message[:200]}")
        times = {}
        if not wrong:
            for i, case in bench_cases:
                inputs = benchmark_inputs(case.args)
                times[i] = time_loop_us(lambda data, c=config: run_b200(data, c), inputs)
        modeled = {i: submission.model_time_us(problem_sizes_of(case.args), config).time_us for i, case in bench_cases}
        rows.append({"config": config.name, "exact": f"{len(checks) - len(wrong)}/{len(checks)}", "wrong": wrong,
                     "us": times, "model_us": modeled})
        print(f"  [{n + 1}/{len(submission.policy_candidates())}] {config.name}: "
              f"{'exact' if not wrong else 'WRONG on ' + str(len(wrong)) + ' cases'}", flush=True)
    chosen = {i: submission.choose_config(problem_sizes_of(case.args)).name for i, case in bench_cases}
    print(format_b200_sweep(rows, [i for i, _ in bench_cases], chosen))
    return 1 if any(r["wrong"] for r in rows) else 0


def format_b200_sweep(rows: list, benchmarks: list, chosen: dict) -> str:
    """The sweep's table: per configuration whether it is exact, its mean us per benchmark (* = custom_kernel's
    choice there), their geometric mean, and the cost model's figure for it (a model, not a measurement)."""
    width = max(len(r["config"]) for r in rows) + 1
    lines = [f"{'configuration':<{width}} {'exact':>6} " + " ".join(f"{'#' + str(i) + ' us':>9}" for i in benchmarks)
             + f" {'geomean':>8} {'model':>8}"]
    for r in rows:
        cells = [f"{r['us'][i]:>8.2f}" + ("*" if chosen.get(i) == r["config"] else " ") if i in r["us"]
                 else f"{'-':>9}" for i in benchmarks]
        timed = [r["us"][i] for i in benchmarks if i in r["us"]]
        geomean = f"{geometric_mean(timed):>8.2f}" if timed and len(timed) == len(benchmarks) else f"{'-':>8}"
        model = geometric_mean(r["model_us"][i] for i in benchmarks)
        lines.append(f"{r['config']:<{width}} {r['exact']:>6} " + " ".join(cells) + f" {geomean} {model:>8.2f}")
        lines += [f"    wrong: {w}" for w in r["wrong"][:3]]
    return "\n".join(lines)


def command_sweep(options) -> int:
    """B200: `sweep_b200`. Hopper GPU: every configuration of hopper.py (hopper.SM90_CONFIGS),
    each checked against the reference and timed like the peers, side by side
    with torch._grouped_mm on pre-dequantized bf16, per benchmark; each under the
    schedule custom_kernel gives it for the shape set (`hopper_policy.sm90_schedule`)."""
    import torch
    from nvfp4_group_gemm import submission
    from nvfp4_group_gemm.reference import check_implementation
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (10, 0):
        return sweep_b200(options.bench_cases)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("sweep: needs a B200 (sm_100) or a Hopper GPU (sm_90)")
        return 2
    from nvfp4_group_gemm import hopper, hopper_policy
    from nvfp4_group_gemm.reference import generate_input
    cases = options.bench_cases
    configs = sweep_configs(options.only, options.diagnose, options.candidates)
    if not configs:
        print(f"sweep: no configuration of hopper.py matches {options.only}")
        return 2
    launchers = {c.name: submission.GroupedGemmLauncher(choose=hopper_policy.scheduled_by_shape(c)) for c in configs}
    worst = 0
    for config in [c for c in configs if not c.diagnostic]:  # the task's test shapes first
        verdicts = [check_implementation(data, launchers[config.name](clone_data(data)))
                    for data in (generate_input(**case.args) for case in read_test_file(TESTS_FILE))]
        failed = [(i, message) for i, (passed, message) in enumerate(verdicts) if not passed]
        worst |= bool(failed)
        print(f"{config.tile_name}: {len(verdicts) - len(failed)}/{len(verdicts)} test shapes correct"
              + "".join(f"\n  test {i}: {message[:300]}" for i, message in failed))
    print(f"Hopper configurations, each under custom_kernel's schedule for the shape set, on "
          f"{torch.cuda.get_device_name()} (mean us per call, leaderboard loop, {PEER_SAMPLES} samples; "
          "x = grouped_mm time / ours; * = custom_kernel's default form):")
    print(f"  {'#':>2} {'grouped_mm':>11} " + " ".join(
        f"{c.tile_name + ('*' if c == hopper.SM90_CONFIG else ''):>24}" for c in configs))
    for index, case in cases:
        inputs = benchmark_inputs(case.args)
        gmm = time_loop_us(grouped_mm_on_bf16(inputs), inputs)
        cells = []
        for config in configs:
            launcher = launchers[config.name]
            passed, message = check_implementation(inputs[0], launcher(clone_data(inputs[0])))
            if not passed and not config.diagnostic:
                worst = 1
                cells.append(f"{'FAIL':>24}")
                print(f"  {config.name}: {message[:300]}")
                continue
            ours = time_loop_us(launcher, inputs)
            cells.append(f"{ours:>15.2f} {gmm / ours:>6.2f}x ")
        print(f"  {index:>2} {gmm:>11.2f} " + " ".join(cells)
              + f"  {short_spec(problem_sizes_of(case.args))}")
    return worst
