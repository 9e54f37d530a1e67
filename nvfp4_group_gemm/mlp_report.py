"""`eval.py mlp`: the expert MLP (`mlp.moe_mlp_nvfp4`) on a top-2 router's routings, against the bf16 MLP (two
torch._grouped_mm on the dequantized weights, silu(gate) * up between them) with the same offs.

On a GPU: E = 8 experts of DeepSeek-V3's shape (hidden 7,168, intermediate 2,048: gate_up N 4,096, K 7,168;
down N 7,168, K 2,048) at 512 and 4,096 rows; each side timed eagerly (CUDA events over back-to-back calls)
and replayed from a CUDA graph, the NVFP4 MLP's error against the bf16 MLP printed, the quantizer's and the
activation's share of the MLP's replayed time (each replayed from a graph of its own: GPU time; their eager
calls' times beside, which the host bounds), and the quantizer's bandwidth (bytes read and written over its
replayed time, against the card's HBM bandwidth); the activation timed as the MLP runs it (`swiglu_quantized`);
and each GEMM alone (`gemm_pairs`: the MoE op eager and replayed, grouped_mm on bf16 with the same offs).
Then a CUDA graph captured on one routing is replayed under two new ones copied into the same buffers, each
replay compared with an eager call. Without a GPU: the same checks at a toy shape (hidden 512, intermediate
256, E 4), no timing."""
from typing import NamedTuple

GPU_SHAPE = (8, 7168, 2048)  # E, hidden, intermediate
CPU_SHAPE = (4, 512, 256)
GPU_ROWS = (512, 4096)
CPU_ROWS = (64, 300)
CALLS = 20


class Experts(NamedTuple):
    w13: object
    w13_scale: object
    w2: object
    w2_scale: object
    w13_global: object
    w2_global: object
    w13_bf16: object  # (E, 2I, hidden) the dequantized values, for the bf16 MLP
    w2_bf16: object  # (E, hidden, I)


def make_experts(e: int, hidden: int, inter: int, device, seed: int = 0) -> Experts:
    import torch
    from nvfp4_group_gemm import moe
    gen = torch.Generator(device=device).manual_seed(seed)
    arrays = []
    for n, k in ((2 * inter, hidden), (hidden, inter)):
        w = torch.randn(e, n, k, generator=gen, device=device) / k ** 0.5
        global_ = w.abs().amax(dim=(1, 2)) / (moe.E2M1_MAX * moe.E4M3_MAX)  # each expert's decode scale
        packed, scale = moe.quantize_experts(w, global_)
        values = (moe.decode_experts(packed, scale) * global_.view(-1, 1, 1)).to(torch.bfloat16)
        arrays.append((packed, scale, global_, values))
    (w13, s13, g13, v13), (w2, s2, g2, v2) = arrays
    return Experts(w13, s13, w2, s2, g13, g2, v13, v2)


def top2_routing(rows: int, e: int, hidden: int, device, seed: int):
    """rows / 2 tokens, each sent to its router's top 2 of E experts (logits with per-expert biases, so the
    loads are uneven): the rows sorted by expert (bf16, (rows, hidden)) and offs."""
    import torch
    gen = torch.Generator(device=device).manual_seed(seed)
    tokens = torch.randn(rows // 2, hidden, generator=gen, device=device)
    logits = torch.randn(rows // 2, e, generator=gen, device=device) + torch.linspace(0, 2, e, device=device)
    expert = logits.topk(2, dim=1).indices.reshape(-1)
    order = expert.argsort(stable=True)
    offs = torch.bincount(expert, minlength=e).cumsum(0).to(torch.int32)
    return tokens.repeat_interleave(2, dim=0)[order].to(torch.bfloat16), offs


def per_group(x, w, offs):
    """Each group's rows of x by its w[g] (N, K)^T in fp32, one group at a time (the CPU has no
    torch._grouped_mm)."""
    import torch
    ends = offs.tolist()
    return torch.cat([x[start:end].float() @ w[g].float().t() for g, (start, end) in enumerate(zip([0] + ends[:-1],
                                                                                                    ends))])


def gate_up(x, offs, experts: Experts):
    """The first GEMM on the dequantized weights: torch._grouped_mm on a GPU (bf16), `per_group` on the CPU."""
    import torch
    if x.is_cuda:
        return torch._grouped_mm(x, experts.w13_bf16.transpose(1, 2), offs=offs)
    return per_group(x, experts.w13_bf16, offs)


def activation_scales(x, offs, experts: Experts):
    """The two activations' decode scales, as a calibration pass sets them: amax / (6 x 448) of x and of the
    SwiGLU output of the same rows through the dequantized weights."""
    import torch
    from nvfp4_group_gemm import moe
    largest = moe.E2M1_MAX * moe.E4M3_MAX
    h = gate_up(x, offs, experts).float()
    inter = h.shape[1] // 2
    y = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
    return (x.float().abs().amax() / largest).reshape(()), (y.abs().amax() / largest).reshape(())


def bf16_mlp(x, offs, experts: Experts):
    import torch
    h = gate_up(x, offs, experts)
    inter = h.shape[1] // 2
    y = (torch.nn.functional.silu(h[:, :inter].float()) * h[:, inter:].float()).to(torch.bfloat16)
    return torch._grouped_mm(y, experts.w2_bf16.transpose(1, 2), offs=offs)


def reference_mlp(x, offs, experts: Experts):
    """The bf16 MLP in fp32 per group on the CPU."""
    import torch
    h = gate_up(x, offs, experts)
    inter = h.shape[1] // 2
    return per_group(torch.nn.functional.silu(h[:, :inter]) * h[:, inter:], experts.w2_bf16, offs)


def event_us(fn, calls: int = CALLS) -> float:
    """Mean us of `fn` over `calls` back-to-back calls (CUDA events), after two warm-up calls."""
    import torch
    for _ in range(2):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return 1000 * start.elapsed_time(end) / calls


def graph_us(fn, calls: int = CALLS, per_graph: int = 1) -> float:
    """Mean us of `fn` replayed from a CUDA graph captured after a warm-up call; with `per_graph` > 1 the graph
    holds that many calls back to back (the gap between replays then counts once for them all), per call."""
    import torch
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn()
    return event_us(graph.replay, calls) / per_graph


def command_mlp(options) -> int:
    import torch
    from nvfp4_group_gemm import measure, mlp
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    (e, hidden, inter), row_counts = (GPU_SHAPE, GPU_ROWS) if gpu else (CPU_SHAPE, CPU_ROWS)
    name = torch.cuda.get_device_name() if gpu else "the CPU"
    print(f"moe_mlp_nvfp4 on {name}: E = {e}, hidden {hidden}, intermediate {inter}, top-2 routings"
          + ("" if gpu else " (no GPU: a toy shape, checks only)"))
    experts = make_experts(e, hidden, inter, device)
    failed = False
    for rows in row_counts:
        x, offs = top2_routing(rows, e, hidden, device, seed=rows)
        x_global, h_global = activation_scales(x, offs, experts)

        def nvfp4():
            return mlp.moe_mlp_nvfp4(x, offs, experts.w13, experts.w13_scale, experts.w2, experts.w2_scale,
                                     w13_global=experts.w13_global, w2_global=experts.w2_global, x_global=x_global,
                                     h_global=h_global)
        out = nvfp4()
        want = bf16_mlp(x, offs, experts) if gpu else reference_mlp(x, offs, experts)
        error = float((out.float() - want.float()).norm() / want.float().norm())
        ok = error < 0.25
        failed |= not ok
        line = f"  rows {rows:>5} (loads {min_max(offs)}): error vs the bf16 MLP {error:.3f} {'ok' if ok else 'WRONG'}"
        if gpu:
            ours, ours_graph = event_us(nvfp4), graph_us(nvfp4)
            theirs, theirs_graph = event_us(lambda: bf16_mlp(x, offs, experts)), graph_us(
                lambda: bf16_mlp(x, offs, experts))
            h = torch.empty(rows, 2 * inter, dtype=torch.bfloat16, device=device).normal_()
            steps = (lambda: mlp.quantize_tokens_device(x, offs, x_global),
                     lambda: mlp.swiglu_quantized(h, offs, h_global))  # the MLP's step, fused where it can be
            (quantize, activation), eager = [graph_us(f) for f in steps], [event_us(f) for f in steps]
            line += (f"\n    NVFP4 MLP {ours:8.1f} us eager, {ours_graph:8.1f} replayed; bf16 MLP {theirs:8.1f} / "
                     f"{theirs_graph:8.1f}: {theirs / ours:.2f}x eager, {theirs_graph / ours_graph:.2f}x replayed"
                     f"\n    replayed, quantizer {quantize:.1f} us + activation and requantization {activation:.1f} "
                     f"us: {100 * (quantize + activation) / ours_graph:.0f}% of the NVFP4 MLP (eager calls: "
                     f"{eager[0]:.1f} + {eager[1]:.1f} us)")
            for gemm, (n, k), op, bf16 in gemm_pairs(x, offs, experts, x_global, h_global):
                op_eager, op_replayed, bf16_eager = event_us(op), graph_us(op), event_us(bf16)
                line += (f"\n    {gemm} GEMM alone (N {n}, K {k}): grouped_mm_nvfp4 {op_eager:8.1f} us eager, "
                         f"{op_replayed:8.1f} replayed (eager / replayed {op_eager / op_replayed:.2f}); "
                         f"grouped_mm bf16 {bf16_eager:8.1f}: {bf16_eager / op_eager:.2f}x eager")
            if rows == max(row_counts):
                from nvfp4_group_gemm import token_quantizer
                moved = rows * hidden * 2 + rows * hidden // 2 + moe_scale_bytes(rows, e, hidden)
                card = measure.card_of(name)
                line += (f"\n    quantizer ({token_quantizer.configuration_label()}) at T {rows}, K {hidden}: "
                         f"{moved / quantize / 1e3:.0f} GB/s"
                         + (f" ({100 * moved / quantize * 1e6 / card.bytes_per_s:.0f}% of the "
                            f"{card.name}'s HBM bandwidth)" if card else ""))
        print(line, flush=True)
    failed |= not replays_follow_new_routings(experts, e, hidden, device, gpu)
    return 1 if failed else 0


def gemm_pairs(x, offs, experts: Experts, x_global, h_global) -> list:
    """Each of the MLP's GEMMs on its own: (name, (N, K), the op on NVFP4 operands, grouped_mm on bf16 ones
    (None without a GPU)), with `x`'s routing: gate_up on x quantized, down on SwiGLU of a random (T, 2I)
    quantized (the bf16 side: a random (T, I))."""
    import torch
    from nvfp4_group_gemm import mlp, moe
    rows, n13, (_, hidden, half_inter) = x.shape[0], experts.w13.shape[1], experts.w2.shape
    a, a_scale = mlp.quantize_tokens_device(x, offs, x_global)
    h = torch.empty(rows, n13, dtype=torch.bfloat16, device=x.device).normal_()
    a2, a2_scale = mlp.swiglu_quantized(h, offs, h_global)
    y = torch.empty(rows, 2 * half_inter, dtype=torch.bfloat16, device=x.device).normal_()
    grouped = getattr(torch, "_grouped_mm", None) if x.is_cuda else None
    return [("gate_up", (n13, hidden),
             lambda: moe.grouped_mm_nvfp4(a, experts.w13, a_scale, experts.w13_scale, offs, a_global=x_global,
                                          b_global=experts.w13_global),
             grouped and (lambda: grouped(x, experts.w13_bf16.transpose(1, 2), offs=offs))),
            ("down", (hidden, 2 * half_inter),
             lambda: moe.grouped_mm_nvfp4(a2, experts.w2, a2_scale, experts.w2_scale, offs, a_global=h_global,
                                          b_global=experts.w2_global),
             grouped and (lambda: grouped(y, experts.w2_bf16.transpose(1, 2), offs=offs)))]


def moe_scale_bytes(rows: int, e: int, k: int) -> int:
    from nvfp4_group_gemm import moe
    return moe.worst_case_scale_rows(rows, e) * moe.scale_width(k)


def min_max(offs) -> str:
    import torch
    sizes = torch.diff(offs.long(), prepend=offs.new_zeros(1).long())
    return f"{int(sizes.min())}..{int(sizes.max())}"


def replays_follow_new_routings(experts: Experts, e: int, hidden: int, device, gpu: bool) -> bool:
    """A CUDA graph captured on one routing, replayed after two others are copied into its buffers: each
    replay equal to an eager call on that routing (on the CPU: the eager calls alone)."""
    import torch
    from nvfp4_group_gemm import mlp
    rows = 512 if gpu else 64
    routings = [top2_routing(rows, e, hidden, device, seed=seed) for seed in (1, 2, 3)]
    x, offs = (t.clone() for t in routings[0])
    scale = torch.tensor(0.01, device=device)

    def call():
        return mlp.moe_mlp_nvfp4(x, offs, experts.w13, experts.w13_scale, experts.w2, experts.w2_scale,
                                 w13_global=experts.w13_global, w2_global=experts.w2_global, x_global=scale,
                                 h_global=scale)
    if gpu:
        call()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()
    good = True
    for i, (new_x, new_offs) in enumerate(routings):
        x.copy_(new_x)
        offs.copy_(new_offs)
        if gpu:
            graph.replay()
            got = out.clone()
        else:
            got = call()
        want = call()
        end = int(new_offs[-1])
        same = torch.equal(got[:end], want[:end])
        good &= same
        print(f"  routing {i} (loads {min_max(new_offs)}): {'replayed' if gpu else 'eager'} "
              f"{'equal to an eager call' if same else 'DIFFERS from an eager call'}")
    return good
