"""Random shape sets drawn by the task's rules, for same-run A/B timing beyond the four benchmarks
(`CASES=cases/random20.txt bash scripts/ab-benchmarks.sh OLD_TREE`): G groups (1 to 8), each with its own M
(1 to 1,024), N (a multiple of 128 up to 7,168) and K (a multiple of 256 up to 7,168), as the task's tests give
each group its own shape. Seeded, so that a file of them can be made again and checked.

    python scripts/random_cases.py [--count 20] [--seed 1111] > cases/random20.txt"""
import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MAX_GROUPS, MAX_M, MAX_N, MAX_K = 8, 1024, 7168, 7168


def draw(count: int, seed: int) -> list:
    """`count` case lines in the leaderboard's format, each with its own input seed."""
    from nvfp4_group_gemm.casefile import K_MULTIPLE, N_MULTIPLE
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        g = rng.randint(1, MAX_GROUPS)
        m = [rng.randint(1, MAX_M) for _ in range(g)]
        n = [N_MULTIPLE * rng.randint(1, MAX_N // N_MULTIPLE) for _ in range(g)]
        k = [K_MULTIPLE * rng.randint(1, MAX_K // K_MULTIPLE) for _ in range(g)]
        lines.append(f"m: {m}; n: {n}; k: {k}; g: {g}; seed: {rng.randint(1, 9999)}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1111)
    args = parser.parse_args(argv)
    print("\n".join(draw(args.count, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
