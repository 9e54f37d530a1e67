"""Each Hopper MoE form on routings of T tokens over E experts as `hopper_policy.moe_choice` samples them
(`hopper_policy.moe_routings`), timed beside the cost model's figure: what moe_choice's pick costs against the
others on the routings it reasons about, and on the one you name.

    python scripts/moe_forms.py T E N K [--routings R] [--sizes M0,M1,...]

Prints, per routing (the first R samples, then --sizes if given), each form's modeled busiest CTA (us) and,
on an sm_90 GPU, the op's mean us per call with that form (`hopper_policy.set_moe_form`; the leaderboard's loop:
L2 flushed, events around 8 calls on 8 copies of the data), then the op as it runs unset (`hopper_policy.moe_forms`:
one form, or two that the device chooses between, modeled as the one it chooses); then the means over the
sampled routings and the forms the op launches. Without such a GPU, the model's figures alone."""
import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nvfp4_group_gemm.cli import comma_ints  # noqa: E402

COPIES = 8  # distinct inputs per timed loop, as the leaderboard's calls each read their own data
AS_LAUNCHED = "the op (moe_forms)"


def stacked(sizes, n: int, k: int, device, seed: int):
    """Random stacked operands of one routing (timing only: any bytes are valid NVFP4 data to the kernel)."""
    import torch
    from nvfp4_group_gemm import moe
    tokens, experts = sum(sizes), len(sizes)
    gen = torch.Generator().manual_seed(seed)
    byte = lambda *shape: torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen).to(device)
    width = moe.scale_width(k)
    scales = lambda rows: torch.full((rows, width), 0x38, dtype=torch.uint8).to(device)  # E4M3 1.0
    return (byte(tokens, k // 2), byte(experts, n, k // 2), scales(moe.worst_case_scale_rows(tokens, experts)),
            scales(experts * moe.round_up(n, 128)).view(experts, -1),
            torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32).to(device))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("T", "E", "N", "K"):
        parser.add_argument(name, type=int)
    parser.add_argument("--routings", type=int, default=4, help="sampled routings to run (default 4)")
    parser.add_argument("--sizes", type=comma_ints(0),
                        help="one more routing: the experts' rows, comma-separated (E of them)")
    options = parser.parse_args(argv)
    import torch
    from nvfp4_group_gemm import hopper, hopper_policy, moe, submission
    tokens, experts, n, k = options.T, options.E, options.N, options.K
    routings = hopper_policy.moe_routings(tokens, experts)[:options.routings]
    if options.sizes:
        sizes = options.sizes
        if len(sizes) != experts or sum(sizes) != tokens:
            parser.error(f"--sizes: {len(sizes)} experts of {sum(sizes)} rows, expected {experts} of {tokens}")
        routings.append(sizes)
    gpu = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    sms = submission.sm_count(0) if gpu else 132
    # each form under the schedule moe_choice gives it
    forms = {name: hopper_policy.moe_scheduled(c, tokens, experts, n, sms)
             for name, c in hopper.SM90_MOE_CONFIGS.items()}
    launched = hopper_policy.moe_forms(tokens, experts, n, k, sms)
    forms[AS_LAUNCHED] = None
    where = torch.cuda.get_device_name() if gpu else "no sm_90 GPU: model only"
    print(f"T={tokens} E={experts} N={n} K={k} on {where}")
    totals = {name: [0.0, 0.0] for name in forms}
    for index, sizes in enumerate(routings):
        problem_sizes = [(m, n, k, 1) for m in sizes if m] or [(1, n, k, 1)]
        label = "named" if index >= options.routings else f"sample {index}"
        print(f"  {label}: rows {min(sizes)}..{max(sizes)}" + (f" {sizes}" if experts <= 8 else ""))
        inputs = [stacked(sizes, n, k, "cuda" if gpu else "cpu", seed) for seed in range(COPIES)] if gpu else []
        for name, config in forms.items():
            # as moe_choice models it: the leaderboard form's busiest CTA
            modeled = chosen_form(launched, sizes, n, tokens, experts, sms) if config is None else config
            model = hopper_policy.busiest_cta_cost(problem_sizes, sms, modeled) / 1000
            line = f"    {name:<40} model {model:8.2f} us"
            if gpu:
                from nvfp4_group_gemm.peers import time_loop_us
                hopper_policy.set_moe_form(None if config is None else config.name)
                measured = time_loop_us(lambda d: moe.grouped_mm_nvfp4(*d, out_dtype=torch.float16), inputs)
                line += f"  measured {measured:8.2f} us"
                if index < options.routings:
                    totals[name][1] += measured / len(routings[:options.routings])
            if index < options.routings:
                totals[name][0] += model / len(routings[:options.routings])
            print(line, flush=True)
    hopper_policy.set_moe_form(None)
    print("  mean over the sampled routings:")
    for name, (model, measured) in totals.items():
        print(f"    {name:<40} model {model:8.2f} us" + (f"  measured {measured:8.2f} us" if gpu else ""))
    print(f"  moe_choice: {hopper_policy.moe_choice(tokens, experts, n, k, sms).name}")
    print(f"  moe_forms: {' then '.join(f.name for f in launched)}")
    return 0


def chosen_form(launched, sizes, n: int, tokens: int, experts: int, sms: int):
    """Which of `launched` computes a call of these rows (`hopper_policy.MOE_TWO_FORM_RULES`, as the device decides)."""
    from nvfp4_group_gemm import hopper, hopper_policy, submission
    if len(launched) == 1:
        return launched[0]
    wave_tiles = sum(submission.ceil_div(m, 128) for m in sizes) * submission.ceil_div(n, 128)
    fits = wave_tiles <= hopper_policy.moe_one_wave_ctas(tokens, experts, n, sms)
    rule = hopper.MOE_IN_ONE_WAVE if fits else hopper.MOE_PAST_ONE_WAVE
    return launched[hopper_policy.MOE_TWO_FORM_RULES.index(rule)]


if __name__ == "__main__":
    sys.exit(main())
