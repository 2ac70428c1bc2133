"""Kernel compile check: every .cu module and every template instance the plans launch
compiles to cubin for each target arch through NVRTC, with the options CuPy uses at run
time, on a machine with no GPU and no driver. Prints registers, spills and shared memory
per kernel; exits non-zero on any compile error or any spill.

With --execute, every kernel instance instead runs on the emulated device (the same .cu
source compiled by g++, see gpuplan/emulator) through its plan's launch code, against the
family's float64 reference (each family's cases: gpuplan/ops/<family>/cases.py). It ends with
`executed N of M kernel instances, K failures` and exits non-zero unless N == M and K == 0.

    python scripts/check_kernels.py [--arch 80 90] [--module embedding] [--jobs 2]
    python scripts/check_kernels.py --execute [--module embedding] [--device cuda] [--jobs 2]
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import re
import sys
import time
import traceback

_FUNC_RE = re.compile(r"Compiling entry function '(\S+)' for '(sm_\d+)'")
_SPILL_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS_RE = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def cupy_options() -> tuple[str, ...]:
    """The include paths and flags CuPy passes to NVRTC (private CuPy 14 API); CuPy also adds
    -ftz=true, -arch and --device-as-default-execution-space, added in compile_module."""
    from cupy._core import core

    return tuple(core.assemble_cupy_compiler_options(()))


def parse_ptxas(log: str, demangle: dict[str, str]) -> list[dict]:
    rows: list[dict] = []
    cur: dict | None = None
    for line in log.splitlines():
        m = _FUNC_RE.search(line)
        if m:
            cur = {"kernel": demangle.get(m.group(1), m.group(1)), "arch": m.group(2),
                   "regs": None, "stack": 0, "spill_st": 0, "spill_ld": 0, "smem": 0}
            rows.append(cur)
            continue
        if cur is None:
            continue
        m = _SPILL_RE.search(line)
        if m:
            cur["stack"], cur["spill_st"], cur["spill_ld"] = (int(g) for g in m.groups())
        m = _REGS_RE.search(line)
        if m:
            cur["regs"] = int(m.group(1))
            cur["smem"] = int(m.group(2) or 0)
    return rows


def compile_module(mod, arch: str) -> tuple[list[dict], float]:
    from cupy.cuda import compiler

    opts = cupy_options() + tuple(mod.options) + (
        "-ftz=true", f"-arch=sm_{arch}", "--device-as-default-execution-space", "-Xptxas=-v")
    t0 = time.perf_counter()
    prog = compiler._NVRTCProgram(mod.source(), mod.path.name,
                                  name_expressions=list(mod.name_expressions), method="cubin")
    log = io.StringIO()
    _, mapping = prog.compile(opts, log_stream=log)
    dt = time.perf_counter() - t0
    missing = [n for n in mod.name_expressions if not mapping.get(n)]
    if missing:
        raise RuntimeError(f"{mod.path.name}: instances not lowered: {missing}")
    demangle = {v: k for k, v in mapping.items()}
    return parse_ptxas(log.getvalue(), demangle), dt


def _compile_job(job: tuple[int, str]) -> tuple[list[dict], float] | str:
    """One (module, arch) compile in a worker process: the module is found again by its
    index in the registry (CudaModule objects are not sent between processes); an error
    comes back as its text, so that every failure is reported."""
    import gpuplan  # noqa: F401 - imports every family, which declares its CudaModule
    from gpuplan.nvrtc import registry

    index, arch = job
    try:
        return compile_module(registry()[index], arch)
    except Exception as exc:  # noqa: BLE001 - report every module's failure
        return f"{type(exc).__name__}: {exc}"


def compile_all(mods: list, archs: list[str], jobs: int):
    """Yield (module, arch, rows and seconds, or the error text) in registry order. NVRTC
    runs on one thread per program, so `jobs` > 1 compiles in that many processes."""
    from gpuplan.nvrtc import registry

    index = {id(m): i for i, m in enumerate(registry())}
    work = [(mod, arch) for mod in mods for arch in archs]
    if jobs <= 1 or len(work) <= 1:
        for mod, arch in work:
            yield mod, arch, _compile_job((index[id(mod)], arch))
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # Spawned workers: a forked copy of a process that has loaded CuPy is not safe.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(work)), mp_context=ctx) as pool:
        results = pool.map(_compile_job, [(index[id(m)], a) for m, a in work])
        for (mod, arch), result in zip(work, results, strict=True):
            yield mod, arch, result


def _execute_family(job: tuple[str, str]) -> dict:
    """Run one family's kernel cases on `device` (in a worker process, or in this one):
    the counts, the failures as one line each, and the (file, instance) keys launched."""
    import gpuplan  # noqa: F401 - imports every family, which declares its CudaModule
    from gpuplan import nvrtc, testing
    from gpuplan.ops import folder

    family, device = job
    testing.set_device(device)
    module = importlib.import_module(f"gpuplan.ops.{family}.cases")
    cases = list(module.CASES)
    gpu_cases = list(getattr(module, "GPU_CASES", ()))  # cuBLAS: a real GPU only
    if device == "cuda":
        cases += gpu_cases
    files = {m.path.name for m in nvrtc.registry() if m.path.parent == folder(family)}
    t0 = time.perf_counter()
    failures: list[str] = []
    for case in cases:
        try:
            case.run()
        except Exception as exc:  # noqa: BLE001 - report every failing case
            msg = str(exc).strip().splitlines()
            where = traceback.extract_tb(exc.__traceback__)[-1]
            failures.append(f"{family} {case.name}: {type(exc).__name__}: "
                            f"{msg[0] if msg else ''} ({where.filename}:{where.lineno})")
            print(f"FAIL {family} {case.name}:\n{exc}", file=sys.stderr)
    return {"family": family, "files": sorted(files), "cases": len(cases),
            "failures": failures, "seconds": time.perf_counter() - t0,
            "launched": {k for k in nvrtc.LAUNCHED if k[0] in files},
            "gpu_only": 0 if device == "cuda" else len(gpu_cases), "device": testing.DEVICE}


def _execute_all(families: list[str], device: str, jobs: int):
    """Yield each family's `_execute_family` result in the order given; `jobs` > 1 runs
    families in that many spawned processes (each family's cases stay in one process, in
    their order: a family's later cases may reuse what its earlier ones compiled)."""
    work = [(f, device) for f in families]
    if jobs <= 1 or len(work) <= 1:
        yield from map(_execute_family, work)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # Spawned workers, as for compiling: a forked copy of a process that loaded CuPy is unsafe.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(work)), mp_context=ctx) as pool:
        yield from pool.map(_execute_family, work)


def execute(mods: list, families: list[str], quiet: bool, device: str, jobs: int = 1) -> int:
    """Run the kernel cases of `families` on `device` (the emulated device, or a GPU), one
    family per process in `jobs` processes; count the instances that really launched."""
    declared = {(m.path.name, n) for m in mods for n in m.name_expressions}
    failures: list[str] = []
    gpu_only: list[str] = []
    executed: set = set()
    name = device
    t_all = time.perf_counter()
    for r in _execute_all(families, device, jobs):
        failures += r["failures"]
        executed |= r["launched"] & declared
        name = r["device"]
        if r["gpu_only"]:
            gpu_only.append(f"{r['family']}: {r['gpu_only']}")
        print(f"{r['family']} ({', '.join(r['files'])}): {r['cases']} cases, "
              f"{len(r['failures'])} failed, {len(r['launched'] & declared)} instances "
              f"executed, {r['seconds']:.1f} s")
    missing = sorted(declared - executed)
    if missing and not quiet:
        print("not executed:")
    for mod, kernel in missing[:50] if quiet else missing:
        print(f"  {mod}: {kernel}")
    print(f"{name} device: {len(mods)} modules in {time.perf_counter() - t_all:.0f} s")
    for f in failures:
        print(f"  {f}")
    if gpu_only:
        print(f"not run on the {name} device: the GPU-only cases (cuBLAS) of "
              f"{', '.join(gpu_only)}")
    print(f"executed {len(executed)} of {len(declared)} kernel instances, "
          f"{len(failures)} failures")
    return 0 if not failures and not missing else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=["80", "90"],
                    help="compute capabilities: 80 90 (or sm_80 sm_90)")
    ap.add_argument("--module", action="append", default=None,
                    help="only modules whose file stem contains this")
    ap.add_argument("--family", action="append", default=None,
                    help="only the modules of this op family (gpuplan/ops/FAMILY/)")
    ap.add_argument("--quiet", action="store_true", help="print only the summary and failures")
    ap.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                    help="compile (with --execute: run families) in this many processes "
                         "(default: the usable CPUs)")
    ap.add_argument("--execute", action="store_true",
                    help="run every instance on the emulated device against its reference")
    ap.add_argument("--device", choices=["emulated", "cuda"], default="emulated",
                    help="with --execute: where the instances run (cuda: on a GPU)")
    ns = ap.parse_args(argv)
    ns.arch = [a.removeprefix("sm_") for a in ns.arch]
    bad = [a for a in ns.arch if not a.isdigit()]
    if bad:
        ap.error(f"--arch: compute capabilities such as 80 or sm_90, given {' '.join(bad)}")
    if ns.jobs < 1:
        ap.error(f"--jobs: a number of processes >= 1, given {ns.jobs}")

    import gpuplan  # noqa: F401 - imports every family, which declares its CudaModule
    from gpuplan.nvrtc import registry

    mods = registry()
    if ns.module:
        mods = [m for m in mods if any(s in m.path.stem for s in ns.module)]
    if ns.family:
        from gpuplan.ops import FAMILIES

        unknown = sorted(set(ns.family) - set(FAMILIES))
        if unknown:
            ap.error(f"--family: one of {', '.join(FAMILIES)}, given {', '.join(unknown)}")
        mods = [m for m in mods if m.path.parent.name in ns.family]
    if ns.execute:
        # The families whose folders hold the selected modules (a family may have several
        # .cu files, and a file may back several modules: gemm.cu's plain and fused ones).
        return execute(mods, list(dict.fromkeys(m.path.parent.name for m in mods)), ns.quiet,
                       ns.device, ns.jobs)
    failures: list[str] = []
    n_kernels = 0
    for mod, arch, result in compile_all(mods, ns.arch, ns.jobs):
        if isinstance(result, str):
            failures.append(f"{mod.path.name} sm_{arch}: {result}")
            print(f"FAIL {mod.path.name} sm_{arch}:\n{result}", file=sys.stderr)
            continue
        rows, dt = result
        entry = [r for r in rows if r["kernel"] in mod.name_expressions]
        n_kernels += len(entry)
        print(f"{mod.path.name} sm_{arch}: {len(entry)} kernels in {dt:.1f} s")
        for r in entry:
            spill = r["spill_st"] + r["spill_ld"]
            flag = "  SPILL" if spill else ""
            if not ns.quiet or spill:
                print(f"  {r['kernel']:<70} regs={r['regs']:>3} stack={r['stack']:>4} "
                      f"spill={spill:>4} smem={r['smem']}{flag}")
            if spill:
                failures.append(
                    f"{mod.path.name} sm_{arch} {r['kernel']}: {spill} bytes spilled")
    print(f"compile check: {len(mods)} modules, {n_kernels} kernel instances, "
          f"arch {' '.join('sm_' + a for a in ns.arch)}, {len(failures)} failures")
    for f in failures:
        print(f"  {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
