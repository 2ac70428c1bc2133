"""GPU check: install, gpu tests, full suite, 2-rank MPI smoke test, kernel benchmarks, report.

    python3 scripts/gpu_check.py            (what `make gpu-check` runs)

Meant for a GPU machine with no package registry and a preinstalled CuPy: it uses the
interpreter that runs it (no venv), installs the project without dependencies, runs
`pytest -m gpu`, the whole non-mpi suite, the mpi tests under `mpiexec -n 2` (installing a
carried `.carry/mpich*.whl` first when there is no mpiexec) and scripts/bench_kernels.py,
then writes reports/gpu_check.md and prints it. A failing step is recorded and the others
still run; the exit status is 1 if any step failed, 2 when there is no GPU at all.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
PY = sys.executable or shutil.which("python3") or "python3"


@dataclass
class Step:
    name: str
    status: str = "not run"  # passed | failed | skipped
    detail: str = ""
    seconds: float = 0.0
    log: Path | None = None
    tail: list[str] = field(default_factory=list)


def probe_gpu() -> tuple[bool, str]:
    """(True, device description) when CuPy sees a CUDA device, else (False, why not)."""
    try:
        import cupy as cp
    except Exception as exc:  # noqa: BLE001 - any import failure means no usable CuPy
        return False, f"CuPy cannot be imported ({type(exc).__name__}: {exc})"
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no driver, no device
        return False, f"CuPy finds no CUDA device ({type(exc).__name__}: {exc})"
    if count < 1:
        return False, "CuPy reports 0 CUDA devices"
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    rt, drv = cp.cuda.runtime.runtimeGetVersion(), cp.cuda.runtime.driverGetVersion()
    cc = cp.cuda.Device(0).compute_capability
    return True, (f"{name} (sm_{cc}, {props['multiProcessorCount']} SMs, "
                  f"{props['totalGlobalMem'] / 2**30:.0f} GiB), {count} device(s); "
                  f"CUDA runtime {rt // 1000}.{rt % 1000 // 10}, driver {drv // 1000}."
                  f"{drv % 1000 // 10}; CuPy {cp.__version__}")


def run_step(step: Step, cmd: list[str], env: dict[str, str], timeout: int) -> int:
    """Run `cmd` in the repo root, echoing and logging its output; record status and time."""
    REPORTS.joinpath("gpu_check_logs").mkdir(parents=True, exist_ok=True)
    step.log = REPORTS / "gpu_check_logs" / (re.sub(r"\W+", "_", step.name).strip("_") + ".log")
    print(f"\n== {step.name}: {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    lines: list[str] = []
    try:
        with step.log.open("w") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, errors="replace")
            assert proc.stdout is not None
            watchdog = threading.Timer(timeout, proc.kill)  # a hung step must not hang us
            watchdog.start()
            try:
                for line in proc.stdout:
                    sys.stdout.write(line)
                    log.write(line)
                    lines.append(line.rstrip("\n"))
                rc = proc.wait()
            finally:
                watchdog.cancel()
            if time.monotonic() - t0 >= timeout:
                lines.append(f"gpu_check: killed after {timeout} s")
    except OSError as exc:
        rc = 127
        lines.append(f"gpu_check: could not start {cmd[0]}: {exc}")
    step.seconds = time.monotonic() - t0
    step.tail = lines[-40:]
    step.status = "passed" if rc == 0 else "failed"
    if rc != 0 and not step.detail:
        step.detail = f"exit status {rc}"
    return rc


def pytest_counts(lines: list[str]) -> str:
    """'120 passed, 4 skipped' from pytest's last summary line."""
    pat = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
    for line in reversed(lines):
        found = pat.findall(line)
        if found and " in " in line:
            return ", ".join(f"{n} {w}" for n, w in found)
    return "no pytest summary"


def find_mpiexec(env: dict[str, str]) -> str | None:
    return shutil.which("mpiexec", path=env.get("PATH"))


def install_carried_mpich(env: dict[str, str], steps: list[Step], timeout: int) -> None:
    wheels = sorted(ROOT.glob(".carry/mpich*.whl"))
    if find_mpiexec(env) or not wheels:
        return
    step = Step("install carried mpich wheel")
    steps.append(step)
    run_step(step, [PY, "-m", "pip", "install", "--no-deps", "--no-index", str(wheels[-1])],
             env, timeout)
    scripts_dir = sysconfig.get_path("scripts")
    env["PATH"] = scripts_dir + os.pathsep + env.get("PATH", "")


def mpi_launcher(env: dict[str, str], n: int) -> list[str] | None:
    """`mpiexec -n n` (Open MPI also gets --oversubscribe, and root permission when root)."""
    mpiexec = find_mpiexec(env)
    if mpiexec is None:
        return None
    cmd = [mpiexec, "-n", str(n)]
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             env=env).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        cmd += ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    return cmd


def mpi_step(env: dict[str, str], steps: list[Step], timeout: int) -> None:
    step = Step("mpi tests, mpiexec -n 2 (GPU smoke)")
    steps.append(step)
    launcher = mpi_launcher(env, 2)
    if launcher is None:
        step.status, step.detail = "skipped", "no mpiexec on PATH and no .carry/mpich*.whl"
        return
    run_step(step, launcher + [PY, "-m", "mpi4py", "scripts/mpi_pytest.py", "-m", "mpi", "-q"],
             env, timeout)
    step.detail = pytest_counts(step.tail) + ("" if step.status == "passed"
                                              else f"; {step.detail}")


def train_step(env: dict[str, str], steps: list[Step], timeout: int) -> None:
    """The main job on the GPU: 2 ranks sharing it as tp=2, then 4 as tp=2 x pp=2."""
    for n in (2, 4):
        step = Step(f"scripts/train.py on the GPU, mpiexec -n {n}")
        steps.append(step)
        launcher = mpi_launcher(env, n)
        if launcher is None:
            step.status, step.detail = "skipped", "no mpiexec"
            continue
        run_step(step, launcher + [PY, "-m", "mpi4py", "scripts/train.py", "--steps", "60",
                                   "--eval-interval", "20", "--progress", "plain",
                                   "--out", f"reports/train_gpu_n{n}"], env, timeout)
        step.detail = next((line for line in reversed(step.tail)
                            if line.startswith("step ")), step.detail)


def git_commit() -> str:
    if os.environ.get("GPU_CHECK_COMMIT"):
        return os.environ["GPU_CHECK_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True, check=False).stdout
        return out + (" (with uncommitted changes)" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git checkout here)"


def bench_table(path: Path) -> str:
    if not path.exists():
        return "_no benchmark results (see the bench step's log)_"
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_kernels import table

    data = json.loads(path.read_text())
    head = (f"Device-to-device copy: {data.get('copy_gbs', 0):.0f} GB/s; median of "
            f"{data.get('iters')} timed calls after {data.get('warmup')} warm-ups; speedup = "
            "baseline ms / our ms.\n\n")
    return head + table(data.get("cases", []))


def report(device: str, steps: list[Step], bench_json: Path) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# GPU check", "",
        f"- Date: {now}",
        f"- Commit: {git_commit()}",
        f"- Device: {device}",
        f"- Python {platform.python_version()} ({PY}), {platform.platform()}",
        "", "## Steps", "",
        "| step | result | details | seconds |", "|---|---|---|---|",
    ]
    for s in steps:
        lines.append(f"| {s.name} | {s.status.upper()} | {s.detail} | {s.seconds:.0f} |")
    lines += ["", "## Kernel benchmarks", "", bench_table(bench_json), ""]
    failed = [s for s in steps if s.status == "failed"]
    if failed:
        lines += ["## Failures (last lines of each failing step's log)", ""]
        for s in failed:
            log = os.path.relpath(s.log, ROOT) if s.log else "-"
            lines += [f"### {s.name} ({log})", "", "```", *s.tail, "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per step")
    ap.add_argument("--skip-bench", action="store_true")
    ns = ap.parse_args(argv)

    ok, device = probe_gpu()
    if not ok:
        print(f"gpu_check: NO GPU: {device}.\ngpu_check: nothing was run; run `make gpu-check` "
              "on a machine with an NVIDIA GPU, its driver and CuPy.", file=sys.stderr)
        return 2
    print(f"gpu_check: {device}", flush=True)

    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    steps: list[Step] = []

    # No registry here: build isolation would try to download setuptools, so use the
    # interpreter's own. PYTHONPATH above keeps the later steps working if this fails.
    step = Step("pip install --no-deps -e .")
    steps.append(step)
    run_step(step, [PY, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", "."],
             env, ns.timeout)

    for name, marker in (("pytest -m gpu", "gpu"), ("pytest -m 'not mpi' (full suite)",
                                                    "not mpi")):
        step = Step(name)
        steps.append(step)
        run_step(step, [PY, "-m", "pytest", "-q", "-m", marker], env, ns.timeout)
        step.detail = pytest_counts(step.tail) + ("" if step.status == "passed"
                                                  else f"; {step.detail}")

    install_carried_mpich(env, steps, ns.timeout)
    mpi_step(env, steps, ns.timeout)
    train_step(env, steps, ns.timeout)

    bench_json = REPORTS / "bench.json"
    if ns.skip_bench:
        steps.append(Step("kernel benchmarks", "skipped", "--skip-bench"))
    else:
        bench_json.unlink(missing_ok=True)
        step = Step("kernel benchmarks")
        steps.append(step)
        run_step(step, [PY, "scripts/bench_kernels.py", "--json", str(bench_json)], env,
                 ns.timeout)

    text = report(device, steps, bench_json)
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / "gpu_check.md").write_text(text + "\n")
    print("\n" + text)
    print(f"\nwrote {os.path.relpath(REPORTS / 'gpu_check.md', ROOT)}")
    return 1 if any(s.status == "failed" for s in steps) else 0


if __name__ == "__main__":
    sys.exit(main())
