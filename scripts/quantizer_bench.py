"""The token quantizer's two configurations side by side, in one process: the value-by-value kernel and the
paired one (`token_quantizer.PAIRED`, the default), each checked to give the other's bytes, then each
replayed from a CUDA graph at T x K, alternating rounds, with its bandwidth (bytes read and written over the
replayed time) against the card's HBM bandwidth.

    python scripts/quantizer_bench.py [--tokens 4096] [--k 7168] [--experts 8] [--rounds 2]
                                      [--paired-ctas 4,5,6] [--table] [--lean] [--table-ctas 4,5] [--swiglu]
                                      [--graph-calls 1]

--paired-ctas also times the paired kernel on those many CTAs an SM (`PAIRED_CTAS_PER_SM`); --table the paired
kernel reading its thresholds from a table in shared memory (`THRESHOLD_TABLE`, on `TABLE_CTAS_PER_SM`);
--lean the paired kernel (and with --table the table's, on `LEAN_TABLE_CTAS_PER_SM`) with the lean loop
(`LEAN_LOOP`); --table-ctas also the table's kernels on those many CTAs an SM (what the loop gains apart from
what more CTAs gain). The decode scale is one value (0.37). --swiglu times the kernels that quantize SwiGLU of
a (T, 2K) h instead (`mlp.swiglu_quantized`, gate and up in halves). --graph-calls N: each graph holds N calls
back to back, as kernels follow each other in a model's graph (the time per call then counts the gap between
graph replays once for N calls). Without a Hopper or B200 GPU it prints what it would move and exits."""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nvfp4_group_gemm.cli import comma_ints, int_between  # noqa: E402


def moved_bytes(tokens: int, k: int, experts: int, swiglu: bool = False) -> int:
    """x read (bf16; with SwiGLU, h's gate and up: twice as much), the codes and the whole scale buffer
    written."""
    from nvfp4_group_gemm import moe
    return (tokens * k * 2 * (2 if swiglu else 1) + tokens * k // 2
            + moe.worst_case_scale_rows(tokens, experts) * moe.scale_width(k))


def routing(tokens: int, experts: int, generator):
    """offs of `experts` uneven groups (one empty) covering the tokens."""
    import torch
    weights = torch.rand(experts, generator=generator) + 0.2
    weights[experts // 2] = 0.0
    counts = (weights / weights.sum() * tokens).floor().long()
    counts[0] += tokens - int(counts.sum())
    return counts.cumsum(0).to(torch.int32)


def timed_settings(options) -> list:
    """What the options time, in order: (label, the paired configuration's CTAs an SM, or None for the
    value-by-value one; whether it reads a threshold table; whether its loop is lean; the table's CTAs an SM,
    None for its own)."""
    from nvfp4_group_gemm import token_quantizer as tq
    paired_per_sm = tq.PAIRED_SWIGLU_CTAS_PER_SM if options.swiglu else tq.PAIRED_CTAS_PER_SM
    settings = [("value by value", None, False, False, None), ("paired", paired_per_sm, False, False, None)]
    settings += [(f"paired, {n} CTAs an SM", n, False, False, None) for n in options.paired_ctas]
    if options.lean:
        settings.append(("paired, lean loop", paired_per_sm, False, True, None))
    for lean in (False, True) if options.table and options.lean else (False,) if options.table else ():
        label = "paired, threshold table" + (", lean loop" if lean else "")
        own = tq.grid_per_sm(options.swiglu, True, lean)
        settings.append((f"{label}, {own} CTAs an SM", paired_per_sm, True, lean, None))
        settings += [(f"{label}, {n} CTAs an SM", paired_per_sm, True, lean, n) for n in options.table_ctas
                     if n != own]
    return settings


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--k", type=int, default=7168)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--paired-ctas", type=comma_ints(1), default=[],
                        help="comma-separated CTAs an SM for the paired kernel")
    parser.add_argument("--table", action="store_true", help="also the paired kernel with a threshold table")
    parser.add_argument("--lean", action="store_true", help="also the paired kernels with the lean loop")
    parser.add_argument("--table-ctas", type=comma_ints(1), default=[],
                        help="with --table: comma-separated CTAs an SM for the table's kernels too")
    parser.add_argument("--swiglu", action="store_true", help="quantize SwiGLU of a (T, 2K) h instead of x")
    parser.add_argument("--graph-calls", type=int_between(1, 64), default=1, metavar="N",
                        help="calls back to back in each replayed graph (1 to 64; default 1)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    options = parse(argv)
    import torch
    from nvfp4_group_gemm import measure, mlp, token_quantizer as tq
    from nvfp4_group_gemm.mlp_report import graph_us
    moved = moved_bytes(options.tokens, options.k, options.experts, options.swiglu)
    print(f"quantizer{' of SwiGLU' if options.swiglu else ''} at T {options.tokens}, K {options.k}, "
          f"E {options.experts}: {moved / 1e6:.1f} MB read and written a call")
    if not torch.cuda.is_available() or not tq.kernel_device(torch.cuda.current_device()):
        print("no Hopper or B200 GPU here: nothing timed")
        return 0
    card = measure.card_of(torch.cuda.get_device_name())
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(options.tokens, options.k * (2 if options.swiglu else 1), generator=generator).to(
        torch.bfloat16).cuda()
    offs = routing(options.tokens, options.experts, generator).cuda()
    scale = torch.tensor([0.37], device="cuda")
    settings = timed_settings(options)
    table_per_sm = (tq.TABLE_CTAS_PER_SM, tq.LEAN_TABLE_CTAS_PER_SM)

    def run(per_sm, table, lean, table_ctas=None):
        tq.PAIRED, tq.THRESHOLD_TABLE, tq.LEAN_LOOP = per_sm is not None, table, lean
        tq.TABLE_CTAS_PER_SM, tq.LEAN_TABLE_CTAS_PER_SM = (table_ctas, table_ctas) if table_ctas else table_per_sm
        if tq.PAIRED and options.swiglu:
            tq.PAIRED_SWIGLU_CTAS_PER_SM = per_sm
        elif tq.PAIRED:
            tq.PAIRED_CTAS_PER_SM = per_sm
        if options.swiglu:
            return mlp.swiglu_quantized(x, offs, scale)
        return mlp.quantize_tokens_device(x, offs, scale)
    want = [t.view(torch.uint8) for t in run(None, False, False)]
    failed = False
    for label, *setting in settings[1:]:
        same = all(torch.equal(g.view(torch.uint8), w) for g, w in zip(run(*setting), want))
        failed |= not same
        print(f"  {label}: {'the same bytes' if same else 'DIFFERENT BYTES'} as value by value")
    for round_ in range(options.rounds):
        for label, *setting in settings:
            us = graph_us(lambda: run(*setting), per_graph=options.graph_calls)
            share = f", {100 * moved / us * 1e6 / card.bytes_per_s:.1f} % of the {card.name}'s HBM" if card else ""
            per_graph = f" ({options.graph_calls} calls a graph)" if options.graph_calls > 1 else ""
            print(f"  round {round_ + 1}, {label}{per_graph}: {us:7.2f} us, {moved / us / 1e3:6.0f} GB/s{share}",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
