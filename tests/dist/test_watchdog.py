"""The watchdog and the exit hook: no rank can leave a job hanging.

In-process tests check the deadline logic, the message and the bounded barrier; the job
tests launch `mpiexec -n 2` and `-n 4` (with a 3 s timeout) where one rank stops itself
(SIGSTOP), exits early with 0 or 1, or raises before a collective or a pipeline
receive, and require the whole job to end within timeout + 10 s, non-zero, with one line.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import dist
from dist import watchdog
from dist.watchdog import Watchdog, barrier_with_deadline, resolve_timeout, watched

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 3


class _Comm:
    """Stands for a Communicator in messages: a label and the world rank of each rank."""

    def __init__(self, label: str, world_ranks: tuple[int, ...]) -> None:
        self.label, self.world_ranks = label, world_ranks


# ---- in-process: timeout, deadline, message -------------------------------------------


def test_timeout_from_argument_environment_or_default(monkeypatch):
    monkeypatch.delenv(watchdog.ENV_TIMEOUT, raising=False)
    assert resolve_timeout() == watchdog.DEFAULT_TIMEOUT == 600
    monkeypatch.setenv(watchdog.ENV_TIMEOUT, " 2.5 ")
    assert resolve_timeout() == 2.5
    assert resolve_timeout(7) == 7.0  # the argument (train.py --timeout) wins
    monkeypatch.setenv(watchdog.ENV_TIMEOUT, "0")
    assert resolve_timeout() == 0.0  # no limit
    for bad in ("ten", "-1", "nan"):
        monkeypatch.setenv(watchdog.ENV_TIMEOUT, bad)
        with pytest.raises(ValueError, match=f"GPUPLAN_COLLECTIVE_TIMEOUT.*given '{bad}'"):
            resolve_timeout()
    with pytest.raises(ValueError, match=r"timeout: expected seconds.*given -2"):
        resolve_timeout(-2)


def test_a_call_past_the_deadline_aborts_and_a_finished_one_is_forgotten():
    aborted = []
    dog = Watchdog(5, rank=1, size=2, abort=aborted.append)
    world = _Comm("world (2 ranks)", (0, 1))
    assert watched("barrier", world, None, lambda: dog.check(time.monotonic() + 4)) is False
    assert watched("barrier", world, None, lambda: dog.check(time.monotonic() + 6)) is True
    assert aborted == [1]
    with pytest.raises(KeyError):
        watched("barrier", world, None, {}.__getitem__, "missing")
    assert watchdog.armed_calls() == []
    assert dog.check(time.monotonic() + 100) is False  # nothing in progress


def test_nested_calls_restore_the_outer_one():
    def inner():
        return watched("recv", "world", 0, watchdog.armed_calls)

    outer = watched("all_reduce", "world", None, lambda: (watchdog.armed_calls(), inner(),
                                                          watchdog.armed_calls()))
    assert [c[1] for c in outer[0]] == ["all_reduce"]
    assert [c[1] for c in outer[1]] == ["recv"]
    assert [c[1] for c in outer[2]] == ["all_reduce"]


def test_message_names_rank_op_peer_communicator_and_seconds():
    dog = Watchdog(3, rank=2, size=4)
    sub = _Comm("communicator of world ranks [1, 3]", (1, 3))
    assert dog.describe("recv", sub, 1, 3.14, "pipeline/runner.py:63") == (
        "[rank 2/4] watchdog: recv from rank 1 (world rank 3) on communicator of world ranks "
        "[1, 3] waited 3.14 s, over the 3 s timeout ($GPUPLAN_COLLECTIVE_TIMEOUT or train.py "
        "--timeout); aborting the MPI job (at pipeline/runner.py:63)")
    assert "isend to rank 0 (world rank 1) on" in dog.describe("isend", sub, 0, 4)
    assert "bcast_object (root rank 0) on world (4 ranks) waited" in dog.describe(
        "bcast_object", "world", 0, 4)


def test_the_thread_catches_a_blocked_call_within_the_poll_interval(capfd):
    released = threading.Event()
    dog = Watchdog(0.2, rank=0, size=2, abort=lambda code: released.set(), poll=0.02).start()
    try:
        start = time.monotonic()
        watched("all_reduce", _Comm("world (2 ranks)", (0, 1)), None, released.wait, 10)
        waited = time.monotonic() - start
    finally:
        dog.stop()
    assert released.is_set() and 0.2 <= waited < 2
    line = capfd.readouterr().err.strip()
    assert re.fullmatch(r"\[rank 0/2\] watchdog: all_reduce on world \(2 ranks\) waited "
                        r"0\.\d\d s, over the 0\.2 s timeout \(.*\); aborting the MPI job "
                        r"\(at dist/test_watchdog\.py:\d+\)", line), line


def test_no_thread_when_the_timeout_is_zero():
    assert not Watchdog(0).start().running


def test_barrier_with_deadline():
    class Request:
        def __init__(self, ready_after: int) -> None:
            self.tests = 0
            self.ready_after = ready_after

        def Test(self) -> bool:  # noqa: N802 - mpi4py's name
            self.tests += 1
            return self.tests > self.ready_after

    class Comm:
        def __init__(self, request: Request) -> None:
            self.request = request

        def Ibarrier(self) -> Request:  # noqa: N802 - mpi4py's name
            return self.request

    assert barrier_with_deadline(Comm(Request(3)), 5.0)
    start = time.monotonic()
    assert not barrier_with_deadline(Comm(Request(10**9)), 0.1)
    assert 0.1 <= time.monotonic() - start < 1


def test_communicator_labels(world):
    assert world.world_ranks == tuple(range(world.size))
    assert world.label == f"world ({world.size} rank{'s' if world.size > 1 else ''})"
    with pytest.raises(ValueError, match="timeout"):
        dist.init(timeout=-1)


@pytest.mark.mpi
def test_under_mpiexec_the_watchdog_runs_and_sub_communicators_name_their_ranks(world):
    from dist import runtime

    assert runtime._WATCHDOG.running and runtime.collective_timeout() > 0
    sub = world.split(color=world.rank % 2)
    members = tuple(r for r in range(world.size) if r % 2 == world.rank % 2)
    assert sub.world_ranks == members
    assert sub.label == f"communicator of world ranks [{', '.join(map(str, members))}]"
    sub.all_reduce(np.ones(2))
    assert watchdog.armed_calls() == []


# ---- whole jobs under mpiexec ------------------------------------------------------------

JOB = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    import dist
    from autograd import nn

    scenario, mode = sys.argv[1], sys.argv[2]
    world = dist.init()
    print(f"ready at {time.time()}", flush=True)
    if world.rank == 0:  # the failing rank; the pipeline's first stage
        if scenario == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif scenario.startswith("exit"):
            sys.exit(int(scenario[4:]))
        elif scenario == "raise":
            raise RuntimeError("boom on purpose")
    if mode == "pipeline":  # stage r receives its input from stage r - 1
        stages = [lambda i=i: nn.Linear(4, 4, seed=i) for i in range(world.size)]
        pipe = dist.PipelineParallel(stages, num_micro_batches=2, comm=world)
        pipe.forward(np.ones((2, 4), np.float32))
    else:
        world.all_reduce(np.ones(3))
    world.barrier()
    print(f"rank {world.rank} done", flush=True)
""")


def _mpiexec() -> Path:
    path = Path(sys.executable).with_name("mpiexec")
    if not path.exists():
        pytest.skip("no mpiexec next to this Python")
    return path


def _clean_env() -> dict[str, str]:
    """This environment minus MPI launcher variables, with the repo importable."""
    prefixes = ("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_", "I_MPI_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update({watchdog.ENV_TIMEOUT: str(TIMEOUT), "OMP_NUM_THREADS": "1"})
    return env


def _run_job(tmp_path: Path, n: int, scenario: str, mode: str, runner: tuple[str, ...] = ()):
    """(exit status, stdout, stderr, seconds from the first rank's `ready` to the job's end:
    start-up on a loaded machine is not what is measured)."""
    script = tmp_path / "job.py"
    script.write_text(JOB)
    cmd = [str(_mpiexec()), "-n", str(n), sys.executable, *runner, str(script), scenario, mode]
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_clean_env(), cwd=tmp_path, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT + 60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the stopped rank included
        out, err = proc.communicate()
        pytest.fail(f"the job hung: {' '.join(cmd)}\n{err}")
    end = time.time()
    ready = [float(t) for t in re.findall(r"ready at (\d+\.\d+)", out)]
    return proc.returncode, out, err, end - min(ready, default=start)


WAITED = r"watchdog: (.+) waited \d+\.\d\d s, over the 3 s timeout"


@pytest.mark.parametrize("n,scenario,mode", [
    (2, "stop", "pipeline"), (4, "stop", "all_reduce"),
    (2, "exit0", "all_reduce"), (4, "exit0", "pipeline"),
    (2, "exit1", "pipeline"), (4, "exit1", "all_reduce"),
    (2, "raise", "all_reduce"), (4, "raise", "pipeline"),
])
def test_a_failing_rank_ends_the_whole_job(tmp_path, n, scenario, mode):
    code, out, err, elapsed = _run_job(tmp_path, n, scenario, mode)
    assert code != 0, err
    assert "done" not in out
    assert elapsed < TIMEOUT + 10, f"took {elapsed:.1f} s"
    if scenario == "raise":
        assert f"[rank 0/{n}] uncaught RuntimeError; aborting the MPI job" in err
        return
    # Strict: the line is out of the rank (read by mpiexec's proxy) before its MPI_Abort.
    ops = re.findall(rf"^\[rank \d/{n}\] {WAITED}", err, flags=re.M)
    assert ops, err
    if scenario == "stop":  # only the ranks still running can report
        expected = ("recv_array from rank \\d" if mode == "pipeline"
                    else f"all_reduce on world \\({n} ranks\\)")
        assert all(re.match(expected, op) for op in ops), ops


def test_a_non_zero_exit_under_the_mpi4py_runner_aborts_at_once(tmp_path):
    code, out, err, elapsed = _run_job(tmp_path, 2, "exit1", "all_reduce", ("-m", "mpi4py"))
    assert code != 0 and "done" not in out
    assert "watchdog" not in err  # the program's own status: no extra line, no waiting
    assert elapsed < TIMEOUT + 10


@pytest.mark.parametrize("n,mode", [(2, "pipeline"), (4, "all_reduce")])
def test_a_job_that_finishes_exits_zero_without_waiting(tmp_path, n, mode):
    code, out, err, elapsed = _run_job(tmp_path, n, "ok", mode)
    assert code == 0, err
    assert sorted(re.findall(r"rank (\d) done", out)) == [str(r) for r in range(n)]
    assert "watchdog" not in err
