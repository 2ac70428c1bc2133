"""What train.py reports: a tqdm bar or plain lines with the ETA, metrics.jsonl, MFU, memory."""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from gpuplan.confined_write import append_text, atomic_write, check_inside, make_folder

# The TFLOP/s MFU is measured against, by device-name fragment, most specific first:
# (bf16 tensor core, f32 without tensor cores; f32 GEMMs here run cuBLAS in pedantic,
# non-TF32 mode). For the SXM H100/H200 the bf16 figure is what a dense bf16 GEMM sustains
# there, not the data sheet's 989.4: cuBLAS 8192^3 on random data ran at 769-798 TFLOP/s on
# the lent H200 machines (KINDS.md, 2026-10-28 and 2026-11-04; the GPU check's cuda-paths
# phase measures it again), so 100% MFU means "as fast as cuBLAS's best GEMM". The other
# rows are data-sheet peaks (no sustained figure measured here yet).
PEAK_TFLOPS: list[tuple[str, float, float]] = [
    ("H100 PCIe", 756.0, 51.2),
    ("H100 NVL", 835.0, 60.0),
    ("H100", 790.0, 66.9),   # SXM5: sustained dense bf16 GEMM (data sheet 989.4)
    ("H200 NVL", 835.0, 60.0),
    ("H200", 790.0, 66.9),   # SXM: the same compute as H100 SXM; sustained (data sheet 989.4)
    ("A100", 312.0, 19.5),
]
_LAUNCHERS = ("mpiexec", "mpirun", "mpiexec.hydra", "hydra_pmi_proxy", "orterun", "orted",
              "prterun", "prted", "srun")


def show_bar(mode: str, rank: int, env: Mapping[str, str] | None = None) -> bool:
    """Whether this rank draws the progress bar: rank 0 only, always with --progress bar,
    never with plain, and with auto only when a person watches (`interactive`)."""
    if rank != 0 or mode == "plain":
        return False
    return mode == "bar" or interactive(env)


def interactive(env: Mapping[str, str] | None = None) -> bool:
    """True when a person watches the output. Without a launcher: our stdout is a terminal.
    Under one, our own stdout proves nothing (Open MPI hands every rank a pseudo-terminal even
    when mpirun's output goes to a file; Hydra hands ranks pipes): the launcher's stdout must
    be a terminal, found by walking up the parent processes (Linux /proc). A launcher not
    found there (srun, a remote node) counts as not interactive."""
    from gpuplan.launcher import detect

    if detect(env).launcher == "none":
        return sys.stdout.isatty()
    return launcher_on_terminal()


def launcher_on_terminal() -> bool:
    """True when an MPI launcher among this process's parents writes to a terminal."""
    pid = os.getppid()
    for _ in range(6):
        proc = Path(f"/proc/{pid}")
        try:
            name = (proc / "comm").read_text().strip()
            stat = (proc / "stat").read_text()
        except OSError:
            return False
        if name not in _LAUNCHERS:
            return False
        try:
            target = os.readlink(proc / "fd" / "1")
        except OSError:
            target = ""
        if target.startswith(("/dev/pts/", "/dev/tty")):
            return True
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the launcher's own parent
    return False


def flops_per_token(cfg, n_params: int, seq: int) -> float:
    """Training FLOPs per token (PaLM appendix B): 6 N for the weights (forward 2N, backward
    4N; N without GPT's position embedding: a Llama has none, its positions are rotary) plus
    12 L T C for attention scores and values."""
    from dist.models.configs import kind_of

    positions = cfg.block_size * cfg.n_embd if kind_of(cfg) == "gpt" else 0
    return 6.0 * (n_params - positions) + 12.0 * cfg.n_layer * seq * cfg.n_embd


def peak_tflops(name: str, dtype: str) -> float | None:
    """Dense peak TFLOP/s of the device called `name` for "bf16" or "f32"; None if unknown."""
    for fragment, bf16, f32 in PEAK_TFLOPS:
        if fragment in name:
            return bf16 if dtype == "bf16" else f32
    return None


def gpus_in_job(mpi_comm, device_id: int) -> int:
    """How many distinct GPUs the job's ranks use: ranks may share one (gpu_check runs 2 and
    4 ranks on one GPU), so the job's peak FLOP/s is per GPU, not per rank. A collective:
    every rank calls it."""
    import socket

    return len(set(mpi_comm.allgather((socket.gethostname(), int(device_id)))))


def device_name(device: str) -> str:
    """The GPU's name for "cuda"; the CPU model and core count otherwise (prefixed by
    "emulated sm_80 on" for the emulated device)."""
    if device == "cuda":
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    where = f"{model}, {os.cpu_count()} logical cores"
    return f"emulated sm_80 on {where}" if device == "emulated" else where


def memory_mib(device: str) -> float:
    """This process's memory: on a GPU the bytes CuPy's default pool holds now (not a peak;
    a CUDA graph's private pool, cuBLAS and NCCL workspaces are not in it), on the host the
    peak RSS."""
    if device == "cuda":
        import cupy

        return cupy.get_default_memory_pool().total_bytes() / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class Progress:
    """Rank 0's report. `bar=True`: a tqdm bar (step, loss, tokens/s, ETA) with the
    evaluation lines written above it; `bar=False` (logs, pipes): only the evaluation lines."""

    def __init__(self, total_steps: int, start_step: int, bar: bool, file: TextIO | None = None,
                 ) -> None:
        self.total, self.start_step = total_steps, start_step
        self.file = sys.stdout if file is None else file
        self.start = time.perf_counter()
        self.first: tuple[float, int] | None = None  # (time, step) when the first step ended
        self.bar = None
        if bar:
            from tqdm import tqdm

            # Under Hydra our stdout is a pipe to a terminal: tqdm cannot ask it for a width.
            width = shutil.get_terminal_size((100, 24)).columns
            self.bar = tqdm(total=total_steps, initial=start_step, file=self.file, ncols=width,
                            unit="step", dynamic_ncols=False, leave=False)

    def eta(self, step: int) -> float | None:
        """Seconds left at `step`: the wall time per step since this run's first step ended
        (evaluations and checkpoints included) times the steps left; None until a step
        after the first (the first compiles kernels: it would inflate the ETA many times)."""
        if self.first is None or step <= self.first[1]:
            return None
        t_first, first_step = self.first
        return (time.perf_counter() - t_first) / (step - first_step) * (self.total - step)

    def step(self, step: int, loss: float, tokens_per_s: float) -> None:
        if self.first is None:
            self.first = (time.perf_counter(), step)
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {loss:.4f}, {_si(tokens_per_s)} tok/s",
                                     refresh=False)
            self.bar.update(step - self.bar.n)

    def line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.file)
        else:
            print(text, file=self.file, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class MetricsLog:
    """OUT/metrics.jsonl: one JSON object per evaluation, flushed and fsynced as written, so
    a killed run keeps every record written before it died.

    resume_step None: a new run starts a new file. An int: the run resumes after that step,
    so records past it (written by the run that died after its checkpoint) and a last line
    cut short are dropped (the file is rewritten beside itself and renamed into place)."""

    def __init__(self, path: str | os.PathLike, resume_step: int | None = None,
                 root: str | os.PathLike | None = None) -> None:
        self.path = Path(path)
        self.root = self.path.parent if root is None else Path(root)  # writes stay inside
        make_folder(self.path.parent, self.root)
        check_inside(self.path, self.root)  # (before reading it: never a file outside)
        kept = []
        if resume_step is not None and self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a kill
                step = rec.get("step") if isinstance(rec, dict) else None
                if isinstance(step, int) and step <= resume_step:
                    kept.append(line)
        atomic_write(self.path, "".join(line + "\n" for line in kept).encode(), self.root)

    def append(self, record: dict) -> None:
        line = json.dumps({k: _json_safe(v) for k, v in record.items()})
        append_text(self.path, line + "\n", self.root)


def _json_safe(value):
    """NaN and infinities (a skipped step's loss) as null: JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _si(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def format_eta(seconds: float | None) -> str:
    """ETA as h:mm:ss or m:ss ("?" when unknown)."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_record(rec: dict, total_steps: int, eta_s: float | None = None) -> str:
    parts = [f"step {rec['step']:5d}/{total_steps}", f"loss {rec['train_loss']:.4f}"]
    if rec.get("val_loss") is not None:
        parts.append(f"val {rec['val_loss']:.4f}")
    parts += [f"lr {rec['lr']:.2e}", f"{_si(rec['tokens_per_s'])} tok/s",
              f"{rec['step_time_s'] * 1e3:.0f} ms/step"]
    if rec.get("mfu") is not None:
        parts.append(f"mfu {100 * rec['mfu']:.1f}%")
    parts.append(f"mem {rec['memory_mib']:.0f} MiB")
    if rec["step"] < total_steps:
        parts.append(f"eta {format_eta(eta_s)}")
    return " | ".join(parts)
