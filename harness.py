"""The leaderboard's timing-loop inputs, shared by eval.py and hostbench.py.

A benchmark is timed on 15 distinct inputs called back to back, the i-th
generated with the benchmark's seed plus 42 * i; the check runs on clones made
before the timed calls, and every sample starts by flushing L2. eval.py (the
protocol and the people's CLI) and hostbench.py (host time per call) both need
these, so they live here and neither of those two imports the other.

torch and reference are imported inside the functions, so that importing eval
stays as light as it was.
"""
NUM_INPUTS_PER_BENCHMARK = 15  # distinct inputs timed back to back per sample
SEED_STEP = 42  # added to a benchmark's seed before each of its inputs
L2_FLUSH_BYTES = 1 << 30  # written before every sample; several times any L2


def clone_data(data):
    if isinstance(data, tuple):
        return tuple(clone_data(x) for x in data)
    if isinstance(data, list):
        return [clone_data(x) for x in data]
    if hasattr(data, "clone"):
        return data.clone()
    return data


_l2_flush_buffer = None


def flush_l2():
    import torch
    global _l2_flush_buffer
    if _l2_flush_buffer is None:
        _l2_flush_buffer = torch.empty(L2_FLUSH_BYTES // 8, dtype=torch.int64, device="cuda")
    _l2_flush_buffer.fill_(42)


def benchmark_inputs(args: dict) -> list:
    from reference import generate_input
    inputs = []
    args = dict(args)
    for _ in range(NUM_INPUTS_PER_BENCHMARK):
        if "seed" in args:
            args["seed"] += SEED_STEP
        inputs.append(generate_input(**args))
    return inputs


def load_submission():
    """The submission module with the code paths beside it registered:
    hopper.py (sm_90) where present, and portable.py (any other CUDA GPU).
    Each makes itself a custom_kernel path when imported
    (`submission.register_path`); the leaderboard copies only submission.py
    and runs only its B200 path."""
    import submission
    import portable  # noqa: F401  (registers the path of GPUs without a kernel)
    try:
        import hopper  # noqa: F401  (registers the sm_90 path)
    except ImportError:
        pass
    return submission
