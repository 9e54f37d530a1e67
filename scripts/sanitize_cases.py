"""custom_kernel on one test shape and one benchmark shape, checked against the
reference, and with --moe the MoE op on one routing with empty experts (on sm_90
also two routings under two forms per call, one taken by each), checked against
its CPU result, and with --quantizer the token quantizer's kernel in each of its
configurations (token_quantizer.PAIRED, THRESHOLD_TABLE, LEAN_LOOP; on a grid of
one SM's CTAs, so that each thread takes many blocks), checked byte for byte
against the torch composition: run under compute-sanitizer's tools by
scripts/gpu-check.sh. Arguments: the test and benchmark indices (default 3 3;
gpu-check.sh passes $SANITIZE_CASES), then --moe and --quantizer (every tool of
gpu-check.sh passes both)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nvfp4_group_gemm.casefile import BENCHMARKS_FILE, TESTS_FILE, read_test_file  # noqa: E402
from nvfp4_group_gemm.harness import code_path, load_submission  # noqa: E402
from nvfp4_group_gemm.reference import check_implementation, generate_input  # noqa: E402

submission = load_submission()  # with hopper.py's sm_90 path


def within_one_rounding(got, expected) -> bool:
    """The kernel's fp32 sums run in another order than the CPU's: each may round to the other neighbour in the
    output's type (fp16: 11 significant bits, bf16: 8)."""
    ulp = 2 ** -10 if got.dtype == torch.float16 else 2 ** -7
    return bool(((got.float().cpu() - expected).abs() <= ulp * expected.abs() + 2 ** -24).all())


failed = False
moe_too, quantizer_too = "--moe" in sys.argv, "--quantizer" in sys.argv
numbers = [a for a in sys.argv[1:] if a not in ("--moe", "--quantizer")]
test_index, benchmark_index = (int(a) for a in (numbers[:2] if len(numbers) >= 2 else (3, 3)))
for path, index in ((TESTS_FILE, test_index), (BENCHMARKS_FILE, benchmark_index)):
    case = read_test_file(path)[index]
    data = generate_input(**case.args)
    output = submission.custom_kernel(data)
    torch.cuda.synchronize()
    good, message = check_implementation(data, output)
    print(f"{path.name}[{index}] {case.spec}: {'pass' if good else 'FAIL ' + message[:300]} "
          f"[{code_path(torch.device('cuda'))}]")
    failed |= not good

if moe_too:  # the MoE op on one routing with a quarter of the experts empty, as the op runs on this GPU
    from nvfp4_group_gemm import moe
    sizes = [0, 90, 0, 130, 1, 200, 0, 63]
    gen = torch.Generator().manual_seed(5)
    x, w = torch.randn(sum(sizes), 512, generator=gen), torch.randn(len(sizes), 256, 512, generator=gen)
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    a, a_scale = moe.quantize_tokens(x, offs)
    b, b_scale = moe.quantize_experts(w)
    for out_dtype in (torch.bfloat16, torch.float16):  # the portable path, and the kernel's where one runs
        expected = moe.grouped_mm_nvfp4(a, b, a_scale, b_scale, offs, out_dtype=out_dtype).float()
        got = moe.grouped_mm_nvfp4(*(t.cuda() for t in (a, b, a_scale, b_scale, offs)), out_dtype=out_dtype)
        torch.cuda.synchronize()
        good = within_one_rounding(got, expected)
        print(f"moe op, {out_dtype}, experts {sizes}: {'pass' if good else 'FAIL'}")
        failed |= not good
    if torch.cuda.get_device_capability() == (9, 0):  # two Hopper forms per call, each routing taken by one
        from nvfp4_group_gemm import hopper
        forms = (hopper.SM90_MOE_CONFIGS["sm90-192x256-k64-wr-pair-offs"],
                 hopper.SM90_MOE_CONFIGS["sm90-128x128-k128-wr-n16-64-offs"])
        w = torch.randn(4, 1024, 256, generator=gen)
        b, b_scale = moe.quantize_experts(w)
        for sizes in ((512, 512, 768, 256), (500, 530, 770, 248)):  # the default form's one wave, then past it
            x = torch.randn(sum(sizes), 256, generator=gen)
            offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
            a, a_scale = moe.quantize_tokens(x, offs)
            expected = moe.grouped_mm_nvfp4(a, b, a_scale, b_scale, offs, out_dtype=torch.float16).float()
            args = [t.cuda() for t in (a, b, a_scale, b_scale, offs)]
            got = torch.empty(sum(sizes), 1024, dtype=torch.float16, device="cuda")
            problem = moe.Problem(*args, None, None, torch.float16, got)
            moe.run_kernel(forms, problem, args[0], args[2], args[3], args[4], got)
            torch.cuda.synchronize()
            good = within_one_rounding(got, expected)
            print(f"moe op, two Hopper forms, experts {list(sizes)}: {'pass' if good else 'FAIL'}")
            failed |= not good

if quantizer_too:  # (PAIRED, THRESHOLD_TABLE, LEAN_LOOP); one decode scale, which the table takes
    from nvfp4_group_gemm import mlp, submission as shared, token_quantizer
    sizes = [0, 129, 0, 7, 260, 1]
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(sum(sizes) + 5, 512, generator=gen) * 3).to(torch.bfloat16)
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    scale = torch.tensor([0.37])
    want = [t.view(torch.uint8) for t in mlp.quantize_tokens_torch(x, offs, scale, mlp.worst_case_scale_rows(
        x.shape[0], len(sizes)))]
    sm_count = shared.sm_count
    shared.sm_count = lambda index: 1
    for setting in ((False, False, False), (True, False, False), (True, True, False), (False, False, True),
                    (True, False, True), (True, True, True)):
        token_quantizer.PAIRED, token_quantizer.THRESHOLD_TABLE, token_quantizer.LEAN_LOOP = setting
        got = mlp.quantize_tokens_device(x.cuda(), offs.cuda(), scale.cuda())
        torch.cuda.synchronize()
        good = all(torch.equal(g.view(torch.uint8).cpu(), w) for g, w in zip(got, want))
        print(f"token quantizer (paired, table, lean loop) {setting}: {'pass' if good else 'FAIL'}")
        failed |= not good
    shared.sm_count = sm_count
sys.exit(1 if failed else 0)
