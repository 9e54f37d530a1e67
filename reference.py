"""Inputs, exact reference and check for NVFP4 block-scaled grouped GEMM.

- `generate_input(m, n, k, g, seed)` makes the leaderboard's inputs. On a CUDA
  device it draws the same random numbers in the same order as the leaderboard,
  so the tensors are identical bit for bit; on a machine without CUDA it makes
  tensors of the same shapes, dtypes, strides and layouts on the CPU (other
  values: the CPU and CUDA generators differ).
- `ref_kernel(data)` computes the result on whatever device holds the data,
  decoding E2M1 and E4M3 from their bits (no `torch._scaled_mm`, which runs only
  on Blackwell) and accumulating in fp32. For the generated inputs every product
  is a multiple of 2^-2 and every partial sum stays far below 2^24 in magnitude,
  so the fp32 sum is exact in any order and the result is unique before the final
  fp16 rounding.
- `check_implementation(data, output)` compares with the leaderboard's tolerance
  and messages and returns `(ok, message)`.

Layouts (docs/contract.md): a [M, K//2, L] and b [N, K//2, L] are float4_e2m1fn_x2 (low
nibble = lower K index), c [M, N, L] float16, sfa [M, K//16, L] and sfb
[N, K//16, L] float8_e4m3fn on the CPU; the reordered scale factors are views of
shape [32, 4, ceil(rows/128), 4, ceil(K/64), L] over storage
[L, ceil(rows/128), ceil(K/64), 32, 4, 4].
"""
import torch

try:  # inside the installed package (nvfp4_group_gemm.task)
    from .task import input_t, output_t
except ImportError:  # a file beside task.py: the leaderboard, the repository root
    from task import input_t, output_t

SF_VEC_SIZE = 16  # K elements per scale factor
RTOL = 1e-03
ATOL = 1e-03
MAX_PRINTED_MISMATCHES = 5


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ----------------------------------------------------------------------------
# Exact decoding of the two narrow formats, from their bit patterns.
# ----------------------------------------------------------------------------
def e2m1_value(nibble: int) -> float:
    """Value of a 4-bit E2M1 code: sign, 2 exponent bits (bias 1), 1 mantissa bit."""
    sign = -1.0 if nibble & 0b1000 else 1.0
    exponent = (nibble >> 1) & 0b11
    mantissa = nibble & 0b1
    if exponent == 0:  # subnormal: 0 or 0.5
        return sign * 0.5 * mantissa
    return sign * (1.0 + 0.5 * mantissa) * 2.0 ** (exponent - 1)


def e4m3_value(byte: int) -> float:
    """Value of an 8-bit E4M3 (fn) code: sign, 4 exponent bits (bias 7), 3 mantissa bits.
    No infinities; exponent 15 with mantissa 7 is NaN."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent = (byte >> 3) & 0xF
    mantissa = byte & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return float("nan")
    if exponent == 0:
        return sign * (mantissa / 8.0) * 2.0 ** -6
    return sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)


E2M1_TABLE = torch.tensor([e2m1_value(i) for i in range(16)], dtype=torch.float32)
E4M3_TABLE = torch.tensor([e4m3_value(i) for i in range(256)], dtype=torch.float32)


def decode_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[rows, K//2] float4_e2m1fn_x2 (or uint8) -> [rows, K] float32."""
    codes = packed.view(torch.uint8)
    low = (codes & 0xF).long()
    high = (codes >> 4).long()
    nibbles = torch.stack((low, high), dim=-1).reshape(codes.shape[0], -1)
    return E2M1_TABLE.to(codes.device)[nibbles]


def decode_e4m3(scales: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn (any shape) -> float32 of the same shape."""
    return E4M3_TABLE.to(scales.device)[scales.view(torch.uint8).long()]


def dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """One operand of one batch: [rows, K//2] FP4 and [rows, K//16] E4M3 -> [rows, K] fp32.
    Each product E2M1 x E4M3 has at most 6 significant bits, so it is exact."""
    values = decode_fp4(packed)
    block_scales = decode_e4m3(scales.to(packed.device))
    return values * block_scales.repeat_interleave(SF_VEC_SIZE, dim=1)


# ----------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------
def reorder_scale_factors(plain: torch.Tensor, rows: int, k: int, device) -> torch.Tensor:
    """Scale factors in the tcgen05 'blocked' layout, as the leaderboard makes them.

    Draws the filler for the padding with one `torch.randint` on `device` (this is
    part of the leaderboard's random sequence), then scatters every real entry
    (row r, scale column j) to [r % 32, (r % 128) // 32, r // 128, j % 4, j // 4, l].
    """
    l = plain.shape[2]
    sf_k = ceil_div(k, SF_VEC_SIZE)
    storage_shape = (l, ceil_div(rows, 128), ceil_div(sf_k, 4), 32, 4, 4)
    filler = torch.randint(1, 3, storage_shape, dtype=torch.int8, device=device)
    blocked = filler.to(dtype=torch.float8_e4m3fn).permute(3, 4, 1, 5, 2, 0)

    r = torch.arange(rows, device=device).view(rows, 1, 1)
    j = torch.arange(sf_k, device=device).view(1, sf_k, 1)
    b = torch.arange(l, device=device).view(1, 1, l)
    blocked[r % 32, (r % 128) // 32, r // 128, j % 4, j // 4, b] = plain.to(device)
    return blocked


def _random_fp4(l: int, rows: int, k: int, device) -> torch.Tensor:
    codes = torch.randint(255, (l, rows, k // 2), dtype=torch.uint8, device=device)
    # Keep each nibble's sign and two low bits: values 0, +-0.5, +-1, +-1.5.
    codes = codes & 0b1011_1011
    return codes.permute(1, 2, 0).view(torch.float4_e2m1fn_x2)


def _random_scales(l: int, rows: int, k: int) -> torch.Tensor:
    sf_k = ceil_div(k, SF_VEC_SIZE)
    codes = torch.randint(1, 3, (l, rows, sf_k), dtype=torch.int8)  # CPU, as the leaderboard
    return codes.to(dtype=torch.float8_e4m3fn).permute(1, 2, 0)


def check_shapes(m, n, k, g) -> None:
    """ValueError naming the argument unless m, n and k are sequences of g integers, one per group, under the
    task's rules (docs/contract.md): M at least 1, N a multiple of 128, K a multiple of 256."""
    if isinstance(g, bool) or not isinstance(g, int) or g < 1:
        raise ValueError(f"generate_input: g: {g!r}: expected the number of groups, an integer of at least 1")
    for name, values in (("m", m), ("n", n), ("k", k)):
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in values):
            hint = f" (for one group: {name}=({values},))" if isinstance(values, int) else ""
            raise ValueError(f"generate_input: {name}: {values!r}: expected a sequence of {g} integers, one per "
                             f"group{hint}")
        if len(values) != g:
            raise ValueError(f"generate_input: {name}: {len(values)} values, g is {g}: one per group")
    for group, (mi, ni, ki) in enumerate(zip(m, n, k)):
        for name, value, rule, ok in (("m", mi, "at least 1", mi >= 1), ("n", ni, "a positive multiple of 128",
                                                                           ni > 0 and ni % 128 == 0),
                                      ("k", ki, "a positive multiple of 256", ki > 0 and ki % 256 == 0)):
            if not ok:
                raise ValueError(f"generate_input: {name}: group {group}: {value}, expected {rule}")


def generate_input(m: tuple, n: tuple, k: tuple, g: int, seed: int, device=None) -> input_t:
    """The leaderboard's inputs for G groups of sizes (m[i], n[i], k[i], 1).

    The order of random draws below is the contract (docs/contract.md): do not reorder.
    """
    check_shapes(m, n, k, g)
    device = torch.device(device) if device is not None else default_device()
    torch.manual_seed(seed)
    l = 1
    abc_tensors, sfasfb_tensors, sfasfb_reordered_tensors, problem_sizes = [], [], [], []
    for mi, ni, ki in zip(m, n, k):
        a = _random_fp4(l, mi, ki, device)
        b = _random_fp4(l, ni, ki, device)
        c = torch.randn((l, mi, ni), dtype=torch.float16, device=device).permute(1, 2, 0)
        sfa = _random_scales(l, mi, ki)
        sfb = _random_scales(l, ni, ki)
        sfa_reordered = reorder_scale_factors(sfa, mi, ki, device)
        sfb_reordered = reorder_scale_factors(sfb, ni, ki, device)
        abc_tensors.append((a, b, c))
        sfasfb_tensors.append((sfa, sfb))
        sfasfb_reordered_tensors.append((sfa_reordered, sfb_reordered))
        problem_sizes.append((mi, ni, ki, l))
    return abc_tensors, sfasfb_tensors, sfasfb_reordered_tensors, problem_sizes


# ----------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------
@torch.no_grad()
def ref_kernel(data: input_t) -> output_t:
    """Exact result per group as new fp16 tensors [M, N, L] on c's device.

    Uses the plain scale factors (`sfasfb_tensors`), not the reordered ones, so
    that it does not share the layout logic a kernel under test relies on.
    """
    abc_tensors, sfasfb_tensors, _, problem_sizes = data
    results = []
    saved_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # keep the fp32 products exact
    try:
        for (a, b, c), (sfa, sfb), (mi, ni, ki, l) in zip(abc_tensors, sfasfb_tensors, problem_sizes):
            out = torch.empty((mi, ni, l), dtype=torch.float16, device=c.device)
            for batch in range(l):
                a_full = dequantize(a[:, :, batch], sfa[:, :, batch])
                b_full = dequantize(b[:, :, batch], sfb[:, :, batch])
                out[:, :, batch] = (a_full @ b_full.t()).to(torch.float16).to(c.device)
            results.append(out)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved_tf32
    return results


# ----------------------------------------------------------------------------
# Check (the leaderboard's tolerance, return value and messages)
# ----------------------------------------------------------------------------
@torch.no_grad()
def mismatch_report(received: torch.Tensor, expected: torch.Tensor,
                    rtol: float = RTOL, atol: float = ATOL) -> list[str]:
    """Empty when |received - expected| <= atol + rtol * |expected| everywhere and
    NaN / +inf / -inf sit at the same places; otherwise lines describing it."""
    if received.shape != expected.shape:
        return ["SIZE MISMATCH"]
    expected = expected.to(received.device)
    out_of_tolerance = (received - expected).abs() > atol + rtol * expected.abs()
    bad = (
        out_of_tolerance
        | (received.isnan() ^ expected.isnan())
        | (received.isposinf() ^ expected.isposinf())
        | (received.isneginf() ^ expected.isneginf())
    )
    count = int(bad.count_nonzero().item())
    if count == 0:
        return []
    lines = [f"Number of mismatched elements: {count}"]
    for index in torch.nonzero(bad)[:MAX_PRINTED_MISMATCHES]:
        i = tuple(index.tolist())
        lines.append(f"ERROR AT {i}: {received[i]} {expected[i]}")
    if count > MAX_PRINTED_MISMATCHES:
        lines.append(f"... and {count - MAX_PRINTED_MISMATCHES} more mismatched elements.")
    return lines


def check_implementation(data: input_t, output: output_t) -> tuple[bool, str]:
    expected = ref_kernel(data)
    if len(output) != len(expected):
        return False, f"output length mismatch: got {len(output)}, expected {len(expected)}"
    for group, (received, wanted) in enumerate(zip(output, expected)):
        reasons = mismatch_report(received, wanted)
        if reasons:
            return False, ("mismatch found! custom implementation doesn't match reference: "
                           f"{group} {reasons}")
    return True, ""
