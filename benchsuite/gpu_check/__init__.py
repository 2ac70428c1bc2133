"""The GPU check: one command that answers what a first lent GPU can tell us, within a budget.

    python3 scripts/gpu_check.py --budget 480 --out "$OUT"          on the lent machine
    python3 scripts/gpu_check.py --device emulated --budget 300 --out DIR   the rehearsal

Phases run in priority order (benchsuite.gpu_check.phases; `--list` prints them), each in its
own process group under its own cap, each skipped, and said so, when its estimate no longer
fits the budget. After every phase `summary.md` and the evidence files are rewritten in
--out: at most 8 flat files (orchestrator.OUT_FILES), so a command cut off at the machine's
limit still returns everything that finished. Nothing is installed: the checkout runs from
PYTHONPATH, and a carried `.carry/mpich-*.whl` is unpacked into the work folder only when
`from mpi4py import MPI` fails. Safe defaults: host-staged MPI, a collective watchdog below
each phase's cap.

Exit status: 0 when no phase failed, 1 when one did, 2 when there is no usable device (the
summary says why) or an argument is wrong, 128 + N on signal N.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from benchsuite.gpu_check import procs
from benchsuite.gpu_check.orchestrator import ROOT, Check, Phase, Result, run_phases
from benchsuite.gpu_check.phases import PHASES

__all__ = ["main", "PHASES"]


def git_commit() -> str:
    if os.environ.get("GPU_CHECK_COMMIT"):
        return os.environ["GPU_CHECK_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, check=True, timeout=30).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True, timeout=30).stdout
        return out.strip() + (" (with uncommitted changes)" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git checkout here; set GPU_CHECK_COMMIT)"


def child_env(device: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONHASHSEED="0")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("GPUPLAN_DIST_BACKEND", "mpi-host-staged")  # safe on any MPI
    if device == "emulated":
        env["GPUPLAN_DEVICE"] = "emulated"
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def list_phases() -> str:
    width = max(len(p.name) for p in PHASES)
    lines = ["phases, in priority order (estimate / cap in seconds on a GPU; 'GPU only' ones "
             "are SKIPPED on the emulated rehearsal):"]
    for p in PHASES:
        where = "GPU only" if p.emulated is None else f"rehearsal {p.emulated[0]:.0f}/" \
                                                      f"{p.emulated[1]:.0f}"
        lines.append(f"  {p.name:<{width}}  {p.estimate:>4.0f} / {p.cap:<5.0f} {where:<15} "
                     f"-> {p.file}: {p.what}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=list_phases())
    ap.add_argument("--budget", type=float, default=480.0,
                    help="seconds for the whole run (default 480: a lent machine's command "
                         "has 600 s, its start and transfers not included)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "gpu_check",
                    help="where the (at most 8) result files go, e.g. \"$OUT\"")
    ap.add_argument("--work", type=Path, default=None,
                    help="logs and intermediate results (default: reports/gpu_check_work)")
    ap.add_argument("--device", choices=["cuda", "emulated"], default="cuda",
                    help="cuda: the GPU; emulated: rehearse the orchestration without one")
    ap.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                    help="processes for the compile phase (default: the usable CPUs)")
    ap.add_argument("--list", action="store_true", help="print the phases and exit")
    ap.add_argument("--phase", action="append", default=None, metavar="NAME",
                    help="run only these phases (repeatable), in the usual order")
    ap.add_argument("--plant-hang", default=None, metavar="PHASE", help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    names = [p.name for p in PHASES]
    for given in (ns.phase or []) + ([ns.plant_hang] if ns.plant_hang else []):
        if given not in names:
            ap.error(f"--phase/--plant-hang: one of {', '.join(names)}, given {given!r}")
    if not 10 <= ns.budget <= 3600:
        ap.error(f"--budget: seconds between 10 and 3600, given {ns.budget:g}")
    if ns.jobs < 1:
        ap.error(f"--jobs: a number of processes >= 1, given {ns.jobs}")
    return ns


def hang_body(check: Check, result: Result) -> None:
    """A planted hang (rehearsal test): a command that never ends on its own."""
    check.command(result, [check.python, "-c", "import time\nwhile True: time.sleep(1)"])


def _prepare_out(out: Path) -> None:
    """The output folder holds only this run's files: the 8 it writes, nothing else. An
    existing folder is refused unless it is empty or holds only files an earlier check wrote
    (which are replaced)."""
    from benchsuite.gpu_check.orchestrator import OUT_FILES

    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise SystemExit(f"gpu_check.py: --out: a folder, given {out} (a file or a link)")
    if out.exists():
        other = sorted(p.name for p in out.iterdir()
                       if p.name not in OUT_FILES and not p.name.endswith(".part"))
        if other:
            raise SystemExit(f"gpu_check.py: --out: an empty folder or an earlier check's, "
                             f"given {out} holding {', '.join(other[:5])}")
        for p in out.iterdir():
            p.unlink()
    out.mkdir(parents=True, exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    if ns.list:
        print(list_phases())
        return 0
    try:
        _prepare_out(ns.out)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    work = ns.work or ROOT / "reports" / "gpu_check_work"
    if work.resolve() == ns.out.resolve():
        print("gpu_check.py: --work: a folder other than --out", file=sys.stderr)
        return 2
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    check = Check(ns.device, ns.budget, ns.out, work, child_env(ns.device),
                  sys.executable or "python3", git_commit(), ns.jobs)
    phases = [p for p in PHASES if ns.phase is None or p.name in ns.phase]
    if ns.plant_hang:
        phases = [Phase(p.name, p.what + " [PLANTED HANG]", hang_body, p.estimate, p.cap,
                        p.file, p.emulated, False, p.after)
                  if p.name == ns.plant_hang else p for p in phases]
    print(f"gpu_check: device {ns.device}, budget {ns.budget:.0f} s, commit {check.commit}, "
          f"out {ns.out}", flush=True)

    def on_signal(signum: int, _frame: object) -> None:
        procs.kill_all()
        raise KeyboardInterrupt(signum)

    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {sig: signal.signal(sig, on_signal) for sig in signals}
    try:
        results = run_phases(check, phases)
    except KeyboardInterrupt as exc:
        signum = exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT
        running = next((r for r in reversed(check.results) if r.status == "RUNNING"), None)
        if running is not None:
            running.fail(f"interrupted by signal {signum}")
        check.write_outputs()
        print(f"gpu_check: interrupted by signal {signum}; results so far in {ns.out}",
              file=sys.stderr)
        return 128 + int(signum)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("\n" + (ns.out / "summary.md").read_text(), flush=True)
    if check.stop_reason and any(r.name == "env" and r.status == "FAILED" for r in results):
        return 2
    return 1 if any(r.status == "FAILED" for r in results) else 0
