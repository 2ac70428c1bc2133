"""scripts/check_graphs.py, bench_comm.py, bench_pipeline.py and bench_autograd.py at tiny
sizes on what a machine without a GPU has (the host, the emulated device, mpiexec -n 2): each
exits 0 and prints what its docstring promises, every number finite and consistent with the
others it is derived from, in the lines the GPU check's `graphs` phase reads.
A lent GPU's first run of these scripts should not be the first run of their code paths."""

from __future__ import annotations

import importlib.util
import itertools
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gpuplan as gp
from benchsuite import graph_check as check_graphs
from benchsuite import op_overhead as bench_autograd
from benchsuite.gpu_check import phases as gpu_check_phases
from tests.scripts.test_train import _mpiexec

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS", "MPI_LOCALRANKID", "PMIX_RANK",
                 "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                 "SLURM_STEP_NUM_TASKS", "SLURM_PROCID")
#: Each test names its device: the caller's GPUPLAN_DEVICE / GPUPLAN_DISABLE_CUDA are dropped.
ENV = {**{k: v for k, v in os.environ.items()
          if k not in LAUNCHER_VARS + ("GPUPLAN_DEVICE", "GPUPLAN_DISABLE_CUDA")},
       "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
EMULATED = {"GPUPLAN_DEVICE": "emulated"}  # "cuda" (and --device auto) mean the emulated device



def _run(args: list[str], env: dict | None = None, ranks: int = 0,
         timeout: int = 120) -> subprocess.CompletedProcess:
    """`python ARGS` (under `mpiexec -n RANKS python -m mpi4py` as gpu_check runs it)."""
    launch = [_mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py"] if ranks else [
        sys.executable]
    return subprocess.run(launch + args, capture_output=True, text=True, timeout=timeout,
                          env={**ENV, **(env or {})}, cwd=ROOT)


def _positive(text: str) -> float:
    value = float(text.replace(",", ""))
    assert math.isfinite(value) and value > 0, text
    return value


def _interval(text: str) -> tuple[float, float]:
    """The values that print as `text`: half a unit of its last digit either side."""
    text = text.replace(",", "")
    half = 0.5 * 10.0 ** -(len(text.split(".")[1]) if "." in text else 0)
    return float(text) - half, float(text) + half


def _shows(text: str, fn, *inputs: str) -> bool:
    """Whether `text` is what fn(*inputs) prints as, given that each input was itself printed
    rounded (fn is monotonic in each input, so its extremes are at the intervals' corners)."""
    values = [fn(*c) for c in itertools.product(*map(_interval, inputs))]
    lo, hi = _interval(text)
    return min(values) <= hi + 1e-9 and max(values) >= lo - 1e-9


def _through_gpu_check(monkeypatch, tmp_path, phase_fn, lines: list[str]):
    """What the GPU check's phase makes of `lines` as its command's output: the parsing that
    fills the summary, without running its full-size command."""
    from benchsuite.gpu_check import orchestrator, procs

    commands = []

    def command(self, result, cmd, cap=None, env=None, name=None):
        commands.append(cmd)
        return procs.Finished(0, lines, 0.1, False)

    monkeypatch.setattr(orchestrator.Check, "command", command)
    check = orchestrator.Check("cuda", 60.0, tmp_path / "out", tmp_path / "work", {},
                               sys.executable, "abc", 1)
    result = orchestrator.Result(phase_fn.__name__)
    phase_fn(check, result)
    return result, commands


# -- check_graphs.py -------------------------------------------------------------------------

GRAPHS = re.compile(r"graphs: mlp captured vs eager over 5 steps: bitwise equal; gpt \(small\): "
                    r"eager (\S+) ms/step, replayed (\S+) ms/step, (\S+)x, "
                    r"max relative loss difference (\S+)$")


def test_check_graphs_as_gpu_check_runs_it_on_the_emulated_device(monkeypatch, tmp_path):
    res = _run(["scripts/check_graphs.py", "--device", "cuda", "--steps", "3"], EMULATED)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    summaries = [line for line in lines if line.startswith("graphs: ")]
    assert len(summaries) == 1, res.stdout
    match = GRAPHS.match(summaries[0])
    assert match, summaries[0]
    eager, replayed, ratio, rel = match.groups()
    _positive(eager), _positive(replayed), _positive(ratio)
    assert _shows(ratio, lambda e, r: e / r, eager, replayed)
    assert float(rel) < 1e-4
    result, commands = _through_gpu_check(monkeypatch, tmp_path, gpu_check_phases.graphs_phase,
                                          lines)
    assert commands[0][1:4] == ["scripts/check_graphs.py", "--device", "cuda"]
    assert result.detail == summaries[0].removeprefix("graphs: ")


def test_check_graphs_exits_2_without_a_device_and_refuses_too_few_steps(monkeypatch, capsys):
    monkeypatch.delenv("GPUPLAN_DEVICE", raising=False)
    monkeypatch.setenv("GPUPLAN_DISABLE_CUDA", "1")
    assert check_graphs.main(["--device", "cuda"]) == 2
    assert capsys.readouterr().err == "check_graphs: no usable CUDA device\n"
    with pytest.raises(SystemExit) as exc:  # 2 steps left the replayed side no timed step
        check_graphs.main(["--device", "emulated", "--steps", "2"])
    assert exc.value.code == 2
    assert "--steps: expected at least 3, given 2" in capsys.readouterr().err


def test_check_equal_finds_a_replay_that_differs_from_eager(monkeypatch):
    """check_equal on the host with capture_step replaced by eager steps: equal when the
    "replay" is the same step, a difference named when it sees other batches."""
    def capture_step_shifting_by(shift: float):
        def capture_step(step, x0, y0, warmup):
            step(x0, y0)  # as the real capture: one eager warm-up step on the first batch
            return lambda x, y: step(x + np.float32(shift), y)
        return capture_step

    monkeypatch.setattr(gp.graphs, "capture_step", capture_step_shifting_by(0.0))
    assert check_graphs.check_equal("cpu", 5) is None
    monkeypatch.setattr(gp.graphs, "capture_step", capture_step_shifting_by(1e-3))
    assert check_graphs.check_equal("cpu", 5).startswith("losses/norms differ: eager [(")


@pytest.mark.parametrize("diff, rel, shown", [
    ("weights differ (parameters [3])", 0.0, "MISMATCH: weights differ (parameters [3]);"),
    (None, 2e-4, "max relative loss difference 2.0e-04"),
])
def test_check_graphs_exits_1_on_a_mismatch(monkeypatch, capsys, diff, rel, shown):
    monkeypatch.setattr(check_graphs, "check_equal", lambda device, steps: diff)
    monkeypatch.setattr(check_graphs, "time_gpt", lambda device, steps, size: (0.2, 0.1, rel))
    assert check_graphs.main(["--device", "emulated"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("graphs: ") and shown in out and "2.00x" in out


# -- bench_comm.py ---------------------------------------------------------------------------

def test_bench_comm_host_and_device_rows(monkeypatch):
    res = _run(["scripts/bench_comm.py", "--iters", "3", "--max-mib", "1", "--device", "auto"],
               EMULATED, ranks=2)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert re.fullmatch(r"# ranks=2 backend=\S+ iters=3", lines[0]), lines[0]
    assert lines[1].split() == ["op", "device", "bytes", "ours", "GB/s", "mpi4py", "GB/s"]
    rows = [line.split() for line in lines[2:]]
    sizes = [str(4 ** k * 1024) for k in range(6)]  # 1 KiB .. 1 MiB, every other power of 2
    assert [r[:3] for r in rows] == [[op, dev, size] for dev in ("cpu", "emulated")
                                     for op in ("all_reduce", "send_recv") for size in sizes]
    for _, dev, _, ours, raw in rows:
        _positive(ours)
        if dev == "cpu":
            _positive(raw)  # raw mpi4py on host buffers, for comparison
        else:
            assert raw == "-"


def test_bench_comm_wants_two_ranks():
    res = _run(["scripts/bench_comm.py", "--device", "cpu"])
    assert res.returncode == 2
    assert "bench_comm: run under mpiexec with at least 2 ranks" in res.stderr


def test_bench_comm_device_cuda_without_a_device_is_one_error():
    res = _run(["scripts/bench_comm.py", "--device", "cuda", "--iters", "3", "--max-mib", "1"],
               {"GPUPLAN_DISABLE_CUDA": "1"}, ranks=2)
    assert res.returncode == 2
    assert res.stderr.count("bench_comm: --device cuda: gpuplan finds no usable CUDA") == 1
    assert "all_reduce" not in res.stdout


# -- bench_pipeline.py -----------------------------------------------------------------------

@pytest.mark.parametrize("device, env", [("cpu", {}), ("auto", EMULATED)])
def test_bench_pipeline_rows_are_consistent(device, env):
    res = _run(["scripts/bench_pipeline.py", "--m", "1,3", "--layers", "1", "--width", "32",
                "--rows", "8", "--steps", "2", "--warmup", "1", "--device", device],
               env, ranks=2)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    shown = "emulated" if device == "auto" else "cpu"  # auto: the emulated device here
    assert re.fullmatch(rf"# ranks=2 backend=\S+ device={shown} \| stage = 1 x Linear\(32, 32\)"
                        r", 8 rows per micro-batch \(\d+ MFLOP per GEMM\) \| median of 2 steps",
                        lines[0]), lines[0]
    assert lines[1].split() == ["schedule", "m", "t_f+t_b", "ms", "T(m)", "ms", "ideal", "ms",
                                "bubble", "model", "T/model", "T"]
    rows = [line.split() for line in lines[2:]]
    assert [r[:2] for r in rows] == [["gpipe", "1"], ["gpipe", "3"], ["1f1b", "1"], ["1f1b", "3"]]
    for _, m, per_mb, step, ideal, bubble, model, ratio in rows:
        m = int(m)
        _positive(per_mb), _positive(step), _positive(ideal), _positive(ratio)
        assert float(bubble) < 1 and math.isfinite(float(bubble))
        assert model == f"{1 / (m + 1):.3f}"  # (p - 1) / (m + p - 1), p = 2
        assert _shows(ideal, lambda t, m=m: m * t, per_mb)
        assert _shows(bubble, lambda i, t: 1 - i / t, ideal, step)
        assert _shows(ratio, lambda t, mb, m=m: t / ((m + 1) * mb), step, per_mb)


def test_bench_pipeline_device_cuda_without_a_device_is_one_error():
    res = _run(["scripts/bench_pipeline.py", "--device", "cuda", "--steps", "2"],
               {"GPUPLAN_DISABLE_CUDA": "1"}, ranks=2)
    assert res.returncode == 2
    assert res.stderr.count("bench_pipeline: --device cuda: gpuplan finds no usable CUDA") == 1
    assert "gpipe" not in res.stdout


# -- bench_autograd.py -----------------------------------------------------------------------

OPS = ["add", "mul", "matmul", "linear", "gelu", "softmax", "layer_norm", "sum",
       "reshape+transpose", "embedding", "cross_entropy"]


def test_bench_autograd_on_the_host_times_ops_and_the_gpt_step_against_torch():
    res = _run(["scripts/bench_autograd.py", "--device", "cpu", "--repeat", "3"])
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [line.strip() for line in res.stdout.splitlines() if line.strip()]
    assert lines[0] == "per-op latency, 8x8 float32 on cpu (median of 3)"
    assert lines[1].split() == ["op", "forward", "us", "fwd+bwd", "us"]
    table = [line.split() for line in lines[2:2 + len(OPS)]]
    assert [r[0] for r in table] == OPS
    for _, fwd, both in table:
        _positive(fwd), _positive(both)
    kwargs, batch, seq = bench_autograd.GPT_SHAPES["small"]
    head, timing = lines[2 + len(OPS):4 + len(OPS)]
    assert re.fullmatch(rf"GPT 'small' training step on cpu, f32: [\d.]+M params, batch "
                        rf"{batch}x{seq}", head), head
    match = re.fullmatch(r"(\S+) ms/step, (\S+) tokens/s, (\S+) TFLOP/s \(model flops\)", timing)
    assert match, timing
    ms, tokens_per_s, tflops = match.groups()
    _positive(ms)
    assert _shows(tokens_per_s, lambda t: batch * seq / (t / 1e3), ms)
    assert float(tflops) >= 0 and math.isfinite(float(tflops))  # 0.00 on a slow host
    rest = lines[4 + len(OPS):]
    if importlib.util.find_spec("torch") is None:
        assert rest == ["(torch not installed: no PyTorch comparison)"]
        return
    match = re.fullmatch(r"loss ours (\S+) vs torch (\S+) \(same weights and batch\)", rest[0])
    assert match, rest[0]
    ours, theirs = map(_positive, match.groups())
    assert abs(ours - theirs) <= 1e-4 * ours  # same model, weights and batch
    assert re.fullmatch(r"PyTorch \S+ eager CPU: [\d.]+ ms/step", rest[1]), rest[1]
    _positive(rest[1].split()[-2])
    assert len(rest) == 2


STUB_ROW = re.compile(r"(plan call|autograd fwd) (\S+) +(\S+) +(\d+) +(\S+)")


def test_bench_autograd_stub_math_on_the_emulated_device_counts_plans_per_call():
    res = _run(["scripts/bench_autograd.py", "--device", "emulated", "--stub-math",
                "--repeat", "20"])
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [line.strip() for line in res.stdout.splitlines() if line.strip()]
    assert lines[0] == "Python overhead on emulated, kernels stubbed (median of 20, 8x8 f32)"
    rows = [STUB_ROW.fullmatch(line) for line in lines[2:13]]
    assert all(rows), lines[2:13]
    assert [(r[1], r[2]) for r in rows] == (
        [("plan call", n) for n in ["gelu", "add", "matmul", "layer_norm", "softmax",
                                    "embedding"]]
        + [("autograd fwd", n) for n in ["gelu", "add", "linear", "layer_norm", "softmax"]])
    for group, _, us, plans, per_plan in (r.groups() for r in rows):
        _positive(us)
        assert int(plans) >= 1  # the stub counted the call's plans
        if group == "plan call":
            assert int(plans) == 1
        assert _shows(per_plan, lambda t, n=int(plans): t / n, us)
    gpt = re.fullmatch(r"GPT small step +(\S+) +(\d+) +(\S+)", lines[13])
    assert gpt, lines[13]
    _positive(gpt[1]), _positive(gpt[2])
    assert _shows(gpt[3], lambda t, n=int(gpt[2]): t / n, gpt[1])
    cached = re.fullmatch(r"plans cached after the steps: (\d+)", lines[14])
    assert cached and int(cached[1]) > 0, lines[14]
    if importlib.util.find_spec("torch") is None:
        assert lines[15:] == ["(torch not installed: no PyTorch per-op figure)"]
        return
    assert lines[15].startswith("PyTorch ") and "eager, CPU" in lines[15]
    torch_rows = [line.split() for line in lines[16:]]
    assert [r[:3] for r in torch_rows] == [["torch", "fwd", n] for n in
                                           ["gelu", "add", "linear", "layer_norm", "softmax"]]
    for row in torch_rows:
        _positive(row[3])


def test_math_stub_counts_plan_calls_and_puts_the_kernels_back():
    x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8)
    want = gp.to_host(gp.functional.unary("gelu", x))
    with bench_autograd.MathStub() as stub:
        gp.functional.unary("gelu", x)
        gp.functional.matmul(x, x)
        assert stub.calls == 2
    assert np.array_equal(gp.to_host(gp.functional.unary("gelu", x)), want)
    assert np.allclose(gp.to_host(gp.functional.matmul(x, x)), x @ x, rtol=1e-5, atol=1e-5)
