"""GPU check in steps that each fit one lent-machine command (at most 600 s).

    python3 scripts/gpu_check.py --list                  the steps, one line each
    python3 scripts/gpu_check.py --step install --step compile   only these (in this order)
    python3 scripts/gpu_check.py                         every step in order (make gpu-check)

Meant for a GPU machine with no package registry and a preinstalled CuPy: it uses the
interpreter that runs it (no venv) and installs the project without dependencies. Each step
runs in its own process group under a time limit (--timeout, default 540 s) and is killed,
with everything it started, when it overruns. As soon as a step ends, its result (PASSED,
FAILED or SKIPPED, details, seconds, date, commit, device) is appended to
reports/gpu_check.md, which is never rewritten; each step's output is in
reports/gpu_check_logs/STEP.log. A failing step never stops the others. Exit status: 0 when
no step failed, 1 when one did, 2 when there is no GPU (nothing is run) or a step name is
unknown.

Run `install` first on a fresh machine (it also installs a carried `.carry/mpich*.whl` when
there is no mpiexec, and every other carried `.carry/*.whl`: safetensors, threadpoolctl,
tqdm), then `compile` (fills CuPy's kernel cache, so later steps start warm).
Set GPU_CHECK_COMMIT to the commit being checked when the tree has no .git folder.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
REPORT = REPORTS / "gpu_check.md"
LOGS = REPORTS / "gpu_check_logs"
PY = sys.executable or shutil.which("python3") or "python3"
DEFAULT_TIMEOUT = 540

REPORT_HEADER = """# GPU check results

Written by `scripts/gpu_check.py`: one section per step, appended as soon as the step ends
(oldest first; earlier sections are never rewritten). Each step's full output is in
`reports/gpu_check_logs/STEP.log` on the machine that ran it.

"""


@dataclass
class Step:
    name: str
    status: str = "not run"  # passed | failed | skipped
    detail: str = ""
    seconds: float = 0.0
    log: Path | None = None
    lines: list[str] = field(default_factory=list)  # output of the step's latest command
    tail: list[str] = field(default_factory=list)  # last lines of its first failing command
    extra: str = ""  # Markdown appended below the result (benchmark tables)


@dataclass
class Context:
    env: dict[str, str]
    timeout: float
    device: str = "unknown"
    commit: str = "unknown"
    report: Path = REPORT
    out: Path | None = None
    deadline: float = 0.0  # time.monotonic() by which the current step must end


@dataclass(frozen=True)
class StepSpec:
    name: str
    help: str
    body: Callable[[Context, Step], None]


class Interrupted(Exception):
    """gpu_check itself got SIGTERM/SIGINT/SIGHUP while a step ran."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum


# -- the device ------------------------------------------------------------------------------

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


def probe_gpu_subprocess(env: dict[str, str]) -> tuple[bool, str]:
    """probe_gpu() in a child process, so that this process never holds a CUDA context."""
    try:
        res = subprocess.run([PY, __file__, "--worker", "probe"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"the GPU probe did not finish ({type(exc).__name__}: {exc})"
    for line in reversed(res.stdout.splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            return bool(data["ok"]), str(data["device"])
    tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
    return False, f"the GPU probe crashed (exit {res.returncode}): {' / '.join(tail)}"


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
        return "unknown (no git checkout here; set GPU_CHECK_COMMIT)"


# -- running one command ---------------------------------------------------------------------

_CURRENT: subprocess.Popen | None = None
try:  # loaded here: the child must not import anything between fork and exec
    import ctypes

    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
except (ImportError, OSError, AttributeError):
    _PRCTL = None


def _child_setup() -> None:  # runs in the child between fork and exec
    os.setpgid(0, 0)  # its own process group, killed as a whole on timeout
    if _PRCTL is not None:  # and killed if gpu_check itself dies (PR_SET_PDEATHSIG = 1)
        _PRCTL(1, int(signal.SIGKILL), 0, 0, 0)


def kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the process group of `proc`, then SIGKILL whatever is left of it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass


def run_command(cmd: list[str], env: dict[str, str], timeout: float, log: Path,
                append: bool = False) -> tuple[int, list[str], bool]:
    """Run `cmd` in the repo root in its own process group, echoing and logging its output.

    Returns (exit status, output lines, timed out). On timeout the whole group is killed.
    """
    global _CURRENT
    log.parent.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    t0 = time.monotonic()
    print(f"\n== {' '.join(cmd)}", flush=True)
    with log.open("a" if append else "w", encoding="utf-8") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        try:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, errors="replace",
                                    preexec_fn=_child_setup)
        except OSError as exc:
            msg = f"gpu_check: could not start {cmd[0]}: {exc}"
            out.write(msg + "\n")
            print(msg, flush=True)
            return 127, [msg], False

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                out.write(line)
                lines.append(line.rstrip("\n"))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        _CURRENT = proc
        timed_out = False
        try:
            proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _CURRENT = None
            kill_group(proc)  # on timeout or interrupt; after a normal exit, any stragglers
            reader.join(timeout=10)
        sys.stdout.flush()
        if timed_out:
            msg = (f"gpu_check: killed after {time.monotonic() - t0:.0f} s "
                   "(the step's time limit)")
            lines.append(msg)
            out.write(msg + "\n")
            print(msg, flush=True)
    rc = proc.returncode if proc.returncode is not None else -9
    return (124 if timed_out else rc), lines, timed_out


def run_step(step: Step, cmd: list[str], ctx: Context, append: bool = False) -> int:
    """Run one command of `step` within the step's deadline; record status and output tail."""
    step.log = LOGS / (re.sub(r"[^\w.-]+", "_", step.name).strip("_") + ".log")
    remaining = ctx.deadline - time.monotonic()
    if remaining <= 1:
        step.status = "failed"
        step.detail = _join(step.detail, f"no time left for `{Path(cmd[-1]).name}`")
        return 124
    rc, lines, timed_out = run_command(cmd, ctx.env, remaining, step.log, append)
    step.lines = lines
    if rc != 0 and step.status != "failed":
        step.tail = lines[-40:]
    if rc != 0:
        step.status = "failed"
        why = f"timed out after {ctx.timeout:.0f} s" if timed_out else f"exit status {rc}"
        step.detail = _join(step.detail, why)
    elif step.status != "failed":
        step.status = "passed"
    return rc


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def pytest_counts(lines: list[str]) -> str:
    """'120 passed, 4 skipped' from pytest's last summary line."""
    pat = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
    for line in reversed(lines):
        found = pat.findall(line)
        if found and " in " in line:
            return ", ".join(f"{n} {w}" for n, w in found)
    return "no pytest summary"


# -- MPI -------------------------------------------------------------------------------------

def find_mpiexec(env: dict[str, str]) -> str | None:
    return shutil.which("mpiexec", path=env.get("PATH"))


def carried_mpich_wheel() -> Path | None:
    """The newest `.carry/mpich-*.whl` (not PyPI's `mpich-0.0.0` placeholder wheel)."""
    wheels = [w for w in ROOT.glob(".carry/mpich-*.whl") if not w.name.startswith("mpich-0.0.0")]

    def version(w: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", w.name.split("-")[1])[:4])

    return max(wheels, key=version) if wheels else None


_MPICH_PATHS = """
import importlib.metadata as md, json
try:
    d = md.distribution("mpich")
except md.PackageNotFoundError:
    print(json.dumps({}))
else:
    found = {}
    for f in d.files or ():
        s = str(f)
        if s.endswith("bin/mpiexec"):
            found["bin"] = str(d.locate_file(f).resolve().parent)
        elif "/libmpi.so" in "/" + s:
            found["lib"] = str(d.locate_file(f).resolve().parent)
    print(json.dumps(found))
"""


def add_installed_mpich(env: dict[str, str]) -> None:
    """Put the PyPI mpich's bin/ and lib/ on PATH and LD_LIBRARY_PATH when its mpiexec is
    the one to use (none other on PATH): a /usr/local or --user install is not always on
    those paths, and mpi4py does not look for libmpi there."""
    scripts = sysconfig.get_path("scripts")
    if scripts and scripts not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = os.pathsep.join(p for p in (scripts, env.get("PATH", "")) if p)
    try:
        res = subprocess.run([PY, "-c", _MPICH_PATHS], env=env, capture_output=True,
                             text=True, timeout=60)
        found = json.loads(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() else {}
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return
    mpiexec = find_mpiexec(env)
    if "bin" not in found or (mpiexec is not None
                              and Path(mpiexec).resolve().parent != Path(found["bin"])):
        return  # no PyPI mpich, or another MPI's mpiexec comes first: leave that one alone
    if mpiexec is None:
        env["PATH"] = found["bin"] + os.pathsep + env.get("PATH", "")
    if "lib" in found and found["lib"] not in env.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (found["lib"], env.get("LD_LIBRARY_PATH", "")) if p)


def mpi_launcher(env: dict[str, str], n: int) -> list[str] | None:
    """`mpiexec -n n` (Open MPI also gets --oversubscribe, and root permission when root)."""
    mpiexec = find_mpiexec(env)
    if mpiexec is None:
        return None
    cmd = [mpiexec, "-n", str(n)]
    try:
        version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                                 env=env, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    if "Open MPI" in version or "OpenRTE" in version:
        cmd += ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    return cmd


NO_MPIEXEC = "no mpiexec on PATH (run the install step with a .carry/mpich-*.whl)"


# -- the steps -------------------------------------------------------------------------------

def pip_install(step: Step, ctx: Context, args: list[str], append: bool) -> int:
    """pip install --no-deps ARGS, again with --break-system-packages if PEP 668 refuses."""
    cmd = [PY, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", *args]
    before = (step.status, step.detail, step.tail)
    rc = run_step(step, cmd, ctx, append)
    if rc != 0 and any("externally-managed-environment" in line for line in step.lines):
        step.status, step.detail, step.tail = before
        rc = run_step(step, cmd[:4] + ["--break-system-packages"] + cmd[4:], ctx, True)
    return rc


def step_install(ctx: Context, step: Step) -> None:
    notes = []
    wheel = carried_mpich_wheel()
    mpiexec = find_mpiexec(ctx.env)
    # Before anything imports mpi4py: mpi4py binds to the libmpi it finds first.
    if mpiexec is None and wheel is not None:
        rc = pip_install(step, ctx, ["--no-index", str(wheel)], append=False)
        notes.append(f"{wheel.name} installed" if rc == 0 else f"{wheel.name} NOT installed")
    elif wheel is not None:
        notes.append(f"{wheel.name} not needed")
    # The GPU machine has no registry: other runtime dependencies it lacks (safetensors,
    # threadpoolctl, tqdm; downloaded beside the mpich wheel) are carried in .carry/ too.
    others = sorted(w for w in ROOT.glob(".carry/*.whl") if not w.name.startswith("mpich"))
    if others:
        rc = pip_install(step, ctx, ["--no-index", *map(str, others)], append=step.log is not None)
        names = ", ".join(w.name.split("-")[0] for w in others)
        notes.append(f"carried {names} installed" if rc == 0 else f"carried {names} NOT installed")
    # No registry: build isolation would try to download setuptools, so use the
    # interpreter's own. PYTHONPATH (set for every step) keeps the others working anyway.
    before = (step.status, step.detail, step.tail)
    rc = pip_install(step, ctx, ["--no-build-isolation", "-e", "."], append=step.log is not None)
    if rc == 0:
        notes.insert(0, "project installed (pip, editable)")
    else:  # e.g. setuptools too old, or no `wheel` package: do what an editable install does
        pth = install_pth()
        if pth is not None:
            step.status, step.detail, step.tail = before
            notes.insert(0, f"pip -e . failed (see log); wrote {pth} instead")
        else:
            notes.insert(0, "project install failed")
    where = check_import(ctx.env)
    if where is None:
        notes.append("import gpuplan, autograd, dist FAILED outside the checkout")
        step.status = "failed"
    else:
        notes.append(f"imports from {where}")
    add_installed_mpich(ctx.env)
    mpiexec = find_mpiexec(ctx.env)
    notes.append(f"mpiexec: {mpiexec}" if mpiexec else NO_MPIEXEC)
    step.detail = _join("; ".join(notes), step.detail if step.status == "failed" else "")


def install_pth() -> str | None:
    """Put the checkout on sys.path with a .pth file in site-packages (or the user site)."""
    import site

    for folder in (sysconfig.get_path("purelib"), site.getusersitepackages()):
        path = Path(folder) / "gpuplan_runtime_checkout.pth"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(str(ROOT) + "\n")
            return str(path)
        except OSError:
            continue
    return None


def check_import(env: dict[str, str]) -> str | None:
    """Where `import gpuplan, autograd, dist` finds gpuplan without PYTHONPATH, from `/`."""
    clean = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    try:
        res = subprocess.run([PY, "-c", "import gpuplan, autograd, dist; "
                              "print(gpuplan.__path__[0])"], cwd="/", env=clean,
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = res.stdout.strip().splitlines()
    return str(Path(lines[-1]).parent) if res.returncode == 0 and lines else None


def step_compile(ctx: Context, step: Step) -> None:
    jobs = max(1, min(8, os.cpu_count() or 1))
    run_step(step, [PY, __file__, "--worker", "compile", "--jobs", str(jobs)], ctx)
    summary = next((line for line in reversed(step.lines) if line.startswith("compile:")), "")
    step.detail = _join(summary.removeprefix("compile:").strip(),
                        step.detail if step.status == "failed" else "")


def step_execute(ctx: Context, step: Step) -> None:
    """Every kernel instance through its plan on the GPU against its float64 reference (the
    cases CI runs on the emulated device)."""
    run_step(step, [PY, "scripts/check_kernels.py", "--execute", "--device", "cuda", "--quiet"],
             ctx)
    summary = next((line for line in reversed(step.lines) if line.startswith("executed ")), "")
    step.detail = _join(summary, step.detail if step.status == "failed" else "")


def _pytest_step(marker: str, paths: list[str], gpu: bool) -> Callable[[Context, Step], None]:
    def body(ctx: Context, step: Step) -> None:
        run_step(step, [PY, "-m", "pytest", "-q", "-m", marker, *paths], ctx)
        counts = pytest_counts(step.lines)
        failed = step.detail if step.status == "failed" else ""
        if gpu and step.status == "passed" and not re.search(r"\b[1-9]\d* passed", counts):
            step.status, failed = "failed", "no gpu test ran (did they all skip?)"
            step.tail = step.lines[-40:]
        step.detail = _join(counts, failed)

    return body


def _mpi_pytest_step(n: int) -> Callable[[Context, Step], None]:
    def body(ctx: Context, step: Step) -> None:
        launcher = mpi_launcher(ctx.env, n)
        if launcher is None:
            step.status, step.detail = "skipped", NO_MPIEXEC
            return
        run_step(step, launcher + [PY, "-m", "mpi4py", "scripts/mpi_pytest.py", "-m", "mpi",
                                   "-q"], ctx)
        step.detail = _join(pytest_counts(step.lines),
                            step.detail if step.status == "failed" else "")

    return body


def step_train(ctx: Context, step: Step) -> None:
    """The main job on the GPU: 2 ranks sharing it, then 4, 60 steps each."""
    notes = []
    for n in (2, 4):
        launcher = mpi_launcher(ctx.env, n)
        if launcher is None:
            step.status, step.detail = "skipped", NO_MPIEXEC
            return
        out = REPORTS / f"train_gpu_n{n}"
        shutil.rmtree(out, ignore_errors=True)
        rc = run_step(step, launcher + [PY, "-m", "mpi4py", "scripts/train.py", "--steps", "60",
                                        "--eval-interval", "20", "--progress", "plain",
                                        "--out", os.path.relpath(out, ROOT)], ctx, n != 2)
        notes.append(f"n={n}: " + (_train_summary(out, step.lines) if rc == 0 else "FAILED"))
    step.detail = _join(", ".join(notes), step.detail if step.status == "failed" else "")


def step_graphs(ctx: Context, step: Step) -> None:
    """CUDA graph capture on the GPU (scripts/check_graphs.py): a captured MLP training step
    equals eager bit for bit; a GPT step eager vs replayed, times and ratio."""
    run_step(step, [PY, "scripts/check_graphs.py", "--device", "cuda"], ctx)
    summary = next((line for line in reversed(step.lines) if line.startswith("graphs: ")), "")
    step.detail = _join(summary, step.detail if step.status == "failed" else "")


def _train_summary(out: Path, tail: list[str]) -> str:
    try:
        hist = json.loads((out / "metrics.json").read_text())["history"]
        first, last = hist[0], hist[-1]
        return (f"val loss {first['val_loss']:.2f} -> {last['val_loss']:.2f} in "
                f"{last['step']} steps, {last['tokens_per_s']:,.0f} tok/s")
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return next((line for line in reversed(tail) if line.startswith("step ")), "ok")


def bench_table(path: Path) -> str:
    if not path.exists():
        return "_no benchmark results (see the step's log)_"
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_kernels import table

    data = json.loads(path.read_text())
    head = (f"Device-to-device copy: {data.get('copy_gbs', 0):.0f} GB/s; median of "
            f"{data.get('iters')} timed calls after {data.get('warmup')} warm-ups; speedup = "
            "baseline ms / our ms.\n\n")
    return head + table(data.get("cases", []))


def step_bench_kernels(ctx: Context, step: Step) -> None:
    path = REPORTS / "bench.json"
    path.unlink(missing_ok=True)
    run_step(step, [PY, "scripts/bench_kernels.py", "--json", os.path.relpath(path, ROOT)], ctx)
    try:
        cases = json.loads(path.read_text()).get("cases", [])
        errors = sum("error" in c for c in cases)
        note = f"{len(cases)} cases, {errors} errors"
    except (OSError, ValueError):
        note = "no results"
    step.detail = _join(note, step.detail if step.status == "failed" else "")
    step.extra = bench_table(path)


#: bench-train's runs: (JSON name, extra arguments). The torch.compile run comes last, so
#: that a slow compilation cannot cost the other two their results.
BENCH_TRAIN_RUNS = [("bf16", ["--dtype", "bf16", "--cuda-graph"]),
                    ("f32", ["--dtype", "f32", "--cuda-graph"]),
                    ("bf16_compile", ["--dtype", "bf16", "--torch-compile"])]


def step_bench_train(ctx: Context, step: Step) -> None:
    """GPT-2 small training step: ours eager and graph-captured vs PyTorch eager in bf16
    (autocast) then f32; then bf16 again against torch.compile."""
    notes, blocks = [], []
    for k, (tag, extra) in enumerate(BENCH_TRAIN_RUNS):
        path = REPORTS / f"bench_train_{tag}.json"
        path.unlink(missing_ok=True)
        run_step(step, [PY, "scripts/bench_train.py", "--model", "gpt2", "--device", "cuda",
                        *extra, "--json", os.path.relpath(path, ROOT)], ctx, k > 0)
        notes.append(f"{tag}: {_bench_train_summary(path)}")
        head = next((i for i, line in enumerate(step.lines)
                     if line.startswith("# bench_train")), max(0, len(step.lines) - 20))
        shown = [line for line in step.lines[head:] if not line.startswith("# wrote")]
        blocks += [f"`bench_train.py --model gpt2 {' '.join(extra)}`:", "", "```", *shown,
                   "```", ""]
    step.detail = _join("; ".join(notes), step.detail if step.status == "failed" else "")
    step.extra = "\n".join(blocks).rstrip()


def _bench_train_summary(path: Path) -> str:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return "no results"
    ours = data["ours"]
    mfu = "" if ours.get("mfu") is None else f", MFU {100 * ours['mfu']:.1f}%"
    text = f"ours {ours['step_ms']:.1f} ms/step, {ours['tokens_per_s']:,.0f} tok/s{mfu}"
    text += "".join(f", {pair} {r:.2f}x" for pair, r in data.get("ratios", {}).items())
    agree = [v["first_loss_agree"] for v in data.values()
             if isinstance(v, dict) and "first_loss_agree" in v]
    if agree:
        text += f", first losses {'agree' if all(agree) else 'DISAGREE'}"
    if "torch_compile_error" in data:
        text += f", torch.compile failed: {data['torch_compile_error'][:120]}"
    return text


def step_bench_comm(ctx: Context, step: Step) -> None:
    launcher = mpi_launcher(ctx.env, 2)
    if launcher is None:
        step.status, step.detail = "skipped", NO_MPIEXEC
        return
    run_step(step, launcher + [PY, "-m", "mpi4py", "scripts/bench_comm.py", "--iters", "20",
                               "--max-mib", "64", "--device", "auto"], ctx)
    table = [line for line in step.lines if re.match(r"(# ranks=|op |all_reduce |send_recv )",
                                                    line)]
    head = next((line for line in table if line.startswith("# ranks=")), "")
    step.detail = _join(head.lstrip("# "), step.detail if step.status == "failed" else "")
    if table:
        step.extra = "\n".join(["```", *table, "```"])


STEPS: list[StepSpec] = [
    StepSpec("install", "pip install --no-deps -e . (first a carried .carry/mpich-*.whl when "
             "there is no mpiexec)", step_install),
    StepSpec("compile", "compile every kernel instance of every gpuplan .cu module on the GPU "
             "(fills CuPy's kernel cache; once per machine)", step_compile),
    StepSpec("execute", "check_kernels.py --execute --device cuda: every kernel instance vs its "
             "float64 reference on the GPU", step_execute),
    StepSpec("gpu-gpuplan", "pytest -m gpu tests/gpuplan", _pytest_step(
        "gpu", ["tests/gpuplan"], gpu=True)),
    StepSpec("gpu-other", "pytest -m gpu tests/autograd tests/dist tests/scripts", _pytest_step(
        "gpu", ["tests/autograd", "tests/dist", "tests/scripts"], gpu=True)),
    StepSpec("unit-gpuplan", "pytest -m 'not mpi and not gpu' tests/gpuplan", _pytest_step(
        "not mpi and not gpu", ["tests/gpuplan"], gpu=False)),
    StepSpec("unit-autograd", "pytest -m 'not mpi and not gpu' tests/autograd", _pytest_step(
        "not mpi and not gpu", ["tests/autograd"], gpu=False)),
    StepSpec("unit-dist", "pytest -m 'not mpi and not gpu' tests/dist tests/scripts",
             _pytest_step("not mpi and not gpu", ["tests/dist", "tests/scripts"], gpu=False)),
    StepSpec("mpi2", "mpi tests under mpiexec -n 2 (GPU shared by the ranks)", _mpi_pytest_step(2)),
    StepSpec("mpi4", "mpi tests under mpiexec -n 4 (GPU shared by the ranks)", _mpi_pytest_step(4)),
    StepSpec("train", "scripts/train.py on the GPU, 60 steps, under mpiexec -n 2 then -n 4",
             step_train),
    StepSpec("graphs", "scripts/check_graphs.py: captured training step vs eager (bitwise), "
             "eager vs replayed step time", step_graphs),
    StepSpec("bench-kernels", "scripts/bench_kernels.py (table added to the report)",
             step_bench_kernels),
    StepSpec("bench-train", "scripts/bench_train.py --model gpt2: ours eager and captured vs "
             "PyTorch eager in bf16 then f32, then bf16 vs torch.compile", step_bench_train),
    StepSpec("bench-comm", "scripts/bench_comm.py under mpiexec -n 2, host and device buffers",
             step_bench_comm),
]
STEP_NAMES = [s.name for s in STEPS]
GROUPS: dict[str, list[str]] = {
    "gpu-tests": ["gpu-gpuplan", "gpu-other"],
    "unit": ["unit-gpuplan", "unit-autograd", "unit-dist"],
    "mpi": ["mpi2", "mpi4"],
    "bench": ["graphs", "bench-kernels", "bench-train", "bench-comm"],
}


def list_steps() -> str:
    width = max(map(len, STEP_NAMES + list(GROUPS)))
    lines = ["steps (all of them, in this order, when no --step is given):"]
    lines += [f"  {s.name:<{width}}  {s.help}" for s in STEPS]
    lines.append("groups (--step GROUP runs these steps):")
    lines += [f"  {g:<{width}}  {' '.join(names)}" for g, names in GROUPS.items()]
    return "\n".join(lines)


def resolve_steps(requested: list[str] | None) -> list[str]:
    """Step names to run, in the order asked (groups expanded, duplicates dropped).

    Raises ValueError naming the unknown ones."""
    if not requested:
        return list(STEP_NAMES)
    unknown = [r for r in requested if r not in STEP_NAMES and r not in GROUPS]
    if unknown:
        raise ValueError(f"unknown step {', '.join(map(repr, unknown))}; steps: "
                         f"{', '.join(STEP_NAMES)}; groups: {', '.join(GROUPS)}")
    names: list[str] = []
    for r in requested:
        for name in GROUPS.get(r, [r]):
            if name not in names:
                names.append(name)
    return names


# -- the report ------------------------------------------------------------------------------

def format_result(step: Step, commit: str, device: str, when: datetime.datetime | None = None
                  ) -> str:
    """One step's section of reports/gpu_check.md."""
    when = when or datetime.datetime.now(datetime.timezone.utc)
    lines = [f"## {step.name}: {step.status.upper()}", "",
             f"- date: {when.strftime('%Y-%m-%d %H:%M UTC')}; {step.seconds:.0f} s",
             f"- details: {step.detail or '-'}",
             f"- commit: {commit}",
             f"- device: {device}; Python {platform.python_version()}"]
    if step.log is not None:
        lines.append(f"- log: {os.path.relpath(step.log, ROOT)}")
    if step.extra:
        lines += ["", step.extra]
    if step.status == "failed" and step.tail:
        lines += ["", "Last lines of the log:", "", "```", *step.tail, "```"]
    return "\n".join(lines) + "\n\n"


def append_report(path: Path, text: str) -> None:
    """Append `text` to the report, writing the header first when the file is new or empty.

    Opened in append mode: what is already there is never read back or rewritten."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        if os.fstat(f.fileno()).st_size == 0:
            f.write(REPORT_HEADER)
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def copy_out(ctx: Context) -> None:
    """Copy reports/ (files under 50 MB) to --out DIR, so a killed command still returns them."""
    if ctx.out is None or not REPORTS.exists():
        return

    def ignore(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if os.path.isfile(os.path.join(folder, n))
                and os.path.getsize(os.path.join(folder, n)) > 50 << 20]

    try:
        shutil.copytree(REPORTS, ctx.out / "reports", ignore=ignore, dirs_exist_ok=True)
    except OSError as exc:
        print(f"gpu_check: could not copy reports to {ctx.out}: {exc}", file=sys.stderr)


def run_one(spec: StepSpec, ctx: Context) -> Step:
    """Run one step under the step time limit, then append its result to the report."""
    step = Step(spec.name)
    t0 = time.monotonic()
    ctx.deadline = t0 + ctx.timeout
    interrupted: Interrupted | None = None
    try:
        spec.body(ctx, step)
    except Interrupted as exc:
        interrupted = exc
        step.status, step.detail = "failed", _join(step.detail, str(exc))
    except Exception as exc:  # noqa: BLE001 - a broken step must not stop the others
        step.status = "failed"
        step.detail = _join(step.detail, f"gpu_check error: {type(exc).__name__}: {exc}")
    if step.status == "not run":
        step.status = "passed"
    step.seconds = time.monotonic() - t0
    append_report(ctx.report, format_result(step, ctx.commit, ctx.device))
    copy_out(ctx)
    print(f"\n== {step.name}: {step.status.upper()} ({step.seconds:.0f} s) {step.detail}",
          flush=True)
    if interrupted is not None:
        raise interrupted
    return step


# -- workers (run in child processes) ---------------------------------------------------------

def _compile_module(index: int) -> tuple[str, int, float, str]:
    """Compile every instance of registry()[index] on device 0: (file, kernels, s, error)."""
    import gpuplan  # noqa: F401 - imports every op family, which declares its CudaModule
    from gpuplan.nvrtc import registry

    mod = registry()[index]
    t0 = time.perf_counter()
    try:
        for name in mod.name_expressions:
            mod.function(name, 0)
    except Exception as exc:  # noqa: BLE001 - reported by the parent
        err = f"{type(exc).__name__}: {exc}"
        return mod.path.name, len(mod.name_expressions), time.perf_counter() - t0, err
    return mod.path.name, len(mod.name_expressions), time.perf_counter() - t0, ""


def worker_compile(jobs: int) -> int:
    """Compile all modules (`jobs` processes in parallel, largest first), then load them all
    again in this process from CuPy's kernel cache to check that the cache works."""
    import concurrent.futures as cf
    import multiprocessing

    import gpuplan  # noqa: F401
    from gpuplan.nvrtc import registry

    mods = registry()
    order = sorted(range(len(mods)), key=lambda i: -mods[i].path.stat().st_size)
    print(f"compiling {len(mods)} modules, "
          f"{sum(len(m.name_expressions) for m in mods)} kernel instances, {jobs} processes "
          f"(CUPY_CACHE_DIR={os.environ.get('CUPY_CACHE_DIR', '~/.cupy/kernel_cache')})",
          flush=True)
    t0 = time.perf_counter()
    failures = []
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = {pool.submit(_compile_module, i): mods[i].path.name for i in order}
        for fut in cf.as_completed(futures):
            try:
                name, n, secs, err = fut.result()
            except Exception as exc:  # noqa: BLE001 - a crashed worker process
                name, n, secs, err = futures[fut], 0, 0.0, f"{type(exc).__name__}: {exc}"
            print(f"  {name}: {n} kernels in {secs:.1f} s" + (f"  FAILED: {err}" if err else ""),
                  flush=True)
            if err:
                failures.append(name)
    parallel = time.perf_counter() - t0
    print("loading every module again in one process (from the cache):", flush=True)
    t1 = time.perf_counter()
    reload_failed = []
    for i in range(len(mods)):
        name, n, secs, err = _compile_module(i)
        print(f"  {name}: {secs:.1f} s" + (f"  FAILED: {err}" if err else ""), flush=True)
        if err and name not in failures:
            reload_failed.append(name)
    reload = time.perf_counter() - t1
    failures += reload_failed
    total = sum(len(m.name_expressions) for m in mods)
    print(f"compile: {len(mods)} modules, {total} kernels, {len(failures)} failed"
          + (f" ({', '.join(failures)})" if failures else "")
          + f"; {parallel:.0f} s with {jobs} processes, {reload:.1f} s to load again from the "
          "cache", flush=True)
    return 1 if failures else 0


def worker(ns: argparse.Namespace) -> int:
    if ns.worker == "probe":
        ok, device = probe_gpu()
        print(json.dumps({"ok": ok, "device": device}), flush=True)
        return 0
    return worker_compile(ns.jobs)


# -- main ------------------------------------------------------------------------------------

def _on_signal(signum: int, _frame: object) -> None:
    proc = _CURRENT
    if proc is not None:
        kill_group(proc, grace=2.0)
    raise Interrupted(signum)


def child_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Steps:\n" + list_steps().split("\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print the steps and exit")
    ap.add_argument("--step", action="append", metavar="NAME",
                    help="run only this step or group (repeatable); default: all steps")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                    help=f"seconds per step; the step's process group is killed after it "
                         f"(default {DEFAULT_TIMEOUT}: a lent-machine command has 600 s)")
    ap.add_argument("--out", type=Path, default=None,
                    help="after each step, copy reports/ here (e.g. \"$OUT\" on a lent machine)")
    ap.add_argument("--report", type=Path, default=REPORT, help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=["probe", "compile"], help=argparse.SUPPRESS)
    ap.add_argument("--jobs", type=int, default=4, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    if ns.worker:
        return worker(ns)
    if ns.list:
        print(list_steps())
        return 0
    try:
        names = resolve_steps(ns.step)
    except ValueError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2

    ctx = Context(env=child_env(), timeout=ns.timeout, report=ns.report, out=ns.out)
    ok, ctx.device = probe_gpu_subprocess(ctx.env)
    if not ok:
        print(f"gpu_check: NO GPU: {ctx.device}.\ngpu_check: nothing was run; run it on a "
              "machine with an NVIDIA GPU, its driver and CuPy.", file=sys.stderr)
        return 2
    ctx.commit = git_commit()
    add_installed_mpich(ctx.env)
    print(f"gpu_check: {ctx.device}\ngpu_check: commit {ctx.commit}; steps: {' '.join(names)}",
          flush=True)

    specs = {s.name: s for s in STEPS}
    results: list[Step] = []
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {sig: signal.signal(sig, _on_signal) for sig in signals}
    try:
        for name in names:
            results.append(run_one(specs[name], ctx))
    except Interrupted as exc:
        print(f"gpu_check: {exc}; results so far are in {ctx.report}", file=sys.stderr)
        return 128 + exc.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("\ngpu_check summary:")
    for s in results:
        print(f"  {s.name:<14} {s.status.upper():<8} {s.seconds:5.0f} s  {s.detail}")
    print(f"appended to {ctx.report}")
    return 1 if any(s.status == "failed" for s in results) else 0


if __name__ == "__main__":
    sys.exit(main())
