"""scripts/gpu_check.py without a GPU: step list, step names, the append-only report, and the
per-step time limit (the probe and the steps are replaced where a GPU would be needed)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


from benchsuite import gpu_check as gc  # noqa: E402


@pytest.fixture
def no_probe(monkeypatch):
    def probe(env):
        raise AssertionError("the GPU must not be probed here")

    monkeypatch.setattr(gc, "probe_gpu_subprocess", probe)


def test_list_names_every_step_with_a_description(capsys, no_probe):
    assert gc.main(["--list"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for spec in gc.STEPS:
        line = next(line for line in lines if line.split()[:1] == [spec.name])
        assert spec.help in line
    for group in gc.GROUPS:
        assert any(line.split()[:1] == [group] for line in lines)
    assert [s.name for s in gc.STEPS][:2] == ["install", "compile"]
    for name in ("gpu-gpuplan", "mpi2", "mpi4", "train", "bench-kernels", "bench-train",
                 "bench-comm"):
        assert name in gc.STEP_NAMES


def test_unknown_step_is_a_clear_error_with_exit_2(capsys, no_probe):
    assert gc.main(["--step", "compile", "--step", "no-such-step"]) == 2
    err = capsys.readouterr().err
    assert "unknown step 'no-such-step'" in err
    assert "install" in err and "bench-comm" in err  # it lists the valid names


def test_resolve_steps_keeps_order_expands_groups_and_drops_repeats():
    assert gc.resolve_steps(None) == gc.STEP_NAMES
    assert gc.resolve_steps(["mpi4", "compile", "mpi", "compile"]) == ["mpi4", "compile", "mpi2"]
    assert gc.resolve_steps(["gpu-tests"]) == gc.GROUPS["gpu-tests"]
    with pytest.raises(ValueError, match="'x'"):
        gc.resolve_steps(["x"])


def test_no_gpu_exits_2_and_runs_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gc, "probe_gpu_subprocess", lambda env: (False, "no driver"))
    report = tmp_path / "gpu_check.md"
    assert gc.main(["--step", "compile", "--report", str(report)]) == 2
    assert "NO GPU: no driver" in capsys.readouterr().err
    assert not report.exists()


def test_append_report_never_rewrites_earlier_content(tmp_path):
    report = tmp_path / "reports" / "gpu_check.md"
    first = gc.Step("install", "passed", "project installed", 3.0)
    gc.append_report(report, gc.format_result(first, "abc123", "H100"))
    before = report.read_bytes()
    assert before.startswith(gc.REPORT_HEADER.encode())
    assert "## install: PASSED" in before.decode() and "abc123" in before.decode()

    second = gc.Step("mpi2", "failed", "1 failed, 3 passed", 9.0, tail=["E   boom"])
    gc.append_report(report, gc.format_result(second, "abc123", "H100"))
    after = report.read_bytes()
    assert after.startswith(before)  # earlier bytes untouched
    text = after.decode()
    assert text.count("# GPU check results") == 1  # header only on first write
    assert text.index("## install: PASSED") < text.index("## mpi2: FAILED")
    assert "E   boom" in text  # a failing step shows its log tail


def test_append_report_keeps_a_file_written_by_an_earlier_run(tmp_path):
    report = tmp_path / "gpu_check.md"
    report.write_text("# GPU check results\n\nearlier run, edited by hand\n")
    gc.append_report(report, gc.format_result(gc.Step("compile", "skipped"), "c", "d"))
    text = report.read_text()
    assert text.startswith("# GPU check results\n\nearlier run, edited by hand\n## compile")


def test_every_step_appends_at_once_and_a_failure_does_not_stop_the_others(
        monkeypatch, tmp_path):
    monkeypatch.setattr(gc, "probe_gpu_subprocess", lambda env: (True, "FakeGPU"))
    monkeypatch.setattr(gc, "add_installed_mpich", lambda env: None)
    monkeypatch.setattr(gc, "LOGS", tmp_path / "logs")
    monkeypatch.setenv("GPU_CHECK_COMMIT", "deadbeef")
    report = tmp_path / "gpu_check.md"
    seen: list[str] = []

    def failing_command(ctx, step):
        gc.run_step(step, [sys.executable, "-c", "print('hello'); raise SystemExit(3)"], ctx)

    def crashing(ctx, step):
        seen.append(report.read_text())  # the earlier step is already in the report
        raise RuntimeError("bug in the step")

    def passing(ctx, step):
        step.detail = "fine"

    specs = [gc.StepSpec("a", "fails", failing_command), gc.StepSpec("b", "crashes", crashing),
             gc.StepSpec("c", "passes", passing)]
    monkeypatch.setattr(gc, "STEPS", specs)
    monkeypatch.setattr(gc, "STEP_NAMES", [s.name for s in specs])
    assert gc.main(["--report", str(report)]) == 1
    assert "## a: FAILED" in seen[0] and "## b:" not in seen[0]
    text = report.read_text()
    assert "## a: FAILED" in text and "exit status 3" in text and "hello" in text
    assert "## b: FAILED" in text and "RuntimeError: bug in the step" in text
    assert "## c: PASSED" in text and "- details: fine" in text
    assert "deadbeef" in text and "FakeGPU" in text


def test_a_step_over_its_time_limit_is_killed_with_its_process_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    script = (f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); "
              f"open({str(pidfile)!r}, 'w').write(str(p.pid)); print('started', flush=True); "
              f"time.sleep(60)")
    t0 = time.monotonic()
    rc, lines, timed_out = gc.run_command([sys.executable, "-c", script], {}, 1.5,
                                          tmp_path / "x.log")
    assert timed_out and rc == 124
    assert time.monotonic() - t0 < 10
    assert "started" in lines and "killed after" in lines[-1]
    grandchild = int(pidfile.read_text())
    time.sleep(0.2)
    alive = subprocess.run(["ps", "-o", "stat=", "-p", str(grandchild)], capture_output=True,
                           text=True).stdout.strip()
    assert alive in ("", "Z"), f"the grandchild survived: {alive}"


def test_pytest_counts_reads_the_summary_line():
    lines = ["....", "3 failed, 120 passed, 4 skipped, 2 deselected in 9.1s"]
    assert gc.pytest_counts(lines) == "3 failed, 120 passed, 4 skipped, 2 deselected"
    assert gc.pytest_counts(["no summary"]) == "no pytest summary"


def test_carried_mpich_wheel_ignores_the_placeholder(monkeypatch, tmp_path):
    (tmp_path / ".carry").mkdir()
    for name in ("mpich-0.0.0-py3-none-any.whl", "mpich-4.3.1-py3-none-manylinux_2_28_x86_64.whl",
                 "mpich-5.0.2-py3-none-manylinux_2_28_x86_64.whl"):
        (tmp_path / ".carry" / name).write_bytes(b"")
    monkeypatch.setattr(gc, "ROOT", tmp_path)
    assert gc.carried_mpich_wheel().name.startswith("mpich-5.0.2-")
    (tmp_path / ".carry" / "mpich-5.0.2-py3-none-manylinux_2_28_x86_64.whl").unlink()
    (tmp_path / ".carry" / "mpich-4.3.1-py3-none-manylinux_2_28_x86_64.whl").unlink()
    assert gc.carried_mpich_wheel() is None
