"""Kernel benchmarks: run every case of every benchsuite/kernels/<family>.py on the GPU.

    python scripts/bench_kernels.py [--filter SUBSTRING ...] [--json PATH] [--iters N] [--smoke]

Prints one row per case: median ms, GB/s and % of the device-to-device copy bandwidth (when
the case says how many bytes it moves), TFLOP/s (when it says how many flops), and the
baseline's ms and our speedup over it (when it has a baseline). Exits 2 without a GPU.

--smoke runs the same cases at tiny sizes (GPUPLAN_BENCH_SMOKE=1, see benchmarks/common.py):
a quick check on a GPU that every case runs, and, on the emulated device
(``GPUPLAN_DEVICE=emulated`` or ``--device emulated``), a check without a GPU that no case
misuses the plan API. There the host clock times the calls (launches complete before they
return; default 0 warm-ups and 1 timed call), no copy bandwidth is measured, baselines (CuPy,
torch) are skipped, and CuPy is never imported. Those timings say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import pkgutil
import sys
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SKIP_MODULES = {"common"}


def device_info() -> dict[str, Any]:
    from gpuplan import backend

    if backend.emulated_default():  # no CuPy here: the GPU fields are None
        return {"device": "emulated device", "compute_capability": None, "sm_count": None,
                "memory_gib": None, "cuda_runtime": None, "cuda_driver": None, "cupy": None}
    import cupy as cp

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"]
    return {
        "device": name.decode() if isinstance(name, bytes) else str(name),
        "compute_capability": dev.compute_capability,
        "sm_count": int(props.get("multiProcessorCount", 0)),
        "memory_gib": round(props.get("totalGlobalMem", 0) / 2**30, 1),
        "cuda_runtime": _version(cp.cuda.runtime.runtimeGetVersion()),
        "cuda_driver": _version(cp.cuda.runtime.driverGetVersion()),
        "cupy": cp.__version__,
    }


def _version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def discover() -> tuple[list[tuple[str, Any]], list[dict]]:
    """(family, Case) for every case of every benchmark module, and import errors.

    The modules size their cases at import time: set GPUPLAN_BENCH_SMOKE first for smoke
    sizes."""
    import benchsuite.kernels as pkg

    cases: list[tuple[str, Any]] = []
    errors: list[dict] = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name in SKIP_MODULES or info.name.startswith("_"):
            continue
        try:
            mod = importlib.import_module(f"benchsuite.kernels.{info.name}")
        except Exception as exc:  # noqa: BLE001 - one broken module must not hide the others
            errors.append({"case": f"{info.name} (import)", "error": _short_error(exc)})
            continue
        for case in getattr(mod, "CASES", []):
            cases.append((info.name, case))
    return cases, errors


def _short_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def _fmt(v: Any, spec: str) -> str:
    return "" if v is None else format(v, spec)


def table(rows: list[dict]) -> str:
    """A Markdown table of benchmark rows (also readable on a terminal)."""
    head = ["case", "ms", "GB/s", "% copy", "TFLOP/s", "baseline", "base ms", "speedup"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | ERROR: {r['error']} |" + " |" * (len(head) - 2))
            continue
        base = r.get("baseline_name", "")
        if "baseline_error" in r:
            base = f"{base} (failed: {r['baseline_error'][:80]})"
        elif "baseline_skipped" in r:
            base = f"{base} (skipped: {r['baseline_skipped']})"
        case = f"{r['case']} ({r['note']})" if "note" in r else r["case"]
        cells = [case, _fmt(r.get("ms"), ".4f"), _fmt(r.get("gbs"), ".0f"),
                 _fmt(r.get("pct_copy"), ".0f"), _fmt(r.get("tflops"), ".1f"), base,
                 _fmt(r.get("baseline_ms"), ".4f"), _fmt(r.get("speedup"), ".2f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _header(info: dict, n: int) -> str:
    if info["compute_capability"] is None:
        return f"bench_kernels: {info['device']}; {n} cases"
    return (f"bench_kernels: {info['device']} (sm_{info['compute_capability']}), "
            f"CUDA {info['cuda_runtime']}, CuPy {info['cupy']}; {n} cases")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--filter", action="append", default=None,
                    help="only cases whose name contains this (repeatable)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed calls first (default 5; 0 on the emulated device)")
    ap.add_argument("--iters", type=int, default=None,
                    help="timed calls, median reported (default 20; 1 on the emulated device)")
    ap.add_argument("--smoke", action="store_true",
                    help="every case at a tiny size: a quick check that each one runs")
    ap.add_argument("--device", choices=["auto", "emulated"], default="auto",
                    help="emulated: the emulated device, as GPUPLAN_DEVICE=emulated "
                         "(auto: the GPU, or the emulated device under that variable)")
    ns = ap.parse_args(argv)
    if ns.device == "emulated":
        os.environ["GPUPLAN_DEVICE"] = "emulated"
    if ns.smoke:
        from benchsuite.kernels.common import SMOKE_ENV

        os.environ[SMOKE_ENV] = "1"  # before discover() imports the family modules

    from gpuplan import backend

    if not backend.device_available():
        why = "CuPy is not importable" if backend.cupy_module() is None else \
            "CuPy found no CUDA device (no GPU or no driver)"
        print(f"bench_kernels: no usable CUDA GPU on this machine ({why}); "
              "the kernel benchmarks need one (GPUPLAN_DEVICE=emulated runs them on the "
              "emulated device).", file=sys.stderr)
        return 2

    from benchsuite.kernels.common import copy_bandwidth_gbs, run_case

    emulated = backend.emulated_default()
    warmup = ns.warmup if ns.warmup is not None else (0 if emulated else 5)
    iters = ns.iters if ns.iters is not None else (1 if emulated else 20)
    info = device_info()
    cases, rows = discover()
    import_errors = [r["case"] for r in rows]
    if ns.filter:
        cases = [(f, c) for f, c in cases if any(s in c.name for s in ns.filter)]
    print(_header(info, len(cases)) + (" (smoke sizes)" if ns.smoke else ""), flush=True)
    copy_gbs = copy_bandwidth_gbs()
    print("device-to-device copy: " + ("not measured on the emulated device" if copy_gbs is None
                                       else f"{copy_gbs:.0f} GB/s"), flush=True)
    for family, case in cases:
        try:
            row = run_case(case, warmup, iters, copy_gbs)
        except Exception as exc:  # noqa: BLE001 - report and go on with the other cases
            traceback.print_exc()
            row = {"case": case.name, "error": _short_error(exc)}
        row["family"] = family
        rows.append(row)
        shown = f"{row['ms']:.4f} ms" if "ms" in row else row["error"]
        print(f"  {case.name}: {shown}", flush=True)
    print(table(rows))
    result = {
        **info,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "smoke": ns.smoke,
        "copy_gbs": copy_gbs,
        "warmup": warmup,
        "iters": iters,
        "import_errors": import_errors,
        "cases": rows,
    }
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {ns.json}")
    failed = [r["case"] for r in rows if "error" in r]
    if failed:
        print(f"bench_kernels: {len(failed)} case(s) failed: {', '.join(failed)}",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
