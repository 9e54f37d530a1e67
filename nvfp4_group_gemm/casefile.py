"""Test files and shape specs: the leaderboard's text format for cases, and the checks a case must pass.

A case is one line of `key: value` parts separated by `;`, a value an integer,
a word, or a list of integers in [] or ():

    m: [64, 200]; n: [256, 512]; k: [512, 256]; g: 2; seed: 7

`read_test_file` and `parse_test_line` read the format as the leaderboard does
(any keys). `check_case` then says whether `generate_input` and the kernel can
take a case: the keys m, n, k, g and seed, one M, N and K per group, and the
shape rules. It imports nothing heavy, so that a command line is judged in a
fraction of a second, before anything is compiled.
"""
import dataclasses
import re
from pathlib import Path
from typing import Optional

# The keys of a case: generate_input's arguments (reference.py; a test checks that they agree).
CASE_KEYS = ("m", "n", "k", "g", "seed")
SPEC_EXAMPLE = "m: [64, 200]; n: [256, 512]; k: [512, 256]; g: 2; seed: 7"
# The shape rules of submission.check_problem_size, which the leaderboard's copy of submission.py must keep to
# itself (it imports only torch, cutlass and task). A test checks that both give the same verdicts.
M_MIN = 1
N_MULTIPLE = 128
K_MULTIPLE = 256
SHAPE_RULES = f"M >= {M_MIN}, N a multiple of {N_MULTIPLE}, K a multiple of {K_MULTIPLE}"

# The task's cases: cases/ at the repository root, linked from (and, installed, inside) this package.
CASES_DIR = Path(__file__).resolve().parent / "cases"
TESTS_FILE = CASES_DIR / "tests.txt"
BENCHMARKS_FILE = CASES_DIR / "benchmarks.txt"

TEST_LINE_PART = re.compile(
    r"\s*([a-zA-Z_]+)\s*:\s*(\[[^\]]*\]|\([^)]*\)|[a-zA-Z_]+|[+-]?[0-9]+)\s*")


class MalformedTestFile(ValueError):
    """A test file that cannot be read, or a line of it that is not a case; the message names the line."""


class BadCase(ValueError):
    """A well-formed case that generate_input or the kernel cannot take; the message says why."""


@dataclasses.dataclass
class TestCase:
    args: dict
    spec: str


def parse_value(text: str):
    try:
        return int(text)
    except ValueError:
        pass
    if (text[0], text[-1]) in (("(", ")"), ("[", "]")):
        inner = text[1:-1].strip()
        try:
            return tuple(int(x.strip()) for x in inner.split(",")) if inner else tuple()
        except ValueError:
            return text
    return text


def parse_test_line(line: str) -> dict:
    """{key: value} of one line; MalformedTestFile names the part that is not `key: value`."""
    case = {}
    for part in line.split(";"):
        match = TEST_LINE_PART.fullmatch(part)
        if not match:
            shown = part.strip() or "(an empty part)"
            raise MalformedTestFile(f"'{shown}' is not 'key: value' (a value is an integer, a word, "
                                    "or a list of integers in [])")
        case[match[1]] = parse_value(match[2])
    return case


def combine_seeds(a: int, b: int) -> int:
    """Mix the secret POPCORN_SEED b into a case's public seed a (Cantor pairing)."""
    return int(a + (a + b) * (a + b + 1) // 2)


def read_test_file(path, seed: Optional[int] = None, check: bool = False) -> list:
    """The cases of a test file, the POPCORN_SEED `seed` mixed into each seed. MalformedTestFile, its message
    "FILE:LINE: what is wrong", for a file that cannot be read or a line that is not a case, and with `check`
    for a case that `check_case` refuses."""
    try:
        content = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise MalformedTestFile(f"{path}: cannot read the test file: {error.strerror or error}") from None
    cases = []
    for number, line in enumerate(content.splitlines(), start=1):
        try:
            args = parse_test_line(line)
            if check:
                check_case(args)
        except ValueError as error:
            raise MalformedTestFile(f"{path}:{number}: {error}") from None
        cases.append(TestCase(args=args, spec=line))
    if seed is not None:
        for case in cases:
            if "seed" in case.args:
                case.args["seed"] = combine_seeds(case.args["seed"], seed)
    return cases


def problem_size_error(g: int, m: int, n: int, k: int) -> Optional[str]:
    """What is wrong with group g's (M, N, K) under the kernel's rules, or None."""
    if m < M_MIN:
        return f"group {g}: M={m}, must be at least {M_MIN}"
    if n < 1 or n % N_MULTIPLE:
        return f"group {g}: N={n} is not a positive multiple of {N_MULTIPLE}"
    if k < 1 or k % K_MULTIPLE:
        return f"group {g}: K={k} is not a positive multiple of {K_MULTIPLE}"
    return None


def check_case(args: dict) -> None:
    """BadCase, with a one-line reason, unless `args` is a case generate_input and the kernel can take."""
    missing = [key for key in CASE_KEYS if key not in args]
    unknown = [key for key in args if key not in CASE_KEYS]
    if missing or unknown:
        what = "; ".join(filter(None, (
            f"missing {', '.join(missing)}" if missing else "",
            f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}" if unknown else "")))
        raise BadCase(f"{what} (a case has m, n and k, lists of one integer per group, g and seed)")
    g, seed = args["g"], args["seed"]
    if not isinstance(g, int) or g < 1:
        raise BadCase(f"g: {g!r} is not a group count (an integer, at least 1)")
    if not isinstance(seed, int):
        raise BadCase(f"seed: {seed!r} is not an integer")
    for key in ("m", "n", "k"):
        value = args[key]
        if not isinstance(value, tuple):
            hint = f" (write {key}: [{value}])" if isinstance(value, int) else ""
            raise BadCase(f"{key}: {value!r} is not a list of integers{hint}")
        if len(value) != g:
            raise BadCase(f"{key} has {len(value)} value{'s' if len(value) != 1 else ''}, g is {g}: "
                          f"one {key.upper()} per group")
    for i, (m, n, k) in enumerate(zip(args["m"], args["n"], args["k"])):
        error = problem_size_error(i, m, n, k)
        if error:
            raise BadCase(f"{error} ({SHAPE_RULES})")


def parse_shape(spec: str) -> dict:
    """The case of a --shape spec; BadCase says what is wrong with it and shows a good one."""
    try:
        args = parse_test_line(spec)
        check_case(args)
    except ValueError as error:
        raise BadCase(f"{error}; expected e.g. \"{SPEC_EXAMPLE}\"") from None
    return args


def problem_sizes_of(args: dict) -> list:
    return [(m, n, k, 1) for m, n, k in zip(args["m"], args["n"], args["k"])]
