"""The GPU check's frame: phases in priority order under one deadline, each with its own cap
and estimate, skipped (and said so) when the estimate no longer fits; after every phase the
summary and the evidence files are rewritten in the output folder, at most 8 flat files.

A lent GPU machine gives one command of about 540 s and returns at most 8 files from $OUT
(no deeper than $OUT/a/file); a command cut off at its limit still returns what is there.
So the evidence is always complete up to the last phase that ended, and never more than
OUT_FILES files.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import platform
import re
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchsuite.gpu_check import procs

ROOT = Path(__file__).resolve().parents[2]

#: The files that come back, in this order; each phase's log goes into one of the text files.
OUT_FILES = ("summary.md", "env.txt", "compile.txt", "execute.txt", "tests.txt", "train.txt",
             "bench.json", "logs.tar.gz")
#: Text files keep the head and the tail of a long log (the lent machine returns 16 MiB per
#: file at most; these stay far below that).
TEXT_LIMIT = 2 << 20
TAR_LIMIT = 12 << 20


@dataclass
class Phase:
    """One phase: what it checks, its seconds (estimate and cap, on a GPU and on the
    emulated rehearsal) and the returned file its log goes into."""

    name: str
    what: str
    body: Callable[[Check, Result], None]
    estimate: float
    cap: float
    file: str
    emulated: tuple[float, float] | None = (10.0, 60.0)  # (estimate, cap); None: GPU only
    background: bool = False  # started, then awaited by the first phase that names it
    after: str | None = None  # a background phase to await first

    def limits(self, device: str) -> tuple[float, float] | None:
        if device == "cuda":
            return self.estimate, self.cap
        return self.emulated


@dataclass
class Result:
    name: str
    status: str = "RUNNING"  # PASSED | FAILED | SKIPPED | RUNNING
    detail: str = ""
    seconds: float = 0.0
    cap: float = 0.0
    tail: list[str] = field(default_factory=list)

    def fail(self, why: str, tail: list[str] | None = None) -> None:
        self.status = "FAILED"
        self.detail = "; ".join(p for p in (self.detail, why) if p)
        if tail and not self.tail:
            self.tail = tail[-30:]

    def note(self, text: str) -> None:
        self.detail = "; ".join(p for p in (self.detail, text) if p)


class Check:
    """One run of the check: the device, the deadline, the work and output folders, the
    results so far and the figures (bench.json)."""

    def __init__(self, device: str, budget: float, out: Path, work: Path, env: dict[str, str],
                 python: str, commit: str, jobs: int) -> None:
        self.device, self.budget, self.out, self.work = device, budget, out, work
        self.env, self.python, self.commit, self.jobs = env, python, commit, jobs
        self.t0 = time.monotonic()
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self.results: list[Result] = []
        self.figures: dict = {}
        self.device_desc = "not probed yet"
        self.background: dict[str, tuple[procs.Command, Result, Callable]] = {}
        self.phase_cap_end = 0.0  # time.monotonic() by which the current phase must end
        self.current: Phase | None = None
        self.stop_reason = ""  # set when a phase finds that nothing after it can run

    # -- time -------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.budget - self.elapsed()

    def phase_left(self) -> float:
        return min(self.phase_cap_end, self.t0 + self.budget) - time.monotonic()

    # -- commands ---------------------------------------------------------------------------
    def log_path(self, phase: str) -> Path:
        return self.work / "logs" / f"{phase}.log"

    def child_env(self, cap: float, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a phase's command: the collective watchdog below the phase's
        cap (a hung collective ends the command with a message before the cap kills it)."""
        env = dict(self.env)
        env["GPUPLAN_COLLECTIVE_TIMEOUT"] = str(int(max(10, min(120, cap - 15))))
        env.update(extra or {})
        return env

    def command(self, result: Result, cmd: list[str], cap: float | None = None,
                env: dict[str, str] | None = None, name: str | None = None) -> procs.Finished:
        """Run `cmd` within the phase's time (or `cap`, if smaller); a failure marks `result`."""
        limit = self.phase_left() if cap is None else min(cap, self.phase_left())
        if limit <= 1:
            fin = procs.Finished(124, [], 0.0, True)
            result.fail(f"no time left for `{' '.join(cmd[-3:])}`")
            return fin
        fin = procs.run(cmd, self.child_env(limit, env), ROOT, self.log_path(name or result.name),
                        limit)
        if fin.rc != 0:
            why = (f"killed at its cap ({limit:.0f} s)" if fin.timed_out
                   else f"exit status {fin.rc}")
            result.fail(f"`{short(cmd)}`: {why}", fin.lines)
        return fin

    def start(self, result: Result, cmd: list[str], cap: float,
              env: dict[str, str] | None = None) -> procs.Command:
        return procs.Command(cmd, self.child_env(cap, env), ROOT, self.log_path(result.name),
                             echo=False)

    # -- evidence ---------------------------------------------------------------------------
    def write_outputs(self) -> None:
        """Rewrite every returned file in the output folder (each written beside its final
        name, then renamed over it: a reader never sees half a file)."""
        self.out.mkdir(parents=True, exist_ok=True)
        texts: dict[str, list[str]] = {name: [] for name in OUT_FILES if name.endswith(".txt")}
        for res in self.results:
            phase = PHASES_BY_NAME.get(res.name)
            log = self.log_path(res.name)
            if phase is None or not log.exists() or phase.file not in texts:
                continue
            texts[phase.file].append(f"#### {res.name}: {res.status} ({res.seconds:.0f} s)\n")
            texts[phase.file].append(clip(log.read_text(errors="replace")))
        for name, parts in texts.items():
            _write(self.out / name, "\n".join(parts) or "(no phase wrote here)\n")
        _write(self.out / "bench.json", json.dumps(
            {"device": self.device_desc, "commit": self.commit, "date": self.started.isoformat(
                timespec="seconds"), **self.figures}, indent=1, default=str) + "\n")
        _write_bytes(self.out / "logs.tar.gz", self.tarball())
        _write(self.out / "summary.md", self.summary())
        extra = sorted(p.name for p in self.out.iterdir() if p.name not in OUT_FILES)
        if extra:
            print(f"gpu_check: WARNING: {self.out} holds files besides the {len(OUT_FILES)} it "
                  f"writes ({', '.join(extra[:5])}): a lent machine returns 8 at most",
                  flush=True)

    def tarball(self) -> bytes:
        """The work folder (logs, JSON results, training metrics) as .tar.gz, the largest
        files left out when the whole would pass TAR_LIMIT."""
        files = sorted((p for p in self.work.rglob("*") if p.is_file() and not p.is_symlink()),
                       key=lambda p: p.stat().st_size)
        buf = io.BytesIO()
        total = 0
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for p in files:
                size = p.stat().st_size
                if total + size > TAR_LIMIT:
                    continue
                total += size
                tar.add(p, arcname=str(p.relative_to(self.work)))
        return buf.getvalue()

    def summary(self) -> str:
        now = datetime.datetime.now(datetime.timezone.utc)
        lines = ["# GPU check summary", "",
                 f"- device: {self.device} ({self.device_desc})",
                 f"- commit: {self.commit}",
                 f"- started {self.started.strftime('%Y-%m-%d %H:%M:%S UTC')}, written "
                 f"{now.strftime('%H:%M:%S UTC')}; {self.elapsed():.0f} s of a "
                 f"{self.budget:.0f} s budget; Python {platform.python_version()}",
                 "", "| phase | status | seconds | cap | details |", "|---|---|---:|---:|---|"]
        done = {r.name for r in self.results}
        for r in self.results:
            lines.append(f"| {r.name} | {r.status} | {r.seconds:.0f} | {r.cap:.0f} | "
                         f"{_cell(r.detail)} |")
        for phase in PHASES:
            if phase.name not in done:
                lines.append(f"| {phase.name} | NOT RUN YET | | | {_cell(phase.what)} |")
        failed = [r for r in self.results if r.status == "FAILED" and r.tail]
        for r in failed:
            lines += ["", f"## {r.name}: last lines", "", "```", *r.tail, "```"]
        counts = {s: sum(r.status == s for r in self.results)
                  for s in ("PASSED", "FAILED", "SKIPPED")}
        lines += ["", f"{counts['PASSED']} passed, {counts['FAILED']} failed, "
                      f"{counts['SKIPPED']} skipped of {len(PHASES)} phases. Files: "
                      f"{', '.join(OUT_FILES)}.", ""]
        return "\n".join(lines)


def short(cmd: list[str]) -> str:
    """A command without the interpreter's path: `pytest -m gpu ...`."""
    words = [Path(w).name if i == 0 or w.endswith("python3") else w for i, w in enumerate(cmd)]
    text = " ".join(words)
    return text if len(text) < 120 else text[:117] + "..."


def clip(text: str) -> str:
    if len(text) <= TEXT_LIMIT:
        return text
    head = text[: TEXT_LIMIT // 8]
    tail = text[-(TEXT_LIMIT - len(head)):]
    return head + f"\n[... {len(text) - len(head) - len(tail)} characters left out ...]\n" + tail


def _cell(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("|", "/")).strip() or "-"


def _write(path: Path, text: str) -> None:
    _write_bytes(path, text.encode())


def _write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


#: Filled by benchsuite.gpu_check.phases (the list, in priority order).
PHASES: list[Phase] = []
PHASES_BY_NAME: dict[str, Phase] = {}


def register(phases: list[Phase]) -> None:
    PHASES[:] = phases
    PHASES_BY_NAME.clear()
    PHASES_BY_NAME.update({p.name: p for p in phases})


def run_phases(check: Check, phases: list[Phase] | None = None) -> list[Result]:
    """Run `phases` (default: PHASES) in order under the check's deadline; rewrite the
    outputs after each. Returns the results."""
    for phase in phases if phases is not None else PHASES:
        if phase.after:
            await_background(check, phase.after)
        result = Result(phase.name)
        limits = phase.limits(check.device)
        if limits is None:
            result.status, result.detail = "SKIPPED", f"needs a real GPU ({phase.what})"
        elif check.stop_reason:
            result.status, result.detail = "SKIPPED", check.stop_reason
        elif limits[0] > check.left():
            result.status = "SKIPPED"
            result.detail = (f"its estimate ({limits[0]:.0f} s) no longer fits: "
                             f"{max(0.0, check.left()):.0f} s of the budget left")
        if result.status != "RUNNING":
            check.results.append(result)
            _report(check, result)
            continue
        result.cap = min(limits[1], check.left())
        check.phase_cap_end = time.monotonic() + result.cap
        check.current = phase
        t0 = time.monotonic()
        check.results.append(result)
        try:
            phase.body(check, result)
        except Exception as exc:  # noqa: BLE001 - a broken phase must not stop the others
            result.fail(f"gpu_check error: {type(exc).__name__}: {exc}")
        result.seconds = time.monotonic() - t0
        if phase.background:
            continue  # reported when awaited
        if result.status == "RUNNING":
            result.status = "PASSED"
        _report(check, result)
    for name in list(check.background):
        await_background(check, name)
    return check.results


def await_background(check: Check, name: str) -> None:
    """Wait for the background phase `name` (within its own cap and the budget), then let
    its finisher read the output and report it."""
    if name not in check.background:
        return
    cmd, result, finish = check.background.pop(name)
    cap_end = min(cmd.t0 + result.cap, check.t0 + check.budget)
    fin = cmd.wait(max(0.5, cap_end - time.monotonic()))
    result.seconds = fin.seconds
    if fin.rc != 0:
        why = (f"killed at its cap ({result.cap:.0f} s)" if fin.timed_out
               else f"exit status {fin.rc}")
        result.fail(f"`{short(cmd.cmd)}`: {why}", fin.lines)
    try:
        finish(check, result, fin)
    except Exception as exc:  # noqa: BLE001
        result.fail(f"gpu_check error: {type(exc).__name__}: {exc}")
    if result.status == "RUNNING":
        result.status = "PASSED"
    _report(check, result)


def _report(check: Check, result: Result) -> None:
    check.write_outputs()
    print(f"\n== {result.name}: {result.status} ({result.seconds:.0f} s) {result.detail}",
          flush=True)
