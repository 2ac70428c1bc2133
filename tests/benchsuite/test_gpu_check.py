"""scripts/gpu_check.py without a GPU: the phase list, its arguments, the deadline (a planted
hang is cut at its phase's cap and the run goes on; a phase whose estimate no longer fits is
skipped and says so), the at-most-8 flat files rewritten after every phase, an interrupted run,
and (marker `rehearsal`, its own stage of the test command) the whole orchestration on the
emulated device within its budget."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import benchsuite.gpu_check as gc
from benchsuite.gpu_check import orchestrator as orch
from benchsuite.gpu_check import phases as ph

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _check(tmp_path, budget: float = 60.0, device: str = "emulated") -> orch.Check:
    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    return orch.Check(device, budget, tmp_path / "out", work, gc.child_env(device),
                      sys.executable, "abc123", 2)


def _say(text: str):
    def body(check: orch.Check, result: orch.Result) -> None:
        check.command(result, [sys.executable, "-c", f"print({text!r})"])
        result.note(text)
    return body


@pytest.fixture
def restore_phases():
    saved = list(orch.PHASES)
    yield
    orch.register(saved)


def _files(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir())


def test_list_names_every_phase_in_priority_order(capsys):
    assert gc.main(["--list"]) == 0
    out = capsys.readouterr().out
    names = [p.name for p in gc.PHASES]
    assert names[:4] == ["env", "compile", "cuda-paths", "execute"]
    assert names[-1] == "rest"
    for p in gc.PHASES:
        line = next(line for line in out.splitlines() if line.split()[:1] == [p.name])
        assert p.file in line and p.what in line
        assert ("GPU only" in line) == (p.emulated is None)
    assert {p.file for p in gc.PHASES} <= set(orch.OUT_FILES)
    assert len(orch.OUT_FILES) <= 8 and all("/" not in f for f in orch.OUT_FILES)


@pytest.mark.parametrize("args, words", [
    (["--phase", "nope"], ["--phase/--plant-hang", "'nope'", "execute"]),
    (["--budget", "5"], ["--budget", "between 10 and 3600", "5"]),
    (["--jobs", "0"], ["--jobs", ">= 1", "0"]),
])
def test_bad_arguments_are_one_usage_error(args, words, capsys):
    with pytest.raises(SystemExit) as exc:
        gc.main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


def test_out_holding_other_files_is_refused_and_kept(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    assert gc.main(["--device", "emulated", "--out", str(out), "--phase", "env"]) == 2
    assert "--out: an empty folder or an earlier check's" in capsys.readouterr().err
    assert _files(out) == ["mine.txt"] and (out / "mine.txt").read_text() == "keep me"


def test_a_planted_hang_is_cut_at_its_cap_and_the_run_goes_on(tmp_path, restore_phases):
    hang = orch.Phase("hang", "a command that never ends", gc.hang_body, 1, 3, "tests.txt",
                      (1, 3))
    phases = [orch.Phase("first", "prints", _say("first ran"), 1, 30, "env.txt", (1, 30)),
              hang,
              orch.Phase("after", "prints", _say("after ran"), 1, 30, "train.txt", (1, 30))]
    orch.register(phases)
    check = _check(tmp_path)
    t0 = time.monotonic()
    results = orch.run_phases(check, phases)
    took = time.monotonic() - t0
    status = {r.name: r.status for r in results}
    assert status == {"first": "PASSED", "hang": "FAILED", "after": "PASSED"}
    hung = results[1]
    assert "killed at its cap (3 s)" in hung.detail and 2.5 <= hung.seconds < 10
    assert took < 20
    assert _files(check.out) == sorted(orch.OUT_FILES)
    summary = (check.out / "summary.md").read_text()
    for name in ("first", "hang", "after"):
        assert f"| {name} |" in summary
    assert "| hang | FAILED |" in summary and "killed at its cap" in summary
    assert "after ran" in (check.out / "train.txt").read_text()
    assert "gpu_check: killed after" in (check.out / "tests.txt").read_text()


def test_a_phase_whose_estimate_no_longer_fits_is_skipped_and_said_so(tmp_path,
                                                                       restore_phases):
    big = orch.Phase("big", "too long", _say("big ran"), 500, 600, "tests.txt", (500, 600))
    gpu = orch.Phase("gpu-only", "needs the GPU", _say("gpu ran"), 1, 10, "env.txt", None)
    small = orch.Phase("small", "fits", _say("small ran"), 1, 30, "train.txt", (1, 30))
    orch.register([big, gpu, small])
    check = _check(tmp_path, budget=40)
    results = orch.run_phases(check, [big, gpu, small])
    assert [r.status for r in results] == ["SKIPPED", "SKIPPED", "PASSED"]
    assert "its estimate (500 s) no longer fits" in results[0].detail
    assert results[1].detail.startswith("needs a real GPU")
    summary = (check.out / "summary.md").read_text()
    assert "| big | SKIPPED |" in summary and "| small | PASSED |" in summary
    assert "big ran" not in (check.out / "tests.txt").read_text()


def test_a_background_phase_is_awaited_by_the_phase_after_it(tmp_path, restore_phases):
    script = "import time; time.sleep(1); print('compile: 2 modules, 5 kernel instances, " \
             "0 failed; 1 s with 2 processes')"

    def start(check: orch.Check, result: orch.Result) -> None:
        check.background[result.name] = (check.start(result, [sys.executable, "-c", script],
                                                     result.cap), result, ph.compile_finish)

    seen = {}

    def execute(check: orch.Check, result: orch.Result) -> None:
        seen["compile"] = [r.status for r in check.results if r.name == "compile"]

    phases = [orch.Phase("compile", "bg", start, 1, 30, "compile.txt", (1, 30),
                         background=True),
              orch.Phase("execute", "waits", execute, 1, 30, "execute.txt", (1, 30),
                         after="compile")]
    orch.register(phases)
    check = _check(tmp_path)
    results = orch.run_phases(check, phases)
    assert seen["compile"] == ["PASSED"]  # finished and reported before execute began
    assert results[0].detail.startswith("2 modules, 5 kernel instances, 0 failed")
    assert check.figures["compile"] == {"modules": 2, "instances": 5, "failed": 0,
                                        "seconds": 1}
    assert "compile: 2 modules" in (check.out / "compile.txt").read_text()


def test_sigterm_kills_the_running_phase_and_keeps_the_summary(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--device", "emulated", "--out",
                             str(out), "--work", str(work), "--phase", "env", "--phase",
                             "gpu-tests", "--plant-hang", "gpu-tests"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "| env | PASSED" not in _summary(out):
        time.sleep(0.2)
    time.sleep(1.5)  # the planted hang is running
    proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, text
    summary = _summary(out)
    assert "| env | PASSED" in summary
    assert "| gpu-tests | FAILED" in summary and "interrupted by signal 15" in summary
    assert _files(out) == sorted(orch.OUT_FILES)


def _summary(out: Path) -> str:
    try:
        return (out / "summary.md").read_text()
    except OSError:
        return ""


@pytest.mark.rehearsal
def test_the_emulated_rehearsal_runs_every_phase_within_its_budget(tmp_path):
    """The one command, rehearsed on the emulated device: exit 0, within the budget, the 8
    files and nothing else, a summary naming every phase (GPU-only ones SKIPPED with the
    reason), and the figures each phase reports."""
    out, work, budget = tmp_path / "out", tmp_path / "work", 300
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, str(SCRIPT), "--device", "emulated", "--budget",
                          str(budget), "--out", str(out), "--work", str(work)],
                         capture_output=True, text=True, cwd=ROOT, timeout=budget + 120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert took < budget + 30
    assert _files(out) == sorted(orch.OUT_FILES)
    summary = (out / "summary.md").read_text()
    for phase in gc.PHASES:
        want = "SKIPPED" if phase.emulated is None else "PASSED"
        assert f"| {phase.name} | {want} |" in summary, summary
    assert "needs a real GPU" in summary
    bench = json.loads((out / "bench.json").read_text())
    ex = bench["execute"]
    assert ex["executed"] == ex["declared"] > 0 and ex["failures"] == 0
    assert set(bench["train"]) == {"f32", "bf16"}
    assert all("val loss" in v for v in bench["train"].values())
    assert bench["compile"]["failed"] == 0
    assert bench["bench_kernels"]["cases"]
