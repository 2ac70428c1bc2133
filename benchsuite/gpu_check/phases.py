"""The GPU check's phases, in priority order: what matters most for a first GPU runs first, so
that a run cut short still answers the important questions.

Each phase names its estimate and cap in seconds on a GPU (H200-class, 16 cores) and on the
emulated rehearsal, and the returned file its log goes into (orchestrator.OUT_FILES).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchsuite.gpu_check import mpi
from benchsuite.gpu_check.orchestrator import ROOT, Check, Phase, Result, register

#: The gpu tests that cover what the kernel cases cannot: cuBLAS, graph capture, interop.
CORE_GPU_TESTS = ["tests/gpuplan/ops/test_gemm.py", "tests/gpuplan/test_graphs.py",
                  "tests/autograd/test_tensor_interop.py", "tests/gpuplan/test_plan_api.py"]
#: The emulated rehearsal's stand-ins (the test command runs every gpu test on the emulated
#: device already; the rehearsal checks the orchestration, not the tests again).
REHEARSAL_GPU_TESTS = ["tests/gpuplan/test_plan_api.py"]
REHEARSAL_REST_TESTS = ["tests/gpuplan/ops/test_cast.py"]
REHEARSAL_MPI_TESTS = ["tests/dist/test_mesh.py"]
#: The rehearsal's execute phase runs these families (the test command has executed every
#: instance on the emulated device already); a GPU runs them all.
REHEARSAL_FAMILIES = ["cast", "gemm", "softmax"]
#: About ten key kernel benchmarks (substrings of benchsuite.kernels case names).
KEY_BENCHMARKS = ["gemm_cublas_bf16", "gemm_tiled_bf16", "attention_causal_bf16",
                  "layer_norm_bf16", "cross_entropy_bf16", "adamw_gpt2_multi_tensor",
                  "gelu_fwd_bf16", "softmax_bf16", "embedding_bwd_segment_bf16",
                  "cast_f32_to_bf16"]
PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def pytest_counts(lines: list[str]) -> str:
    """'120 passed, 4 skipped' from pytest's last summary line."""
    for line in reversed(lines):
        found = PYTEST_COUNTS.findall(line)
        if found and " in " in line:
            return ", ".join(f"{n} {w}" for n, w in found)
    return "no pytest summary"


def _device_env(check: Check) -> dict[str, str]:
    return {"GPUPLAN_DEVICE": "emulated"} if check.device == "emulated" else {}


def _tail_line(lines: list[str], prefix: str) -> str:
    return next((line for line in reversed(lines) if line.startswith(prefix)), "")


# -- env --------------------------------------------------------------------------------------

def env_phase(check: Check, result: Result) -> None:
    path = check.work / "env.json"
    probe = [check.python, "-m", "benchsuite.gpu_check.workers", "probe", "--device",
             check.device, "--json", str(path)]
    fin = check.command(result, probe, cap=120, env=_device_env(check))
    info = _read_json(path)
    if info is None:
        check.stop_reason = "the environment probe gave no answer (see env.txt)"
        return
    check.device_desc = str(info.get("device", "?"))
    check.figures["env"] = info
    if not info.get("ok"):
        check.stop_reason = f"no usable device: {check.device_desc}"
        result.fail(check.stop_reason)
        return
    if fin.rc == 0 and str(info.get("mpi4py", "")).startswith("FAILED"):
        if mpi.install_carried_mpich(check, result):
            check.command(result, probe, cap=60, env=_device_env(check))
            info = _read_json(path) or info
            check.figures["env"] = info
    exe = mpi.mpiexec(check.env)
    result.note(check.device_desc)
    result.note(f"mpi4py {info.get('mpi4py')}; mpiexec {exe or 'MISSING'}; torch "
                f"{info.get('torch') or 'absent'}")


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# -- compile (background) ---------------------------------------------------------------------

def compile_phase(check: Check, result: Result) -> None:
    cmd = [check.python, "-m", "benchsuite.gpu_check.workers", "compile", "--device",
           check.device, "--jobs", str(check.jobs)]
    check.background[result.name] = (check.start(result, cmd, result.cap, _device_env(check)),
                                      result, compile_finish)
    result.note("started in the background")


def compile_finish(check: Check, result: Result, fin) -> None:
    line = _tail_line(fin.lines, "compile:")
    result.detail = line.removeprefix("compile:").strip() or result.detail
    m = re.search(r"(\d+) modules, (\d+) kernel instances, (\d+) failed; (\d+) s", line)
    if m:
        check.figures["compile"] = {"modules": int(m[1]), "instances": int(m[2]),
                                    "failed": int(m[3]), "seconds": int(m[4])}


# -- cuda-paths -------------------------------------------------------------------------------

def cuda_paths_phase(check: Check, result: Result) -> None:
    path = check.work / "cuda_paths.json"
    fin = check.command(result, [check.python, "-m", "benchsuite.gpu_check.workers",
                                 "cuda-paths", "--json", str(path)])
    data = _read_json(path) or {}
    check.figures["cuda_paths"] = data
    result.note(_tail_line(fin.lines, "cuda-paths:").removeprefix("cuda-paths:").strip())
    for name, rec in data.items():
        if isinstance(rec, dict) and not rec.get("ok", True):
            result.note(f"{name} FAILED")
    ceilings = {k: v for rec in data.values() if isinstance(rec, dict) for k, v in rec.items()
                if k in ("copy_gbs", "matmul_bf16_tflops", "matmul_f16_tflops")}
    if ceilings:
        result.note(", ".join(f"{k} {v}" for k, v in ceilings.items()))


# -- execute ----------------------------------------------------------------------------------

def families() -> list[str]:
    ops = ROOT / "gpuplan" / "ops"
    return sorted(p.name for p in ops.iterdir() if (p / "cases.py").is_file())


EXECUTED = re.compile(r"executed (\d+) of (\d+) kernel instances, (\d+) failures")


def execute_phase(check: Check, result: Result) -> None:
    """Every kernel instance against its float64 reference, one process per family (an
    illegal address in one cannot poison the others' CUDA context), a few at a time."""
    import time

    from benchsuite.gpu_check import procs

    pending = families() if check.device == "cuda" else [
        f for f in families() if f in REHEARSAL_FAMILIES]
    width = max(1, min(4 if check.device == "cuda" else check.jobs, len(pending)))
    running: dict[str, procs.Command] = {}
    done = executed = declared = failures = 0
    bad: list[str] = []
    while pending or running:
        while pending and len(running) < width:
            fam = pending.pop(0)
            cmd = [check.python, "-m", "benchsuite.kernel_check", "--execute", "--quiet",
                   "--device", check.device, "--family", fam]
            running[fam] = check.start(result, cmd, check.phase_left(), _device_env(check))
        finished = [f for f, c in running.items() if c.done()]
        if not finished and check.phase_left() <= 0:
            finished = list(running)
        for fam in finished:
            fin = running.pop(fam).wait(max(0.5, check.phase_left()))
            done += 1
            m = EXECUTED.search(_tail_line(fin.lines, "executed "))
            if m:
                executed, declared, failures = (executed + int(m[1]), declared + int(m[2]),
                                                failures + int(m[3]))
            if fin.rc != 0:
                bad.append(fam + (" (cut at the cap)" if fin.timed_out else ""))
                if not result.tail:
                    result.tail = fin.lines[-30:]
        if not finished:
            time.sleep(0.2)
    check.figures["execute"] = {"executed": executed, "declared": declared,
                                "failures": failures, "families": done, "failed": bad}
    result.note(f"executed {executed} of {declared} kernel instances, {failures} failures, "
                f"{done} families" + ("" if check.device == "cuda" else
                                      f" (rehearsal: {', '.join(REHEARSAL_FAMILIES)})"))
    if bad or executed != declared:
        result.fail(f"families failing: {', '.join(bad) or '-'}")


# -- tests ------------------------------------------------------------------------------------

def _pytest(check: Check, marker: str, paths: list[str], extra: list[str]) -> list[str]:
    workers = "4" if check.device == "cuda" else str(check.jobs)
    return [check.python, "-m", "pytest", "-q", "-m", marker, "-n", workers, "--timeout",
            "120", "--maxfail", "20", "-p", "no:cacheprovider", *extra, *paths]


def gpu_tests_phase(check: Check, result: Result) -> None:
    paths = CORE_GPU_TESTS if check.device == "cuda" else REHEARSAL_GPU_TESTS
    fin = check.command(result, _pytest(check, "gpu and not mpi", paths, []),
                        env=_device_env(check))
    counts = pytest_counts(fin.lines)
    result.note(counts + ("" if check.device == "cuda" else f" (rehearsal: {' '.join(paths)})"))
    check.figures.setdefault("tests", {})[result.name] = counts
    if fin.rc == 0 and not re.search(r"\b[1-9]\d* passed", counts):
        result.fail("no test passed (did they all skip?)")


def rest_phase(check: Check, result: Result) -> None:
    """The remaining gpu tests, then the mpi tests under mpiexec -n 2 on the device."""
    if check.device == "cuda":
        rest = _pytest(check, "gpu and not mpi", ["tests"],
                       [f"--ignore={p}" for p in CORE_GPU_TESTS])
        mpi_paths: list[str] = []
    else:
        rest = _pytest(check, "gpu and not mpi", REHEARSAL_REST_TESTS, [])
        mpi_paths = REHEARSAL_MPI_TESTS
    fin = check.command(result, rest, env=_device_env(check))
    notes = [f"gpu tests: {pytest_counts(fin.lines)}"]
    launch = mpi.launcher(check.env, 2)
    if launch is None:
        notes.append(f"mpi tests not run: {mpi.NO_MPIEXEC}")
    elif check.phase_left() > 20:
        fin = check.command(result, launch + [check.python, "-m", "mpi4py",
                                              "scripts/mpi_pytest.py", "-q", "-m", "mpi",
                                              "-p", "no:cacheprovider", *mpi_paths],
                            env=_device_env(check))
        notes.append(f"mpi tests (2 ranks): {pytest_counts(fin.lines)}")
    else:
        notes.append("mpi tests: no time left")
    check.figures.setdefault("tests", {})[result.name] = notes
    result.note("; ".join(notes))


# -- training ---------------------------------------------------------------------------------

def train_phase(check: Check, result: Result) -> None:
    """The main job under mpiexec -n 2 on the device, f32 then bf16."""
    launch = mpi.launcher(check.env, 2)
    if launch is None:
        result.status, result.detail = "SKIPPED", mpi.NO_MPIEXEC
        return
    if check.device == "cuda":
        size = ["--steps", "40", "--eval-interval", "20", "--sample-tokens", "64"]
    else:  # seconds on the emulated device: a tiny model, a small corpus, no sample
        corpus = check.work / "rehearsal_corpus.txt"
        corpus.write_text((ROOT / "README.md").read_text(errors="replace")[:20000])
        size = ["--steps", "2", "--eval-interval", "2", "--eval-batches", "1", "--n-layer", "1",
                "--n-embd", "32", "--block-size", "16", "--batch-size", "4", "--data",
                str(corpus), "--sample-tokens", "0"]
    figures = {}
    for dtype in ("f32", "bf16"):
        out = check.work / f"train_{dtype}"
        fin = check.command(result, launch + [
            check.python, "-m", "mpi4py", "scripts/train.py", "--device", check.device,
            "--dtype", dtype, "--progress", "plain", "--out", str(out), *size])
        figures[dtype] = _train_summary(out) if fin.rc == 0 else "FAILED"
        result.note(f"{dtype}: {figures[dtype]}")
    check.figures["train"] = figures


def _train_summary(out: Path) -> str:
    try:
        hist = json.loads((out / "metrics.json").read_text())["history"]
        first, last = hist[0], hist[-1]
        return (f"val loss {first['val_loss']:.3f} -> {last['val_loss']:.3f} in "
                f"{last['step']} steps, {last['tokens_per_s']:,.0f} tok/s")
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return "finished (no metrics.json history)"


def graphs_phase(check: Check, result: Result) -> None:
    steps = ["--steps", "20"] if check.device == "cuda" else ["--steps", "3"]
    fin = check.command(result, [check.python, "scripts/check_graphs.py", "--device",
                                 check.device, *steps])
    line = _tail_line(fin.lines, "graphs: ")
    result.note(line.removeprefix("graphs: "))
    check.figures["graphs"] = line


def bench_train_phase(check: Check, result: Result) -> None:
    """GPT-2 small bf16 training step, ours eager and captured vs PyTorch eager."""
    path = check.work / "bench_train.json"
    if check.device == "cuda":
        args = ["--model", "gpt2", "--device", "cuda", "--dtype", "bf16", "--cuda-graph"]
    else:
        args = ["--model", "tiny", "--device", "emulated", "--steps", "2", "--warmup", "1",
                "--no-torch"]
    check.command(result, [check.python, "scripts/bench_train.py", *args, "--json", str(path)])
    data = _read_json(path)
    if data is None:
        result.note("no results")
        return
    check.figures["bench_train"] = data
    ours = data.get("ours", {})
    text = f"ours {ours.get('step_ms', float('nan')):.1f} ms/step"
    if ours.get("mfu") is not None:
        text += f", MFU {100 * ours['mfu']:.1f}%"
    text += "".join(f", {pair} {r:.2f}x" for pair, r in data.get("ratios", {}).items())
    result.note(text)


def bench_kernels_phase(check: Check, result: Result) -> None:
    path = check.work / "bench_kernels.json"
    args = ["--json", str(path)] + [a for k in KEY_BENCHMARKS for a in ("--filter", k)]
    if check.device == "emulated":
        args += ["--smoke", "--device", "emulated"]
    check.command(result, [check.python, "scripts/bench_kernels.py", *args])
    data = _read_json(path) or {}
    cases = data.get("cases", [])
    check.figures["bench_kernels"] = data
    errors = sum("error" in c for c in cases)
    copy = data.get("copy_gbs")
    result.note(f"{len(cases)} cases, {errors} errors"
                + (f"; device copy {copy:.0f} GB/s" if isinstance(copy, (int, float)) else ""))
    if errors:
        result.fail(f"{errors} benchmark cases raised")


PHASES = [
    Phase("env", "the machine: device, driver, CuPy, NumPy, torch, mpi4py and its MPI (a "
          "carried mpich wheel only if mpi4py fails)", env_phase, 20, 120, "env.txt",
          (10, 120)),
    Phase("compile", "every kernel module built for the device on all cores, in the "
          "background of the next phase", compile_phase, 5, 420, "compile.txt", (5, 300),
          background=True),
    Phase("cuda-paths", "what the emulator cannot run: cuBLAS in every dtype and transpose vs "
          "float64, pinned staging, graph capture with a private pool, events and streams, a "
          "one-rank NCCL call, copy and matmul ceilings", cuda_paths_phase, 60, 150, "env.txt",
          None),
    Phase("execute", "every kernel instance vs its float64 reference, one process per family, "
          "cuBLAS cases included", execute_phase, 90, 240, "execute.txt", (30, 240),
          after="compile"),
    Phase("gpu-tests", "pytest -m gpu: cuBLAS, graphs, interop, plan API (xdist, 120 s per "
          "test, maxfail 20)", gpu_tests_phase, 60, 150, "tests.txt", (15, 120)),
    Phase("train", "the main job under mpiexec -n 2 on the device, f32 then bf16",
          train_phase, 60, 150, "train.txt", (30, 150)),
    Phase("graphs", "a captured training step equals eager bit for bit; eager vs replay time",
          graphs_phase, 40, 120, "train.txt", (15, 120)),
    Phase("bench-train", "GPT-2 small bf16 step: ours eager and captured vs PyTorch eager",
          bench_train_phase, 90, 180, "train.txt", (20, 120)),
    Phase("bench-kernels", "about ten key kernel benchmarks, inputs drawn on the device",
          bench_kernels_phase, 60, 150, "bench.json", (20, 120)),
    Phase("rest", "the remaining gpu tests, then the mpi tests under mpiexec -n 2, until the "
          "deadline", rest_phase, 30, 10_000, "tests.txt", (15, 150)),
]
register(PHASES)
