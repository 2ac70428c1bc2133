"""Commands of the GPU check: each in its own process group, under a cap, its output echoed
and appended to a log; a command past its cap is killed with everything it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

try:  # loaded here: the child must not import anything between fork and exec
    import ctypes

    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
except (ImportError, OSError, AttributeError):
    _PRCTL = None

#: Commands running now (foreground and background): killed when the check is interrupted.
RUNNING: set[subprocess.Popen] = set()


def _child_setup() -> None:  # runs in the child between fork and exec
    os.setpgid(0, 0)  # its own process group, killed as a whole past its cap
    if _PRCTL is not None:  # and killed if the check itself dies (PR_SET_PDEATHSIG = 1)
        _PRCTL(1, int(signal.SIGKILL), 0, 0, 0)


def kill_group(proc: subprocess.Popen, grace: float = 3.0) -> None:
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


@dataclass
class Finished:
    """How a command ended: its exit status (124 past its cap), output lines, seconds."""

    rc: int
    lines: list[str]
    seconds: float
    timed_out: bool


class Command:
    """One command started in the background (`start`), then waited for (`wait`)."""

    def __init__(self, cmd: list[str], env: dict[str, str], cwd: Path, log: Path,
                 echo: bool = True) -> None:
        self.cmd, self.log, self.echo = cmd, log, echo
        self.lines: list[str] = []
        self.t0 = time.monotonic()
        log.parent.mkdir(parents=True, exist_ok=True)
        self._out = log.open("a", encoding="utf-8")
        self._out.write(f"$ {' '.join(cmd)}\n")
        self._out.flush()
        if echo:
            print(f"\n== {' '.join(cmd)}", flush=True)
        try:
            self.proc: subprocess.Popen | None = subprocess.Popen(
                cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, errors="replace", preexec_fn=_child_setup)
        except OSError as exc:
            self.proc = None
            self._say(f"gpu_check: could not start {cmd[0]}: {exc}")
            return
        RUNNING.add(self.proc)
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _say(self, line: str) -> None:
        self.lines.append(line)
        self._out.write(line + "\n")
        self._out.flush()
        if self.echo:
            print(line, flush=True)

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if self.echo:
                sys.stdout.write(line)
            self._out.write(line)
            self.lines.append(line.rstrip("\n"))
        self._out.flush()

    def done(self) -> bool:
        return self.proc is None or self.proc.poll() is not None

    def wait(self, cap: float) -> Finished:
        """Wait until the command ends or `cap` seconds from now pass; past them, kill its
        process group (exit status 124)."""
        if self.proc is None:
            self._out.close()
            return Finished(127, self.lines, 0.0, False)
        timed_out = False
        try:
            self.proc.wait(timeout=max(0.5, cap))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            kill_group(self.proc)  # past the cap, or stragglers after a normal exit
            RUNNING.discard(self.proc)
            self._reader.join(timeout=10)
        seconds = time.monotonic() - self.t0
        if timed_out:
            self._say(f"gpu_check: killed after {seconds:.0f} s (its cap)")
        self._out.close()
        rc = self.proc.returncode if self.proc.returncode is not None else -9
        return Finished(124 if timed_out else rc, self.lines, seconds, timed_out)


def run(cmd: list[str], env: dict[str, str], cwd: Path, log: Path, cap: float,
        echo: bool = True) -> Finished:
    """Run `cmd` to its end or its cap."""
    return Command(cmd, env, cwd, log, echo).wait(cap)


def kill_all() -> None:
    """Kill every command still running (the check was interrupted)."""
    for proc in list(RUNNING):
        kill_group(proc, grace=1.0)
        RUNNING.discard(proc)
