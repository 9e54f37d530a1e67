"""The table of scripts/ab-benchmarks.sh: per benchmark, the old and new mean
(us) of every round, and new / old of the means. Argument: its output folder."""
import re
import statistics
import sys
from pathlib import Path


def means(path: Path) -> dict:
    found = re.findall(r"^benchmark\.(\d+)\.mean: ([\d.e+]+)$", path.read_text(), re.M)
    return {int(i): float(ns) / 1e3 for i, ns in found}


def main(folder: str) -> int:
    runs = {side: [means(p) for p in sorted(Path(folder).glob(f"{side}-*.txt"))] for side in ("old", "new")}
    cases = sorted(set().union(*runs["old"], *runs["new"]))
    if not cases:
        print("no benchmark means found")
        return 1
    print(f"{'#':>2}  {'old us (rounds)':<24} {'new us (rounds)':<24} new/old")
    for i in cases:
        old = [r[i] for r in runs["old"] if i in r]
        new = [r[i] for r in runs["new"] if i in r]
        ratio = statistics.mean(new) / statistics.mean(old) if old and new else float("nan")
        print(f"{i:>2}  {' '.join(f'{x:.2f}' for x in old):<24} {' '.join(f'{x:.2f}' for x in new):<24} {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
