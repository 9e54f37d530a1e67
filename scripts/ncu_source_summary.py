"""Where a kernel's warps spend their time, by instruction: Nsight Compute's source view of one profiled
kernel (`ncu --import REPORT --page source --print-source sass --csv > FILE`, as scripts/profile-hopper.sh
writes it) summed by opcode (the sampled warp stalls of each SASS instruction, their share of all samples and
the instructions executed), then the instructions with the most samples and their main stall reasons.

    python scripts/ncu_source_summary.py FILE.csv [--top 20]"""
import argparse
import collections
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def opcode(source: str) -> str:
    """The SASS opcode of a source line, without its predicate: "@!P0 BRA 0x..." -> "BRA"."""
    return re.sub(r"^@!?U?P\w+\s+", "", source.strip()).split(" ")[0]


def read_rows(path) -> list:
    """The CSV's instruction rows as dicts (its first line names the kernel, its second the columns)."""
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    header = next(i for i, line in enumerate(lines) if line and line[0] == "Address")
    columns = lines[header]
    return [dict(zip(columns, line)) for line in lines[header + 1:] if len(line) == len(columns)]


def number(text: str) -> int:
    """A CSV cell's count: "1,584" -> 1584; empty or "-" -> 0."""
    return int(float(text.replace(",", ""))) if text not in ("", "-") else 0


def by_opcode(rows) -> list:
    """(opcode, samples, instructions executed), most samples first."""
    samples, executed = collections.Counter(), collections.Counter()
    for row in rows:
        op = opcode(row["Source"])
        samples[op] += number(row.get(SAMPLES, ""))
        executed[op] += number(row.get(EXECUTED, ""))
    return [(op, n, executed[op]) for op, n in samples.most_common()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=20)
    options = parser.parse_args(argv)
    rows = read_rows(options.csv)
    total = sum(number(r.get(SAMPLES, "")) for r in rows) or 1
    print(f"{len(rows)} instructions, {total} samples")
    print("by opcode:")
    for op, n, executed in by_opcode(rows)[:options.top]:
        print(f"  {op:36s} {n:7d} {100 * n / total:5.1f} %  executed {executed}")
    stalls = [c for c in (rows[0] if rows else {}) if c.startswith("stall_") and "Not Issued" not in c]
    print("by instruction:")
    for row in sorted(rows, key=lambda r: -number(r.get(SAMPLES, "")))[:options.top]:
        reasons = sorted(((number(row[c]), c[len("stall_"):]) for c in stalls), reverse=True)[:3]
        print(f"  {row['Address'][-6:]} {number(row.get(SAMPLES, '')):6d}  {row['Source'].strip()[:56]:56s} "
              + " ".join(f"{name}={n}" for n, name in reasons if n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
