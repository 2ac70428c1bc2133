"""dist.trainer.progress: when the bar shows, the tqdm bar, the ETA, and metrics.jsonl."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from dist.trainer import progress

OPEN_MPI = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("mode,rank,env,tty,launcher_tty,expected", [
    ("auto", 0, {}, True, False, True),          # one process on a terminal
    ("auto", 0, {}, False, True, False),         # one process into a file or pipe
    ("auto", 1, {}, True, True, False),          # never on another rank
    ("auto", 0, OPEN_MPI, True, False, False),   # Open MPI's pty, mpirun into a file
    ("auto", 0, OPEN_MPI, True, True, True),     # mpirun itself on a terminal
    ("auto", 0, OPEN_MPI, False, True, True),    # Hydra: a pipe to mpiexec on a terminal
    ("bar", 0, OPEN_MPI, False, False, True),    # asked for
    ("bar", 1, OPEN_MPI, True, True, False),
    ("plain", 0, {}, True, True, False),
])
def test_show_bar(monkeypatch, mode, rank, env, tty, launcher_tty, expected):
    monkeypatch.setattr(sys, "stdout", _Tty() if tty else io.StringIO())
    monkeypatch.setattr(progress, "launcher_on_terminal", lambda: launcher_tty)
    assert progress.show_bar(mode, rank, env) is expected


def test_launcher_on_terminal_is_false_outside_a_launcher():
    assert progress.launcher_on_terminal() is False  # pytest's parent is no MPI launcher


def test_tqdm_bar_and_lines(monkeypatch):
    out = io.StringIO()
    prog = progress.Progress(10, 2, bar=True, file=out)
    prog.step(3, 2.5, 1234.0)
    prog.line("step     3/10 | eval line")
    prog.step(4, 2.4, 1234.0)
    prog.close()
    text = out.getvalue()
    # (tqdm redraws at most every 0.1 s: the second step may not be drawn yet)
    assert "3/10" in text and "loss 2.5000" in text and "1.2k tok/s" in text
    assert "step     3/10 | eval line\n" in text and text.endswith("\r")  # bar cleared
    plain = io.StringIO()
    prog = progress.Progress(10, 0, bar=False, file=plain)
    prog.step(1, 2.5, 10.0)
    prog.line("a line")
    prog.close()
    assert plain.getvalue() == "a line\n"


def test_eta_and_record_line(monkeypatch):
    clock = iter([100.0, 120.0, 149.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    prog = progress.Progress(100, 40, bar=False)
    assert prog.eta(40) is None
    prog.step(41, 3.0, 1e3)  # the first step: 20 s of compiling (before: in the ETA, so the
    assert prog.eta(41) is None  # first ETA read 1:42:38 for a 71 s run)
    assert prog.eta(70) == pytest.approx(30.0)  # 29 steps in 29 s after the first, 30 to go
    rec = {"step": 70, "train_loss": 2.0, "val_loss": 2.1, "lr": 1e-3, "tokens_per_s": 5e3,
           "step_time_s": 0.1, "memory_mib": 100.0}
    assert progress.format_record(rec, 100, 70.0).endswith("| eta 1:10")
    assert progress.format_record(rec, 100, 4000.0).endswith("| eta 1:06:40")
    assert progress.format_record(rec, 100, None).endswith("| eta ?")
    assert "eta" not in progress.format_record({**rec, "step": 100}, 100, 0.0)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_metrics_log_appends_fsynced_lines(tmp_path, monkeypatch):
    synced = []
    real_fsync = progress.os.fsync
    monkeypatch.setattr(progress.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    path = tmp_path / "run" / "metrics.jsonl"
    log = progress.MetricsLog(path)
    log.append({"step": 1, "train_loss": 3.0})
    log.append({"step": 2, "train_loss": float("nan"), "mfu": None})
    assert _records(path) == [{"step": 1, "train_loss": 3.0},
                              {"step": 2, "train_loss": None, "mfu": None}]
    assert len(synced) == 4  # the (empty) new file and its folder, then each record
    progress.MetricsLog(path)  # a new run (no resume) starts a new file
    assert path.read_text() == ""


def test_metrics_log_resume_drops_records_past_the_step_and_a_cut_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "train_loss": 1.0 / s}) + "\n"
                            for s in (1, 25, 50, 75)) + '{"step": 100, "tra')
    log = progress.MetricsLog(path, resume_step=50)
    log.append({"step": 75, "train_loss": 0.5})
    assert [r["step"] for r in _records(path)] == [1, 25, 50, 75]
    assert _records(path)[-1]["train_loss"] == 0.5
    assert not list(tmp_path.glob(".*.tmp"))


def test_gpus_in_job_counts_each_host_and_device_once():
    class Comm:
        def __init__(self, others):
            self.others = others

        def allgather(self, mine):
            return [mine, *self.others]

    import socket

    host = socket.gethostname()
    assert progress.gpus_in_job(Comm([]), 0) == 1
    assert progress.gpus_in_job(Comm([(host, 0), (host, 0), (host, 0)]), 0) == 1  # 4 ranks
    assert progress.gpus_in_job(Comm([(host, 1), ("other", 0), ("other", 1)]), 0) == 4


def test_metrics_log_never_writes_through_a_planted_link(tmp_path):
    """Before: a `.metrics.jsonl.tmp` link was written through and renamed onto
    metrics.jsonl, so every later record went outside OUT; a metrics.jsonl link was
    appended through."""
    from gpuplan.confined_write import LinkOutsideError

    out, outside = tmp_path / "out", tmp_path / "outside.txt"
    out.mkdir()
    outside.write_text("keep")
    (out / ".metrics.jsonl.tmp").symlink_to(outside)
    log = progress.MetricsLog(out / "metrics.jsonl", root=out)
    log.append({"step": 1})
    assert outside.read_text() == "keep" and not (out / "metrics.jsonl").is_symlink()
    assert (out / "metrics.jsonl").read_text() == '{"step": 1}\n'
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").symlink_to(outside)
    with pytest.raises(LinkOutsideError, match="metrics.jsonl: resolves to .* outside"):
        progress.MetricsLog(out / "metrics.jsonl", resume_step=0, root=out)
    with pytest.raises(LinkOutsideError, match="outside"):
        log.append({"step": 2})
    assert outside.read_text() == "keep"
