"""Reads a `compute-sanitizer --tool racecheck` log and passes it only if every
race it reports is the one proven to be racecheck's blind spot.

The pattern (scripts/racecheck_pattern.py shows racecheck flagging it alone,
with or without a fence.proxy.async on either side): ordinary shared-memory
loads of a pipeline stage, the stage released on its mbarrier, then a bulk copy
(`cp.async.bulk`, the async proxy) into that stage once the release is seen.
In the Hopper kernel that is the SFB stages: written by `load_stage`, read by
`dequantize_a_fragment`. A race passes when its write lies in an allowed writer
and every read in an allowed reader; locations come from line information
(CUTE_DSL_LINEINFO=1), so a log without it fails rather than passing blindly.
Every line that speaks of a race or hazard must be one the verdict reads, and the reports it read must add
up to the summary's count: a report in a form it does not know fails it rather than passing unseen. The
pattern's own kernel (`ring` in racecheck_pattern.py) is allowed only with --pattern, for that script's log.
Usage: python scripts/racecheck_verdict.py [--pattern] LOG; exit 0 pass, 1 fail, 2 usage.
"""
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (file, function) -> role: where the proven pattern's accesses are allowed to be (production, then --pattern)
WRITERS = {("hopper.py", "load_stage")}
READERS = {("hopper.py", "dequantize_a_fragment")}
PATTERN = {("racecheck_pattern.py", "ring")}
# what speaks of a race in any of racecheck's report forms ("Race reported", "Potential RAW hazard", ...)
MENTIONS_A_RACE = re.compile(r"race reported|hazard", re.I)
SOURCES = {"hopper.py": ROOT / "nvfp4_group_gemm" / "hopper.py",
           "racecheck_pattern.py": ROOT / "scripts" / "racecheck_pattern.py"}
REPORT = re.compile(r"^=+\s+(Error|Warning): (.*)$")
ACCESS = re.compile(r"^=+\s+(?:and )?(Read|Write) access at (.*?)(?: \[(\d+) hazards?\])?\s*$")
FIRST_ACCESS = re.compile(r"Race reported between (Read|Write) access at (.*?)(?: \[(\d+) hazards?\])?\s*$")
SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
LOCATION = re.compile(r"([\w./-]+\.py):(\d+)")


def function_at(path: Path, line: int) -> str:
    """The innermost function of `path` that holds `line` ('' if none)."""
    best, best_start = "", -1
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.lineno <= line <= (node.end_lineno or node.lineno) and node.lineno > best_start:
                best, best_start = node.name, node.lineno
    return best


def place(location: str):
    """(file name, function) of a reported access, from its line information; None without it."""
    for file, line in LOCATION.findall(location):
        name = Path(file).name
        if name in SOURCES:
            return name, function_at(SOURCES[name], int(line))
    return None


def read_races(text: str):
    """[(kind, first line, [(access, location, hazards)])] for each report in the log, and its summary counts."""
    races, summary = [], None
    for line in text.splitlines():
        report, access, total = REPORT.match(line), ACCESS.match(line), SUMMARY.search(line)
        if total:
            summary = tuple(int(n) for n in total.groups())
        elif not (report or access) and MENTIONS_A_RACE.search(line):  # a form this reader does not know
            races.append(("Unread", line, []))
        elif report and "Race reported" in report.group(2):
            races.append((report.group(1), line, []))
            first = FIRST_ACCESS.search(report.group(2))
            if first:
                races[-1][2].append((first.group(1), first.group(2), int(first.group(3) or 0)))
        elif report:  # a hazard report of another form: unexplained
            races.append((report.group(1), line, []))
        elif access and races:
            races[-1][2].append((access.group(1), access.group(2), int(access.group(3) or 0)))
    return races, summary


def verdict(text: str, pattern: bool = False):
    """(passed, lines to print); `pattern`: the log of racecheck_pattern.py, whose kernel is allowed too."""
    races, summary = read_races(text)
    if summary is None:
        return False, ["racecheck_verdict: no RACECHECK SUMMARY line: racecheck did not finish"]
    reported = sum(1 for kind, _, _ in races if kind != "Unread")
    if reported != summary[0]:
        return False, [f"racecheck_verdict: the summary counts {summary[0]} reports, {reported} were read: "
                       "reports in a form this verdict does not read"]
    writers, readers = (WRITERS | PATTERN, READERS | PATTERN) if pattern else (WRITERS, READERS)
    unexplained, hazards = [], 0
    for kind, first, accesses in races:
        writes = [place(where) for access, where, _ in accesses if access == "Write"]
        reads = [place(where) for access, where, _ in accesses if access == "Read"]
        hazards += sum(n for access, _, n in accesses if access == "Read")
        if not (writes and reads and all(w in writers for w in writes) and all(r in readers for r in reads)):
            unexplained.append(f"  {first.split(': ', 1)[-1]} (write {writes}, reads {reads})")
    if unexplained:
        return False, ["racecheck_verdict: races outside the proven pattern (or without line information: "
                       "CUTE_DSL_LINEINFO=1):"] + unexplained
    if not races:
        return True, [f"racecheck_verdict: clean ({summary[0]} hazards displayed)"]
    return True, [f"racecheck_verdict: {len(races)} race report(s), {hazards} hazards, all of the proven pattern: "
                  "a bulk copy into a stage after the stage's mbarrier-ordered LDS reads (racecheck flags it alone "
                  "in scripts/racecheck_pattern.py, fenced or not)"]


def main(argv: list) -> int:
    pattern = argv[:1] == ["--pattern"]
    argv = argv[1:] if pattern else argv
    if len(argv) != 1:
        print("usage: python scripts/racecheck_verdict.py [--pattern] LOG", file=sys.stderr)
        return 2
    passed, lines = verdict(Path(argv[0]).read_text(errors="replace"), pattern)
    print("\n".join(lines))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
