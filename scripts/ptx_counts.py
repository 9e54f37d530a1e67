"""Instruction counts of kept PTX files, side by side (a refactor's check that
the generated code keeps its synchronization and data movement).

    python scripts/ptx_counts.py BEFORE_DIR AFTER_DIR   # *.ptx of `eval.py compile --keep DIR`

Prints, per PTX file present in both folders, the count of each instruction
class in each, and exits 1 if any differs."""
import re
import sys
from pathlib import Path

CLASSES = {
    "mma (tcgen05.mma, wgmma)": r"\b(?:tcgen05\.mma|wgmma\.mma_async)\b",
    "tma load": r"\bcp\.async\.bulk\.tensor\.\dd\.shared::(?:cta|cluster)\.global",
    "tma store": r"\bcp\.async\.bulk\.tensor\.\dd\.global\.shared::cta",
    "bulk copy": r"\bcp\.async\.bulk\.shared::(?:cta|cluster)\.global\b",
    "tensormap.replace": r"\btensormap\.replace",
    "tensormap copy+release": r"\btensormap\.cp_fenceproxy",
    "fence": r"\bfence\.",
    "mbarrier": r"\bmbarrier\.",
    "named barrier": r"\b(?:bar|barrier)\.(?:sync|arrive|cta)",
    "prefetch.tensormap": r"\bprefetch\.(?:global\.)?tensormap",
    "griddepcontrol": r"\bgriddepcontrol\.",
}


def counts(ptx: str) -> dict:
    body = "\n".join(line.split("//")[0] for line in ptx.splitlines())  # no comments
    return {name: len(re.findall(pattern, body)) for name, pattern in CLASSES.items()}


def main(argv) -> int:
    before, after = map(Path, argv[:2])
    differ = False
    for path in sorted(before.glob("*.ptx")):
        other = after / path.name
        if not other.exists():
            print(f"{path.name}: not in {after}")
            continue
        a, b = counts(path.read_text()), counts(other.read_text())
        print(f"\n{path.name}")
        print(f"  {'instructions':<26} {'before':>7} {'after':>7}")
        for name in CLASSES:
            mark = "" if a[name] == b[name] else "   <- differs"
            differ |= a[name] != b[name]
            print(f"  {name:<26} {a[name]:>7} {b[name]:>7}{mark}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
