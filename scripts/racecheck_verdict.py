"""Reads a `compute-sanitizer --tool racecheck` log and passes it only if every
race it reports is the one proven to be racecheck's blind spot.

The pattern (scripts/racecheck_pattern.py shows racecheck flagging it alone,
with or without a fence.proxy.async on either side): ordinary shared-memory
loads of a pipeline stage, the stage released on its mbarrier, then a bulk copy
(`cp.async.bulk`, the async proxy) into that stage once the release is seen.
In the Hopper kernel that is the SFB stages: written by the bulk copy in
`load_stage`, read where `dequantize_a_fragment` loads `scale_words`. A report
passes only when every write is that exact statement, every read that exact
statement, every access in the Hopper GEMM's kernel, and, where the report
says which (racecheck's hazard form), the hazard is write-after-read. Locations
come from line information (CUTE_DSL_LINEINFO=1), so a log without it fails
rather than passing blindly.

Both of racecheck's report forms are read: its analysis form ("Race reported
between Write access at X in FILE:LINE:KERNEL and Read access at ..." plus one
"and ... access" line per further access) and its hazard form ("Potential WAR
hazard detected at __shared__ ..." then one "Write Thread ... at X in
FILE:LINE:KERNEL" and one "Read Thread ..." line), at any priority (Error,
Warning, ERROR, WARN, INFO). Every other line that speaks of a race or hazard
fails the log, and the reports read must add up to the summary's count.
The pattern's own kernel (`ring` in racecheck_pattern.py) is allowed only with
--pattern, for that script's log; its negative control (a read before the wait,
the `early-read` variant) is on a line of its own, which no log may pass with.
Usage: python scripts/racecheck_verdict.py [--pattern] LOG; exit 0 pass, 1 fail, 2 usage.
"""
import ast
import re
import sys
from pathlib import Path
from typing import NamedTuple, Optional

ROOT = Path(__file__).resolve().parents[1]
HOPPER = ROOT / "nvfp4_group_gemm" / "hopper.py"
PATTERN_SCRIPT = ROOT / "scripts" / "racecheck_pattern.py"


class Allowed(NamedTuple):
    """The one race a log may hold: the write statement, the read statement (each found by its text, as
    lines move), and the kernel whose symbol holds `kernel`."""
    source: Path
    write: str
    read: str
    kernel: str


PRODUCTION = Allowed(HOPPER, "cute.copy(bulk, src, sSFB", "scales = scale_words[", "Sm90GroupedGemmKernel")
PATTERN = Allowed(PATTERN_SCRIPT, "cute.copy(bulk, src[(None, r)]", "total = total + words[", "ring")
# what speaks of a race in any form ("Race reported", "Potential RAW hazard", ...)
MENTIONS_A_RACE = re.compile(r"race reported|hazard", re.I)
PRIORITY = r"(Error|Warning|ERROR|WARNING|WARN|INFO)"
RACE = re.compile(rf"^=+\s+{PRIORITY}:\s*Race reported between (Read|Write) access at (.*?)"
                  r"(?: \[(\d+) hazards?\])?\s*$")
HAZARD = re.compile(rf"^=+\s+{PRIORITY}:\s*Potential (RAW|WAR|WAW) hazard detected at (.*)$")
ACCESS = re.compile(r"^=+\s+and (Read|Write) access at (.*?)(?: \[(\d+) hazards?\])?\s*$")
THREAD = re.compile(r"^=+\s+(Read|Write) Thread \(.*?\) at (.*)$")
SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
LOCATION = re.compile(r"([\w./-]+\.py):(\d+)(?::(\S+))?")


class Report(NamedTuple):
    first: str  # the report's first line
    direction: Optional[str]  # RAW, WAR or WAW where the form says; None in the analysis form; "unread"
    accesses: list  # (Read or Write, location text, hazards)


def statement_lines(path: Path, needle: str) -> range:
    """The lines of the innermost statement of `path` whose first line holds `needle` (exactly one)."""
    text = path.read_text()
    starts = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    if len(starts) != 1:
        raise ValueError(f"{path.name}: {len(starts)} lines hold {needle!r}, expected one")
    found = [node for node in ast.walk(ast.parse(text))
             if isinstance(node, ast.stmt) and node.lineno == starts[0]]
    end = min((node.end_lineno or node.lineno) for node in found) if found else starts[0]
    return range(starts[0], end + 1)


def placed(location: str, allowed: Allowed, lines: range) -> bool:
    """Whether an access's location text names `allowed.source` at one of `lines`, in a kernel whose name
    holds `allowed.kernel` (the `:KERNEL` after the line, else the symbol the location begins with)."""
    for file, line, kernel in LOCATION.findall(location):
        if Path(file).name == allowed.source.name and int(line) in lines:
            return allowed.kernel in (kernel or location.split("+")[0])
    return False


def read_reports(text: str):
    """[Report] for each report in the log, and its summary counts (None without a summary)."""
    reports, summary = [], None
    for line in text.splitlines():
        race, hazard, access, thread = RACE.match(line), HAZARD.match(line), ACCESS.match(line), THREAD.match(line)
        total = SUMMARY.search(line)
        if total:
            summary = tuple(int(n) for n in total.groups())
        elif race:
            reports.append(Report(line, None, [(race.group(2), race.group(3), int(race.group(4) or 0))]))
        elif hazard:
            reports.append(Report(line, hazard.group(2), []))
        elif access and reports and reports[-1].direction is None:
            reports[-1].accesses.append((access.group(1), access.group(2), int(access.group(3) or 0)))
        elif thread and reports and reports[-1].direction not in (None, "unread"):
            reports[-1].accesses.append((thread.group(1), thread.group(2), 1))
        elif MENTIONS_A_RACE.search(line):  # a form this reader does not know
            reports.append(Report(line, "unread", []))
    return reports, summary


def explained(report: Report, allowed: Allowed, write_lines: range, read_lines: range) -> bool:
    """The report is the proven pattern: write-after-read where the form says, every write (at least one) at
    the allowed write statement (`write_lines`), every read (at least one) at the allowed read statement
    (`read_lines`), all in the allowed kernel. A report may name several instructions of one statement: the
    compiler may emit the statement more than once (DSL 4.5.2's Hopper producer holds four copies of the SFB
    bulk copy, and racecheck lists a read against each)."""
    if report.direction not in (None, "WAR"):
        return False
    writes = [where for access, where, _ in report.accesses if access == "Write"]
    reads = [where for access, where, _ in report.accesses if access == "Read"]
    return (bool(writes) and bool(reads) and all(placed(where, allowed, write_lines) for where in writes)
            and all(placed(where, allowed, read_lines) for where in reads))


def verdict(text: str, pattern: bool = False):
    """(passed, lines to print); `pattern`: the log of racecheck_pattern.py, whose kernel is allowed instead."""
    reports, summary = read_reports(text)
    if summary is None:
        return False, ["racecheck_verdict: no RACECHECK SUMMARY line: racecheck did not finish"]
    unread = [r.first for r in reports if r.direction == "unread"]
    if unread:
        return False, ["racecheck_verdict: reports in a form this verdict does not read:"] + unread[:5]
    if len(reports) != summary[0]:
        return False, [f"racecheck_verdict: the summary counts {summary[0]} reports, {len(reports)} were read: "
                       "reports in a form this verdict does not read"]
    allowed = PATTERN if pattern else PRODUCTION
    lines = statement_lines(allowed.source, allowed.write), statement_lines(allowed.source, allowed.read)
    unexplained = [f"  {r.first.split(': ', 1)[-1]} ({r.direction or 'direction not given'}: "
                   f"{[(a, w) for a, w, _ in r.accesses]})" for r in reports if not explained(r, allowed, *lines)]
    if unexplained:
        return False, ["racecheck_verdict: races outside the proven pattern (or without line information: "
                       "CUTE_DSL_LINEINFO=1):"] + unexplained
    if not reports:
        return True, [f"racecheck_verdict: clean ({summary[0]} hazards displayed)"]
    hazards = sum(n for r in reports for _, _, n in r.accesses)  # each pair's count stands on one side
    return True, [f"racecheck_verdict: {len(reports)} race report(s), {hazards} hazards, all of the proven pattern: "
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
