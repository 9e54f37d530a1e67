"""custom_kernel against bf16 torch._grouped_mm across M: G groups of M tokens each at the two MoE expert
shapes of the benchmarks (N 4,096 / K 7,168 and N 7,168 / K 2,048), each point's floor on this card and the
share of it each side reaches (`measure.floor_us`: the real FLOPs at the fp16 dense rate, or the operand and
output bytes at the HBM bandwidth, whichever is longer; bf16's floor from its own bytes), timed as the
leaderboard times (`peers.time_loop_us`) in one run, every point checked against the reference first.

    python scripts/m_sweep.py [--m 1,16,64,...] [--groups 8] [--card H100]

Then the points slower than a larger M of the same shape, if any (the decode goal: no M slower than a larger
one). Without a GPU it prints the floors alone (on --card, default H100)."""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nvfp4_group_gemm.cli import comma_ints  # noqa: E402

SHAPES = ((4096, 7168), (7168, 2048))  # (N, K): a DeepSeek-V3 expert's gate_up and down GEMMs
M_VALUES = (1, 16, 64, 128, 192, 256, 384, 512, 1024)


def bf16_floor_us(sizes, card) -> float:
    """torch._grouped_mm on bf16 operands: its FLOPs at the same rate, or A, B at 2 bytes and C at 2."""
    from nvfp4_group_gemm.measure import flops_of
    data = sum(2 * (m * k + n * k + m * n) for m, n, k, _ in sizes)
    return 1e6 * max(flops_of(sizes) / card.flops_per_s, data / card.bytes_per_s)


def slower_than_larger(times: dict) -> list:
    """(N, K, M, the larger M, its time) for each timed point slower than a larger M of its shape, the largest
    such M's time named; `times` maps (N, K, M) to us."""
    found = []
    for (n, k, m), us in sorted(times.items()):
        faster = [(other, t) for (n2, k2, other), t in times.items() if (n2, k2) == (n, k) and other > m and t < us]
        if faster:
            found.append((n, k, m, *max(faster)))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=comma_ints(1), default=list(M_VALUES), help="tokens per group, comma-separated")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--card", default=None, help="the card whose floor is printed (default: this GPU's, "
                                                     "or H100 without one)")
    options = parser.parse_args(argv)
    import torch
    from nvfp4_group_gemm import measure
    gpu = torch.cuda.is_available()
    name = options.card or (torch.cuda.get_device_name() if gpu else "H100")
    card = measure.card_of(name)
    if card is None:
        parser.error(f"--card {name}: no floor known (known: {', '.join(c.name for c in measure.CARDS)})")
    ms = options.m
    g = options.groups
    print(f"G = {g} groups of M tokens; floor on the {card.name}: FLOPs at {card.flops_per_s / 1e12:.0f} TFLOP/s "
          f"or bytes at {card.bytes_per_s / 1e12:.2f} TB/s" + ("" if gpu else " (no GPU: floors only)"))
    print(f"  {'N':>5} {'K':>5} {'M':>5} {'floor us':>9} {'ours us':>9} {'% floor':>8} {'bf16 floor':>10} "
          f"{'gmm us':>9} {'% floor':>8} {'vs gmm':>7}")
    if gpu:
        from nvfp4_group_gemm.harness import benchmark_inputs, load_submission
        from nvfp4_group_gemm.peers import grouped_mm_on_bf16, time_loop_us
        from nvfp4_group_gemm.reference import check_implementation
        submission = load_submission()
    failed, times = False, {}
    for n, k in SHAPES:
        for m in ms:
            sizes = [(m, n, k, 1)] * g
            floor, bf16_floor = measure.floor_us(sizes, card), bf16_floor_us(sizes, card)
            line = f"  {n:>5} {k:>5} {m:>5} {floor:>9.2f}"
            if gpu:
                args = {"m": (m,) * g, "n": (n,) * g, "k": (k,) * g, "g": g, "seed": 1000 + m}
                inputs = benchmark_inputs(args)
                ok, message = check_implementation(inputs[0], submission.custom_kernel(inputs[0]))
                if not ok:
                    failed = True
                    print(f"{line}  WRONG: {message[:200]}", flush=True)
                    continue
                ours = times[n, k, m] = time_loop_us(submission.custom_kernel, inputs)
                gmm = time_loop_us(grouped_mm_on_bf16(inputs), inputs)
                line += (f" {ours:>9.2f} {100 * floor / ours:>7.1f}% {bf16_floor:>10.2f} {gmm:>9.2f} "
                         f"{100 * bf16_floor / gmm:>7.1f}% {gmm / ours:>6.2f}x")
            else:
                line += f" {'':>9} {'':>8} {bf16_floor:>10.2f}"
            print(line, flush=True)
    for n, k, m, larger, us in slower_than_larger(times):
        print(f"  N {n}, K {k}: M = {m} ({times[n, k, m]:.2f} us) is slower than M = {larger} ({us:.2f} us)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
