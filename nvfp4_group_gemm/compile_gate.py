"""The compile gate: every kernel configuration compiled for sm_100a (or sm_90a) without a GPU, its PTX checked
for the instructions the design needs and run through `ptxas -v` (registers, spills, shared memory), and every
shape set planned onto the compiled kernels.

Each configuration compiles in a fresh interpreter (`python -m nvfp4_group_gemm.compile_gate CONFIG`): CuTe DSL
takes its target from CUTE_DSL_ARCH at first use, and some releases (4.3.x) compile once and then stop at cuInit
without a GPU. Results are cached per kernel (toolchain.ResultCache); ptxas comes from toolchain.find_ptxas.
"""
import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Optional

from nvfp4_group_gemm import toolchain
from nvfp4_group_gemm.casefile import BENCHMARKS_FILE, TESTS_FILE, problem_sizes_of, read_test_file
from nvfp4_group_gemm.measure import describe_error

PACKAGE_PARENT = Path(__file__).resolve().parent.parent  # where `nvfp4_group_gemm` is imported from


H100_SM_COUNT = 132  # the smaller of the H100 and H200 (both 132 SMs), for Hopper plans


# =============================================================================
# Compile for B200 without a GPU
# =============================================================================
class PtxasTooOld(RuntimeError):
    """The PTX is newer than the ptxas at hand (the DSL's CUDA 13 builds emit newer PTX)."""


PTXAS_TOO_OLD = re.compile(r"Unsupported \.version (\S+); current version is '([^']+)'")


PTXAS_USED = re.compile(r"Used (\d+) registers")


PTXAS_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


PTXAS_SMEM = re.compile(r"(\d+) bytes smem")


# ptxas's "Potential Performance Loss: wgmma.mma_async instructions are serialized" (C7512)
PTXAS_WGMMA_SERIALIZED = re.compile(r"C7512|wgmma\.mma_async instructions are serialized")


def ptxas_report(ptx: str, arch: str, ptxas: str) -> dict:
    """Registers, static shared memory, stack and spill bytes of every kernel in `ptx`."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx.replace("\x00", ""))  # some DSL releases end the PTX with a NUL
        done = subprocess.run([ptxas, f"-arch={arch}", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True)
    if done.returncode != 0:
        too_old = PTXAS_TOO_OLD.search(done.stderr)
        if too_old:
            raise PtxasTooOld(f"{ptxas} reads PTX up to {too_old[2]}, this PTX is {too_old[1]}: "
                              "point PTXAS at a ptxas from a newer CUDA")
        raise RuntimeError(f"ptxas failed: {done.stderr.strip()[-2000:]}")
    text = done.stderr
    used = [int(u[1]) for u in PTXAS_USED.finditer(text)]
    spills = [tuple(map(int, s.groups()[:3])) for s in PTXAS_SPILLS.finditer(text)]
    smem = PTXAS_SMEM.search(text)
    if not used or not spills:
        raise RuntimeError(f"unexpected ptxas output: {text[-2000:]}")
    # where a PTX file holds several kernels: the most registers, all spills
    return {"registers": max(used), "static_smem_bytes": int(smem[1]) if smem else 0,
            "stack_bytes": max(s[0] for s in spills), "spill_store_bytes": sum(s[1] for s in spills),
            "spill_load_bytes": sum(s[2] for s in spills), "kernels": len(used),
            "wgmma_serialized": PTXAS_WGMMA_SERIALIZED.search(text) is not None}


def ptx_text(compiled) -> str:
    """The PTX the DSL kept: its text, or (some releases and settings) the path
    of the file it was dumped to."""
    ptx = compiled.artifacts.PTX or ""
    if ptx and not ptx.lstrip().startswith(("//", ".")):
        path = Path(ptx.strip())
        if not path.is_file():
            raise RuntimeError(f"the DSL names a PTX file that does not exist: {path}")
        ptx = path.read_text()
    return ptx


# What the B200 kernel's PTX must contain (name: pattern). Counts go into the report.
PTX_FEATURES = {
    "block_scaled_fp4_mma": r"tcgen05\.mma\.cta_group::[12]\.kind::mxf4nvf4\.block_scale\.(?:block16|scale_vec::4X)",
    "tma_load": r"cp\.async\.bulk\.tensor\.\dd\.shared::(?:cta|cluster)\.global\.tile\.mbarrier",
    "tma_store": r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta",
    "tensormap_replace": r"tensormap\.replace",
    "tensormap_release": r"tensormap\.cp_fenceproxy\.global\.shared::cta\.tensormap::generic\.release",
    "tensormap_acquire": r"fence\.proxy\.tensormap::generic\.acquire",
    "tensormap_prefetch": r"prefetch\.(?:global\.)?tensormap",
    "pdl_wait": r"griddepcontrol\.wait",
    "pdl_launch_dependents": r"griddepcontrol\.launch_dependents",
    "scale_factor_copy": r"tcgen05\.cp\.cta_group::[12]",
    "tmem_load": r"tcgen05\.ld\.sync",
    "tmem_alloc": r"tcgen05\.alloc\.cta_group::[12]",
    # clusters (hopper.py's pair forms): multicast loads, the cluster barrier, arrivals on the peer's barriers
    "multicast_tma_load": r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global\.tile\.mbarrier::complete_tx::bytes"
                          r"\.multicast::cluster",
    "cluster_barrier": r"barrier\.cluster\.wait",
    "remote_arrive": r"mapa\.shared::cluster",
    "mbarrier_init": r"mbarrier\.init\.shared",
    # the Hopper kernel (hopper.py)
    "wgmma": r"wgmma\.mma_async",
    "e4m3_to_f16x2": r"cvt\.rn\.f16x2\.e4m3x2",
    "bulk_copy_load": r"cp\.async\.bulk\.shared::(?:cta|cluster)\.global",
    "integer_divisions": r"\b(?:div|rem)\.[su]32\b",  # run-time divisions (the tile scheduler's)
}


PTX_THREADS = re.compile(r"\.reqntid (\d+), 1, 1")


# shfl.sync's operands: destination (and predicate), value, lane or offset b, clamp c, member mask
PTX_SHUFFLE = re.compile(r"shfl\.sync\.(up|down|bfly|idx)\.b32\s+[^,;]+,\s*[^,;]+,\s*[^,;]+,\s*([^,;]+),\s*[^;]+;")


def misclamped_shuffles(ptx: str) -> list:
    """The lane shuffles whose clamp (c's low five bits) is not the whole segment's: 0 for `up` (its bound is
    the segment's first lane), 31 for `down`, `bfly` and `idx` (its last), as CUDA's __shfl_*_sync set it.
    With any other clamp most lanes keep their own value, silently: `up` with 31 moves nothing at all (the
    clamp some DSL releases' shuffle_sync_up passes by default). A clamp in a register is not judged."""
    wrong = []
    for match in PTX_SHUFFLE.finditer(ptx):
        mode, clamp = match[1], match[2].strip()
        if clamp.startswith("%"):
            continue
        expected = 0 if mode == "up" else 31
        if int(clamp, 0) & 31 != expected:
            wrong.append(" ".join(match[0].split()))
    return wrong


def acquires_before_waits(ptx: str) -> list:
    """Per `griddepcontrol.wait`, in text order: the descriptor acquire fences since the entry's start or the
    previous griddepcontrol instruction (those a role issues before it waits for the previous kernel)."""
    counts = []
    for entry in re.split(r"\.entry\s", ptx)[1:]:
        pieces = re.split(r"(griddepcontrol\.\w+)", entry)
        for before, instruction in zip(pieces[0::2], pieces[1::2]):
            if instruction == "griddepcontrol.wait":
                counts.append(len(re.findall(PTX_FEATURES["tensormap_acquire"], before)))
    return counts


def ptx_features(ptx: str) -> dict:
    found = {name: len(re.findall(pattern, ptx)) for name, pattern in PTX_FEATURES.items()}
    found["acquires_before_waits"] = acquires_before_waits(ptx)
    threads = [int(t) for t in PTX_THREADS.findall(ptx)]
    found["threads_per_cta"] = max(threads) if threads else None  # the GEMM kernel's (the largest)
    found["shuffles_up"] = len(re.findall(r"shfl\.sync\.up\.", ptx))
    found["misclamped_shuffles"] = misclamped_shuffles(ptx)
    return found


def file_stem(config_name: str) -> str:
    """A configuration name as a file name ("128x128/contiguous" -> "128x128@contiguous")."""
    return config_name.replace("/", "@")


def compile_one(config_name: str, arch: str, keep_dir: Optional[str]) -> dict:
    """Compile one tile configuration in this process; a result dict.

    Must run in a fresh process: CuTe DSL takes its target from CUTE_DSL_ARCH,
    and some releases (4.3.x) compile once and then stop at cuInit without a GPU,
    leaving only the PTX in the dump folder."""
    import tempfile
    dump_dir = tempfile.mkdtemp(prefix="nvfp4-compile-")
    os.environ.update(CUTE_DSL_ARCH=arch, CUTE_DSL_KEEP="ptx",
                      CUTE_DSL_DUMP_DIR=dump_dir)
    import importlib.metadata
    from nvfp4_group_gemm import submission
    row = {"config": config_name, "arch": arch, "ok": False,
           "cutlass_dsl": importlib.metadata.version("nvidia-cutlass-dsl")
           if _has_distribution("nvidia-cutlass-dsl") else "?"}
    start = time.perf_counter()
    ptx, stopped_at = "", None
    hopper = None
    if is_hopper_arch(arch):
        from nvfp4_group_gemm import hopper
    config = config_named(config_name, arch)
    kernel = config.make_kernel()
    side_ptx = {}  # the builders' (`host_functions`: the descriptor builder, the MoE form's from offs)
    for name, function, spec in sorted(kernel.host_functions(), key=lambda f: f[0] != "gemm"):  # the GEMM first
        try:
            compiled = submission.compile_with_placeholders(function, spec)
            text = ptx_text(compiled)
            # Whether launches can skip the DSL's per-call argument conversion (submission.HostFunction);
            # checked on the CPU against this release
            direct = submission.argument_layout_matches(compiled, spec)
        except Exception as error:  # 4.3.x: PTX written, then cuInit fails without a GPU
            if name == "gemm":
                stopped_at = describe_error(error)
                break
            row["builder_error"] = describe_error(error)
            continue
        if name == "gemm":
            ptx, row["direct_host_arguments"] = text, direct
        else:
            side_ptx[name] = text
            if name == "build_from_offsets":
                row["direct_offsets_builder_arguments"] = direct
    builder_ptx, offsets_ptx = side_ptx.get("build_tensormaps", ""), side_ptx.get("build_from_offsets", "")
    row["compile_s"] = round(time.perf_counter() - start, 3)
    if not ptx:
        dumped = sorted(Path(dump_dir).glob("*.ptx"))
        ptx = dumped[-1].read_text() if dumped else ""
    if stopped_at:
        row["stopped"] = stopped_at[:300]
    try:
        if not ptx:
            raise RuntimeError(f"no PTX: {stopped_at or 'the DSL kept none'}")
        row.update(stages_ab=kernel.num_ab_stages, stages_acc=getattr(kernel, "num_acc_stages", None),
                   stages_c=getattr(kernel, "num_c_stages", None), dynamic_smem_bytes=kernel.smem_bytes,
                   cluster=list(getattr(kernel, "launch_cluster", (1, 1, 1))))  # the GEMM's launch
        row["ptx_features"] = ptx_features(ptx)
        if keep_dir:
            Path(keep_dir).mkdir(parents=True, exist_ok=True)
            row["ptx_file"] = str(Path(keep_dir) / f"{file_stem(config_name)}.{arch}.ptx")
            Path(row["ptx_file"]).write_text(ptx.replace("\x00", ""))
        found = toolchain.find_ptxas()
        if found is None:
            raise RuntimeError(PTXAS_MISSING)
        ptxas = row["ptxas"] = found.path
        row.update(ptxas_report(ptx, arch, ptxas))
        if builder_ptx:
            row["builder_ptx_features"] = ptx_features(builder_ptx)
        if offsets_ptx:
            row["offsets_builder_ptx_features"] = ptx_features(offsets_ptx)
        # the builders: registers, spills and (kept) their PTX, under "builder_..." and "offsets_builder_..."
        for prefix, suffix, side_ptx in (("builder", "builder", builder_ptx), ("offsets_builder", "offsets",
                                                                             offsets_ptx)):
            if not side_ptx:
                continue
            side = ptxas_report(side_ptx, arch, ptxas)
            row.update({f"{prefix}_registers": side["registers"],
                        f"{prefix}_spill_bytes": side["spill_store_bytes"] + side["spill_load_bytes"]})
            if keep_dir:
                row[f"{prefix}_ptx_file"] = str(Path(keep_dir) / f"{file_stem(config_name)}.{arch}.{suffix}.ptx")
                Path(row[f"{prefix}_ptx_file"]).write_text(side_ptx.replace("\x00", ""))
        row["ok"] = (row["spill_store_bytes"] == 0 and row["spill_load_bytes"] == 0
                     and row.get("builder_spill_bytes", 0) == 0 and row.get("offsets_builder_spill_bytes", 0) == 0)
        if "builder_error" in row:
            row["ok"] = False
            row["error"] = "descriptor builder: " + row["builder_error"]
        elif not row["ok"]:
            row["error"] = "register spills"
        elif row["wgmma_serialized"]:  # ptxas waits for every wgmma: no overlap with the conversion
            row["ok"] = False
            row["error"] = "ptxas serializes the wgmma instructions (C7512: not enough registers)"
        misclamped = [line for key in ("ptx_features", "builder_ptx_features", "offsets_builder_ptx_features")
                      for line in row.get(key, {}).get("misclamped_shuffles", [])]
        if misclamped:  # compiles, and computes wrong results
            row["ok"] = False
            row["error"] = (f"{len(misclamped)} lane shuffles whose clamp keeps lanes' own values, e.g. "
                            f"'{misclamped[0]}' (shfl.sync.up needs clamp 0: pass mask_and_clamp=0)")
        if hopper:
            # a CTA must fit an SM's registers (ptxas caps them by warps per scheduler)
            row.update(tile_k=kernel.config.tile_k, register_budget=hopper.register_budget())
            if row["registers"] > row["register_budget"]:
                row["ok"] = False
                row["error"] = f"{row['registers']} registers: one CTA per SM allows {row['register_budget']}"
    except Exception as error:
        row["error"] = describe_error(error)
    return row


def _has_distribution(name: str) -> bool:
    import importlib.metadata
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def is_hopper_arch(arch: str) -> bool:
    return arch.startswith("sm_90")


def kernel_configs(arch: str) -> list:
    """The configurations compiled for `arch`: every B200 tile configuration,
    or every configuration of the Hopper kernel (its forms, the forms not yet
    timed, the MoE op's), each round-robin and with contiguous tile ranges
    (compiled in; the rest of a schedule is host side)."""
    from nvfp4_group_gemm import submission
    if is_hopper_arch(arch):
        from nvfp4_group_gemm import hopper
        candidates = [c.with_schedule(s) for forms in (hopper.SM90_CONFIGS, hopper.SM90_CANDIDATES)
                      for c in forms.values() for s in (submission.Schedule(), submission.Schedule(contiguous=True))]
        candidates += [c.with_schedule(s) for c in hopper.SM90_MOE_CONFIGS.values()  # the MoE op's (moe.py)
                       for s in (submission.Schedule(), submission.Schedule(contiguous=True))]
        candidates += [dataclasses.replace(c, bf16_output=True) for c in hopper.SM90_MOE_CONFIGS.values()]
    else:  # every configuration CONFIG_POLICY may name (the cost model's); the MoE op's form
        from nvfp4_group_gemm.moe_tables import MOE_CONFIG
        candidates = submission.policy_candidates() + [MOE_CONFIG, dataclasses.replace(MOE_CONFIG, bf16_output=True)]
    kernels = {}  # one per compiled form (`kernel_name`)
    for c in candidates:
        kernels.setdefault(kernel_name(c), c.compile_key)
    return list(kernels.values())


def config_named(name: str, arch: str):
    """A configuration of `arch` by name, "TILE/SCHEDULE" for TILE under a schedule (`submission.parse_config`)."""
    from nvfp4_group_gemm import submission
    return submission.parse_config(name, {c.tile_name: c for c in kernel_configs(arch)}, f"{arch} configuration")


def hopper_choice():
    """custom_kernel's choice per shape set on sm_90 (hopper_policy.launcher_for_setting without a setting)."""
    from nvfp4_group_gemm import hopper_policy
    return hopper_policy.launcher_for_setting(None).choose


PTXAS_MISSING = ("ptxas not found: install this package's dependencies (pip install -e .; nvidia-cuda-nvcc "
                 "carries ptxas), or name one with PTXAS or put CUDA 13's bin on PATH")


# What a compiled kernel and its report depend on, besides the configuration, the architecture and the tools.
KERNEL_SOURCES = ("submission.py", "hopper.py", "moe_tables.py", "compile_gate.py")  # beside this file, in the package


def compile_in_process(name: str, arch: str, keep_dir: Optional[str]) -> dict:
    """`compile_one` in a fresh interpreter (the DSL takes its target at first use)."""
    args = [sys.executable, "-W", "ignore", "-m", "nvfp4_group_gemm.compile_gate", name, "--arch", arch]
    if keep_dir:
        args += ["--keep", os.path.abspath(keep_dir)]
    start = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(PACKAGE_PARENT),
                                                                      os.environ.get("PYTHONPATH")))))
    done = subprocess.run(args, capture_output=True, text=True, env=env)
    try:
        row = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        row = {"config": name, "arch": arch, "ok": False,
               "error": f"compile process failed: {(done.stderr or done.stdout)[-1500:]}"}
    row["process_s"] = round(time.perf_counter() - start, 3)  # the process's start and imports included
    return row


def compile_configs(arch: str, keep_dir: Optional[str], names: Optional[list] = None,
                    cache: Optional[toolchain.ResultCache] = None, report=None) -> list:
    """Compile the configurations `names` (default: all) for `arch`, each in its own process, a few at a time;
    `report(done, total, row)` as each finishes. Results come from `cache` where it has them, and ok ones go
    into it; with `keep_dir`, which needs the PTX, everything compiles and nothing is cached."""
    names = [kernel_name(c) for c in kernel_configs(arch)] if names is None else list(names)
    cache = cache or toolchain.ResultCache(None)
    ptxas = toolchain.find_ptxas()
    facts = (toolchain.dsl_identity(), toolchain.ptxas_version(ptxas.path) if ptxas else "no ptxas")
    here = Path(__file__).resolve().parent
    sources = [here / s for s in KERNEL_SOURCES]
    keys = {name: cache.key(name, arch, sources, *facts) for name in names}
    rows, finished = {}, 0

    def finish(name: str, row: dict) -> None:
        nonlocal finished
        rows[name], finished = row, finished + 1
        if report:
            report(finished, len(names), row)
    for name in names:
        cached = None if keep_dir else cache.load(keys[name])
        if cached is not None:
            finish(name, dict(cached, cached=True))
    todo = [name for name in names if name not in rows]
    with ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1, 4))) as pool:
        futures = {pool.submit(compile_in_process, name, arch, keep_dir): name for name in todo}
        for future in as_completed(futures):
            name, row = futures[future], future.result()
            if row.get("ok") and not keep_dir:  # a kept run's rows name its PTX files
                cache.store(keys[name], row)
            finish(name, row)
    return [rows[name] for name in names]


def task_shape_sets(which: str = "all") -> list:
    files = {"tests": [TESTS_FILE], "benchmarks": [BENCHMARKS_FILE],
             "all": [TESTS_FILE, BENCHMARKS_FILE]}[which]
    sets = []
    for path in files:
        for i, case in enumerate(read_test_file(path)):
            sets.append((f"{path.stem}[{i}]", problem_sizes_of(case.args)))
    return sets


def contract_shape_sets(count: int = 24, seed: int = 2024) -> list:
    """A spread of contract-valid shape sets: G 1..64, M 1..1024, N multiples of
    128 up to 8192, K multiples of 256 up to 8192 (fixed seed, with the extremes)."""
    import random
    rng = random.Random(seed)
    sets = [("contract[min]", [(1, 128, 256, 1)]),
            ("contract[max]", [(1024, 8192, 8192, 1)] * 64)]
    for i in range(count - 2):
        g = rng.choice([1, 2, 3, 8, 16, 32, 64]) if i % 3 else rng.randint(1, 64)
        sets.append((f"contract[{i}]", [(rng.randint(1, 1024), 128 * rng.randint(1, 64),
                                         256 * rng.randint(1, 32), 1) for _ in range(g)]))
    return sets


def print_compile_table(rows: list):
    width = max([14] + [len(r["config"]) for r in rows])
    print(f"{'config':<{width}} {'compile s':>9} {'regs':>5} {'smem B':>7} {'stages ab/acc/c':>15} "
          f"{'spill B':>7} {'stack B':>7}  status")
    for r in rows:
        spill = r.get("spill_store_bytes", 0) + r.get("spill_load_bytes", 0)
        stages = ("/".join("-" if r[k] is None else str(r[k]) for k in ("stages_ab", "stages_acc", "stages_c"))
                  if "stages_ab" in r else "-")
        print(f"{r['config']:<{width}} {r.get('compile_s', float('nan')):>9.2f} {r.get('registers', '-'):>5} "
              f"{r.get('dynamic_smem_bytes', '-'):>7} {stages:>15} "
              f"{spill if 'registers' in r else '-':>7} {r.get('stack_bytes', '-'):>7}  "
              f"{'ok' if r['ok'] else 'FAIL: ' + r.get('error', '')}"
              + (f" (then: {r['stopped'][:80]})" if r.get("stopped") else ""))


def kernel_name(config) -> str:
    """The compiled kernel serving a configuration (`kernel_configs`): its tile configuration, contiguous or not
    (the rest of a schedule is host side)."""
    return config.tile_name + ("/contiguous" if config.schedule.contiguous else "")


def shape_plans(shape_sets: list, fixed_config=None, num_sms: Optional[int] = None, choose=None) -> list:
    """For each shape set: the configuration (the B200 cost model's pick, or
    `choose`'s, unless one is fixed) and its launch plan."""
    from nvfp4_group_gemm import submission
    plans = []
    for name, sizes in shape_sets:
        # the launcher's own plan (device index -1: no device is asked anything)
        shape = submission.shape_plan(tuple(map(tuple, sizes)), -1, num_sms or submission.SM100_SM_COUNT,
                                      fixed_config, choose or submission.choose_config)
        plans.append({"case": name, "groups": len(sizes), "config": shape.config.name,
                      "kernel": kernel_name(shape.config), "tiles": shape.tiles, "ctas": shape.ctas,
                      "problem_sizes": [list(s) for s in sizes]})
    return plans


def ptxas_problem() -> Optional[str]:
    """Why the compile gate cannot run ptxas here, or None."""
    named = os.environ.get("PTXAS")
    if named and not os.access(named, os.X_OK):
        return f"PTXAS={named} is not an executable file"
    return None if toolchain.find_ptxas() else PTXAS_MISSING


def compile_gate(arch: str, shape_sets: list, only_needed: bool, keep_dir: Optional[str] = None,
                 json_path: Optional[str] = None) -> bool:
    """Plan `shape_sets` for `arch`, compile their kernels (`only_needed`) or every configuration, print
    progress, the ptxas report and each plan's verdict; whether everything compiled without spills."""
    problem = ptxas_problem()
    if problem:
        print(f"Compile gate: {problem}.", flush=True)
        return False
    hopper = is_hopper_arch(arch)
    print(f"Compile gate for {arch}: planning {len(shape_sets)} shape set{'s' if len(shape_sets) != 1 else ''}",
          flush=True)
    plans = shape_plans(shape_sets, None, H100_SM_COUNT if hopper else None, hopper_choice() if hopper else None)
    names = [kernel_name(c) for c in kernel_configs(arch)]
    if only_needed:
        needed = {p["kernel"] for p in plans}
        names = [n for n in names if n in needed]
    ptxas = toolchain.find_ptxas()
    cache = toolchain.ResultCache.from_environment()
    what = "Hopper kernel (hopper.py)" if hopper else "B200 kernel"
    print(f"Compiling the {what} for {arch}: {len(names)} kernel{'s' if len(names) != 1 else ''}, each in its "
          f"own process ({toolchain.dsl_identity().split(' at ')[0]}; ptxas {ptxas.path}, from {ptxas.source}; "
          "no GPU needed)", flush=True)

    def report(done: int, total: int, row: dict) -> None:
        status = ("ok" if row["ok"] else "FAIL") + (" (cached)" if row.get("cached") else
                                                    f" in {row.get('process_s', float('nan')):.1f} s")
        print(f"  [{done}/{total}] {row['config']}: {status}", flush=True)
    rows = compile_configs(arch, keep_dir, names, cache, report)
    print("\nptxas -v per kernel (smem B = dynamic shared memory); one kernel per tile configuration serves "
          "every shape set:")
    print_compile_table(rows)
    compiled = {r["config"] for r in rows if r["ok"]}
    picked = ("the configuration and schedule custom_kernel runs (hopper_policy.sm90_choice)"
              if hopper else "the configuration the cost model picks")
    print(f"\nShape sets ({len(plans)}): {picked}, tiles and CTAs; "
          "each is served by the kernel compiled above:")
    for p in plans:
        status = "ok" if p["kernel"] in compiled else "FAIL: its configuration did not compile"
        print(f"  {p['case']:<15} G={p['groups']:<3} {p['config']:<36} tiles {p['tiles']:>5}  "
              f"CTAs {p['ctas']:>3}  {status}")
    if json_path:
        Path(json_path).write_text(json.dumps({"kernels": rows, "shape_sets": plans}, indent=1))
    failed = [r for r in rows if not r["ok"]] + [p for p in plans if p["kernel"] not in compiled]
    cached = sum(bool(r.get("cached")) for r in rows)
    print(f"{len(rows)} kernels, {len(plans)} shape sets, {len(failed)} failures")
    print(f"({cached} of {len(rows)} kernels from the cache; {cache.describe()})", flush=True)
    return not failed


def command_compile(options) -> int:
    if options.shape:
        shape_sets = [("custom", problem_sizes_of(options.shape_args))]
    else:
        shape_sets = task_shape_sets(options.which)
        if options.which == "all":
            shape_sets += contract_shape_sets()
    passed = compile_gate(options.arch, shape_sets, only_needed=bool(options.shape), keep_dir=options.keep,
                          json_path=options.json)
    return 0 if passed else 1


def compile_one_main(argv: list) -> int:
    """`eval.py compile-one CONFIG [--arch ARCH] [--keep DIR]`: one configuration, its row as JSON (internal:
    what compile_configs runs in a fresh process)."""
    parser = argparse.ArgumentParser(prog="eval.py compile-one")
    parser.add_argument("config")
    parser.add_argument("--arch", default="sm_100a")
    parser.add_argument("--keep")
    options = parser.parse_args(argv)
    print(json.dumps(compile_one(options.config, options.arch, options.keep)))
    return 0


if __name__ == "__main__":
    sys.exit(compile_one_main(sys.argv[1:]))
