"""The tables of scripts/ab-benchmarks.sh: per benchmark (or, with SWEEP_M, per m_sweep point:
N, K, M per group), the old and new time (us) of every round, and new / old of the means.
Usage: python scripts/ab_table.py [--m-sweep] FOLDER (the script's output folder)."""
import re
import statistics
import sys
from pathlib import Path


def means(path: Path) -> dict:
    """ab-benchmarks.sh's protocol output: benchmark index -> mean us."""
    found = re.findall(r"^benchmark\.(\d+)\.mean: ([\d.e+]+)$", path.read_text(), re.M)
    return {int(i): float(ns) / 1e3 for i, ns in found}


def sweep_points(path: Path) -> dict:
    """m_sweep.py's table: (N, K, M) -> custom_kernel's us (points without a time, as on a CPU, left out)."""
    found = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+[\d.]+\s+([\d.]+)\s+[\d.]+%.*x\s*$", path.read_text(), re.M)
    return {(int(n), int(k), int(m)): float(us) for n, k, m, us in found}


def main(argv: list) -> int:
    sweep = argv[:1] == ["--m-sweep"]
    folder = Path(argv[-1])
    read, label = (sweep_points, "    N     K     M") if sweep else (means, " #")
    runs = {side: [read(p) for p in sorted(folder.glob(f"{side}-*.txt"))] for side in ("old", "new")}
    cases = sorted(set().union(*runs["old"], *runs["new"]))
    if not cases:
        print("no m_sweep times found" if sweep else "no benchmark means found")
        return 1
    print(f"{label}  {'old us (rounds)':<24} {'new us (rounds)':<24} new/old")
    for case in cases:
        old = [r[case] for r in runs["old"] if case in r]
        new = [r[case] for r in runs["new"] if case in r]
        ratio = statistics.mean(new) / statistics.mean(old) if old and new else float("nan")
        name = " ".join(f"{x:>5}" for x in case) if sweep else f"{case:>2}"
        print(f"{name}  {' '.join(f'{x:.2f}' for x in old):<24} {' '.join(f'{x:.2f}' for x in new):<24} {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
