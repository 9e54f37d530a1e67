"""`eval.py model`: the B200 cost model's choice and modeled time per benchmark (model figures, not
measurements), its fit to public B200 results, and the residuals."""
import dataclasses
import math

from nvfp4_group_gemm.casefile import BENCHMARKS_FILE, problem_sizes_of, read_test_file
from nvfp4_group_gemm.measure import b200_speed_of_light_ns, geometric_mean, short_spec


# =============================================================================
# Cost model report (model figures, not measurements)
# =============================================================================
# The public B200 results the cost model is fitted to (self-reported; docs/contract.md), each mapped onto a
# configuration and schedule the model expresses. The mappings are this project's reading of the write-ups:
# - "CuTe DSL kernel" (an example-derived CuTe DSL kernel, its final design; 31.0 / 21.1 / 8.8 / 6.5 us): 256x256
#   tiles on a (2,1) cluster (2-CTA MMA) where K = 7168 (benchmark 0), 128x128 elsewhere; each CTA a contiguous
#   block of tiles; 128 of 148 SMs; ready-made descriptors (built once). Its log's earlier geometric means are
#   the same design less the later steps: 16.5 (128x128 everywhere, round-robin, all SMs, descriptors rewritten
#   on the device), 15.9 (+ contiguous), 15.4 (+ 256x256 2-CTA for K = 7168), 14.5 (+ descriptors built once).
# - "gau-nernst" (C++, 27.9 / 19.4 / 8.48 / 6.43 us): 2-CTA MMA with A and B swapped (256 weight rows over the
#   pair; 128 tokens per tile assumed), groups by descending M, round-robin over all SMs, descriptors built once.
# Not expressed by the model: cache policies, SFA multicast, the dynamic-scheduler entries.
PUBLIC_B200_BENCHMARK_US = {"CuTe DSL kernel": (31.0, 21.1, 8.8, 6.5), "gau-nernst": (27.9, 19.4, 8.48, 6.43)}


PUBLIC_B200_LOG_GEOMEAN_US = (("128x128, round-robin, descriptors rewritten", 16.5), ("+ contiguous", 15.9),
                              ("+ 256x256 2-CTA for K = 7168", 15.4), ("+ descriptors built once", 14.5),
                              ("+ 128 of 148 SMs", 13.8))


def public_designs() -> dict:
    """{label: per benchmark (configuration, SMs used, descriptors rewritten)}: the PUBLIC_B200_* designs."""
    from nvfp4_group_gemm import submission
    from nvfp4_group_gemm.submission import Schedule
    square = submission.TILE_CONFIGS["128x128"]
    # the 2-CTA designs as the model expresses them (submission.py's kernel has no 2-CTA form)
    pair = submission.TileConfig(256, 256, cta_group=2)
    swapped_pair = submission.TileConfig(256, 128, swap_ab=True, cta_group=2, schedule=Schedule(groups_by_m=True))

    def log_step(step: int):
        contiguous = Schedule(contiguous=step >= 1)
        configs = [pair if step >= 2 and i == 0 else square for i in range(4)]
        return [(c.with_schedule(contiguous), 128 if step >= 4 else submission.SM100_SM_COUNT,
                 step < 3) for c in configs]
    designs = {f"log: {label}": log_step(step) for step, (label, _) in enumerate(PUBLIC_B200_LOG_GEOMEAN_US)}
    designs["CuTe DSL kernel"] = log_step(4)
    designs["gau-nernst"] = [(swapped_pair, submission.SM100_SM_COUNT, False)] * 4
    return designs


def public_points() -> list:
    """(label, benchmark index or None for a geometric mean, published us)."""
    points = [(label, i, us) for label, times in PUBLIC_B200_BENCHMARK_US.items() for i, us in enumerate(times)]
    points += [(f"log: {label}", None, us) for label, us in PUBLIC_B200_LOG_GEOMEAN_US[:-1]]
    return points


def modeled_public_points(constants=None) -> list:
    """(label, benchmark or None, published us, modeled us) for every public point under `constants`."""
    from nvfp4_group_gemm import submission
    constants = constants or submission.MODEL_CONSTANTS
    sizes = [problem_sizes_of(c.args) for c in read_test_file(BENCHMARKS_FILE)]
    designs = public_designs()
    per_benchmark = {label: [submission.model_time_us(s, c, sms, rewrite, constants).time_us
                             for s, (c, sms, rewrite) in zip(sizes, design)] for label, design in designs.items()}
    return [(label, i, us, per_benchmark[label][i] if i is not None else geometric_mean(per_benchmark[label]))
            for label, i, us in public_points()]


def model_floor_us(sizes, constants) -> float:
    """What the model allows any design at best: the unique bytes at the sustained DRAM rate, plus the fixed cost
    per call (no CTA's work, no latency)."""
    from nvfp4_group_gemm import submission
    return submission.model_time_us(sizes, submission.TILE_CONFIGS["128x128"], constants=constants).dram_us \
        + constants.fixed_s * 1e6


FIT_BOUNDS = {"dram_efficiency": (0.3, 1.0), "latency_s": (0.2e-6, 5e-6), "tile_overhead_s": (0.0, 2e-6),
              "fixed_s": (0.2e-6, 10e-6), "descriptor_rewrite_s": (0.0, 3e-6)}


def fit_model_constants(iterations: int = 300):
    """The ModelConstants minimizing the squared log residuals over `public_points` (Nelder-Mead over each
    constant's position in FIT_BOUNDS, from the middle of every range; deterministic)."""
    from nvfp4_group_gemm import submission
    names = submission.ModelConstants._fields
    lows, highs = [FIT_BOUNDS[n][0] for n in names], [FIT_BOUNDS[n][1] for n in names]

    def constants_at(x):
        return submission.ModelConstants(*(lo + (hi - lo) * min(1.0, max(0.0, v))
                                           for v, lo, hi in zip(x, lows, highs)))

    def loss(x):
        return sum(math.log(model / published) ** 2
                   for _, _, published, model in modeled_public_points(constants_at(x)))
    n = len(names)
    simplex = [[0.5] * n] + [[0.5 + (0.25 if i == j else 0.0) for j in range(n)] for i in range(n)]
    scored = sorted((loss(x), x) for x in simplex)
    for _ in range(iterations):
        (best, _), (worst, x_worst) = scored[0], scored[-1]
        centroid = [sum(x[j] for _, x in scored[:-1]) / n for j in range(n)]
        toward = lambda t: [c + t * (w - c) for c, w in zip(centroid, x_worst)]
        reflected = toward(-1.0)
        r = loss(reflected)
        if r < best:
            expanded = toward(-2.0)
            e = loss(expanded)
            scored[-1] = (e, expanded) if e < r else (r, reflected)
        elif r < scored[-2][0]:
            scored[-1] = (r, reflected)
        else:
            contracted = toward(0.5)
            c = loss(contracted)
            if c < worst:
                scored[-1] = (c, contracted)
            else:  # shrink toward the best
                x_best = scored[0][1]
                scored = [scored[0]] + [(loss(y), y) for y in
                                        ([b + 0.5 * (v - b) for b, v in zip(x_best, x)] for _, x in scored[1:])]
        scored.sort()
    return constants_at(scored[0][1]), scored[0][0]


def command_model(options) -> int:
    from nvfp4_group_gemm import submission
    cases = [case for _, case in options.bench_cases]
    constants = submission.MODEL_CONSTANTS
    if options.fit:
        constants, loss = fit_model_constants()
        print(f"fitted (squared log residuals {loss:.4f}); to use them, set submission.MODEL_CONSTANTS to:")
        print("  " + repr(submission.ModelConstants(*(float(f"{v:.3g}") for v in constants))))
    names = list(submission.TILE_CONFIGS)
    print("MODEL FIGURES for a B200, not measurements (submission.py, 'Cost model'; constants fitted to public "
          "B200 results):")
    print("  " + ", ".join(f"{n} {v * 1e6:.3g} us" if n.endswith("_s") else f"{n} {v:.3g}"
                           for n, v in constants._asdict().items()))
    print(f"  {'#':>2} {'chosen configuration/schedule':<36} {'CTAs':>4} {'model us':>9} {'SOL us':>7}  "
          + "  ".join(f"{n + ' us':>16}" for n in names) + "  shape")
    chosen_times, terms = [], []
    for i, case in enumerate(cases):
        sizes = problem_sizes_of(case.args)
        modeled = lambda c: submission.model_time_us(sizes, c, constants=constants).time_us
        config = submission.choose_config(sizes) if constants is submission.MODEL_CONSTANTS else min(
            submission.model_candidates(), key=modeled)
        chosen = submission.model_time_us(sizes, config, constants=constants)
        best_of = {n: min(submission.model_time_us(sizes, c, constants=constants).time_us
                          for c in submission.model_candidates() if c.tile_name == n) for n in names}
        sol_us = b200_speed_of_light_ns(sizes) / 1e3
        chosen_times.append(chosen.time_us)
        rewrite = submission.model_time_us(sizes, config, rewrite_descriptors=True, constants=constants)
        no_pdl = submission.model_time_us(sizes, dataclasses.replace(config, pdl=False), constants=constants)
        terms.append((i, chosen, rewrite, no_pdl))
        print(f"  {i:>2} {config.name:<36} {chosen.ctas:>4} {chosen.time_us:>9.2f} {sol_us:>7.3f}  "
              + "  ".join(f"{best_of[n]:>16.2f}" for n in names) + f"  {short_spec(sizes)}")
    geomean = geometric_mean(chosen_times)
    sol = geometric_mean(b200_speed_of_light_ns(problem_sizes_of(c.args)) / 1e3 for c in cases)
    floor = geometric_mean(model_floor_us(problem_sizes_of(c.args), constants) for c in cases)
    print(f"  modeled geometric mean: {geomean:.2f} us (speed of light {sol:.2f} us, ratio {sol / geomean:.2f}); "
          f"the model's floor for any design: {floor:.2f} us (sustained DRAM time plus the fixed cost per call)")
    print("  per-call gap beyond the fixed cost and descriptor waits of the busiest CTA, chosen configuration:")
    print(f"  {'#':>2} {'gap us (PDL)':>12} {'gap us (none)':>13} {'built once us':>13} {'rewritten us':>12}"
          f" {'model us if rewritten':>21}")
    for i, est, rewrite, no_pdl in terms:
        print(f"  {i:>2} {est.gap_us:>12.2f} {no_pdl.gap_us:>13.2f} {est.descriptor_us:>13.2f}"
              f" {rewrite.descriptor_us:>12.2f} {rewrite.time_us:>21.2f}")
    if not options.shape:
        print("  residuals against the public B200 results (PUBLIC_B200_* in eval.py; # = benchmark, "
              "- = geometric mean):")
        print(f"  {'design':<52} {'#':>2} {'published us':>12} {'model us':>9} {'model/published':>15}")
        for label, index, published, modeled in modeled_public_points(constants):
            print(f"  {label:<52} {'-' if index is None else index:>2} {published:>12.2f} {modeled:>9.2f} "
                  f"{modeled / published:>15.2f}")
    return 0
