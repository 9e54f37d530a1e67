"""`eval.py moe`: the MoE op (`moe.grouped_mm_nvfp4`) on the task's shape sets of one N and K, the same data as
`generate_input`'s expressed as stacked inputs: checked against the reference everywhere; on a GPU also timed
beside custom_kernel on the leaderboard's input and torch._grouped_mm on pre-dequantized bf16 (same offs)."""
from nvfp4_group_gemm.casefile import BENCHMARKS_FILE, TESTS_FILE, problem_sizes_of, read_test_file
from nvfp4_group_gemm.measure import short_spec


def stacked_inputs(data):
    """The leaderboard's input of groups with one N and K as the op's arguments (a, b, a_scale, b_scale, offs),
    on the input's device: A's rows concatenated, each group's blocked SFA from row P_g (padded to the worst
    case, as stacked quantizers do), B and its blocked SFB stacked."""
    import torch
    from nvfp4_group_gemm import moe
    abc, _, sf_reordered, sizes = data
    k = sizes[0][2]
    width = moe.scale_width(k)

    def storage(blocked):  # the reordered view's bytes in storage order (l, row blocks, col blocks, 32, 4, 4)
        return blocked.permute(5, 2, 4, 0, 1, 3).contiguous().view(torch.uint8).reshape(-1, width)
    a = torch.cat([group[0][:, :, 0] for group in abc])
    b = torch.stack([group[1][:, :, 0] for group in abc])
    blocks = [storage(sfa) for sfa, _ in sf_reordered]
    rows = moe.worst_case_scale_rows(a.shape[0], len(sizes))
    pad = torch.zeros(rows - sum(blk.shape[0] for blk in blocks), width, dtype=torch.uint8, device=a.device)
    a_scale = torch.cat(blocks + [pad]).view(torch.float8_e4m3fn)
    b_scale = torch.stack([storage(sfb) for _, sfb in sf_reordered]).view(torch.float8_e4m3fn)
    offs = torch.tensor([m for m, _, _, _ in sizes], dtype=torch.int32, device=a.device).cumsum(0).to(torch.int32)
    return a, b, a_scale, b_scale, offs


def per_group(out, sizes):
    """The op's (T, N) output as the leaderboard's per-group (M, N, 1) outputs."""
    groups, start = [], 0
    for m, _, _, _ in sizes:
        groups.append(out[start:start + m].unsqueeze(-1))
        start += m
    return groups


def rounds_to_bf16(device) -> bool:
    """Whether the op's portable path rounds through bf16 on `device` (torch._grouped_mm's output)."""
    import torch
    from nvfp4_group_gemm import moe
    return device.type == "cuda" and torch.cuda.get_device_capability(device) in moe.GROUPED_MM_DEVICES


CPU_MAX_NK = 4096 * 4096  # the largest N x K checked on a CPU


def uniform(case) -> bool:
    return len(set(case.args["n"])) == 1 and len(set(case.args["k"])) == 1


def command_moe(options) -> int:
    """Check (and on a GPU time) the op on every test and benchmark of one N and K; exit 1 on a mismatch."""
    import torch
    from nvfp4_group_gemm import moe
    from nvfp4_group_gemm.reference import check_implementation, generate_input, mismatch_report, ref_kernel
    cases = [(f"test {i}", c) for i, c in enumerate(read_test_file(TESTS_FILE)) if uniform(c)]
    cases += [(f"benchmark {i}", c) for i, c in enumerate(read_test_file(BENCHMARKS_FILE)) if uniform(c)]
    gpu = torch.cuda.is_available()
    skipped = []
    if not gpu:  # the CPU's loop over the groups takes minutes on the largest weights
        skipped = [name for name, c in cases if max(c.args["n"]) * max(c.args["k"]) > CPU_MAX_NK]
        cases = [(name, c) for name, c in cases if name not in skipped]
    print(f"grouped_mm_nvfp4 (stacked inputs) on {torch.cuda.get_device_name() if gpu else 'the CPU'}: "
          f"{len(cases)} shape sets of one N and K" + (
              f" ({', '.join(skipped)} left out: N x K over {CPU_MAX_NK:,}, minutes on a CPU)" if skipped else ""))
    failed = False
    for name, case in cases:
        data = generate_input(**case.args, device=None if gpu else "cpu")
        a, b, a_scale, b_scale, offs = stacked_inputs(data)
        out = moe.grouped_mm_nvfp4(a, b, a_scale, b_scale, offs, out_dtype=torch.float16)
        problem = moe.Problem(a, b, a_scale, b_scale, offs, None, None, torch.float16, out)
        forms = moe.kernel_forms(problem, a, b_scale, a_scale, None, None, out)
        path = "portable" if forms is None else "kernel"
        if path == "portable" and rounds_to_bf16(a.device):
            # torch._grouped_mm's bf16 output, then fp16: a bf16 rounding's tolerance
            problems = [p for got, want in zip(per_group(out, data[3]), ref_kernel(data))
                        for p in mismatch_report(got.float(), want.float(), rtol=2 ** -8)]
            ok, message = not problems, "; ".join(problems)
        else:
            ok, message = check_implementation(data, per_group(out, data[3]))
        failed |= not ok
        line = f"  {name:<12} {path:<8} {'ok' if ok else 'WRONG: ' + message[:200]}"
        if gpu and ok and name.startswith("benchmark"):
            line += timings(case, a, b, a_scale, b_scale, offs) + "  " + " then ".join(f.tile_name for f in forms or ())
        print(line + f"  {short_spec(problem_sizes_of(case.args))}", flush=True)
    return 1 if failed else 0


def timings(case, a, b, a_scale, b_scale, offs) -> str:
    """Mean us per call (the leaderboard's loop) of the op, custom_kernel and grouped_mm on bf16, same data."""
    import torch
    from nvfp4_group_gemm import moe
    from nvfp4_group_gemm.harness import benchmark_inputs, load_submission
    from nvfp4_group_gemm.peers import grouped_mm_on_bf16, time_loop_us
    inputs = benchmark_inputs(case.args)
    stacked = {id(d): stacked_inputs(d) for d in inputs}
    op = time_loop_us(lambda d: moe.grouped_mm_nvfp4(*stacked[id(d)], out_dtype=torch.float16), inputs)
    kernel = time_loop_us(load_submission().custom_kernel, inputs)
    gmm = time_loop_us(grouped_mm_on_bf16(inputs), inputs)
    return f"  op {op:9.2f} us  custom_kernel {kernel:9.2f} us ({op / kernel:.2f}x)  grouped_mm bf16 {gmm:9.2f} us"
