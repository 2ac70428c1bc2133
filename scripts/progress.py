"""What the training script reports: progress lines or a bar, throughput, MFU, memory."""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

# Dense peak TFLOP/s (no sparsity) by device-name fragment, most specific first:
# (bf16 tensor core, f32 without tensor cores; f32 GEMMs here run cuBLAS in pedantic,
# non-TF32 mode). NVIDIA data sheets.
PEAK_TFLOPS: list[tuple[str, float, float]] = [
    ("H100 PCIe", 756.0, 51.2),
    ("H100 NVL", 835.0, 60.0),
    ("H100", 989.4, 66.9),   # SXM5
    ("H200 NVL", 835.0, 60.0),
    ("H200", 989.4, 66.9),   # SXM, same compute as H100 SXM
    ("A100", 312.0, 19.5),
]
_LAUNCHERS = ("mpiexec", "mpirun", "mpiexec.hydra", "hydra_pmi_proxy", "orterun", "prterun",
              "prted", "srun")


def stdout_is_terminal() -> bool:
    """True when a person watches the output: our stdout is a terminal, or (under an MPI
    launcher, which pipes rank output) the launcher's stdout is (Linux /proc)."""
    if sys.stdout.isatty():
        return True
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
    4N; N without the position embedding) plus 12 L T C for attention scores and values."""
    n = n_params - cfg.block_size * cfg.n_embd
    return 6.0 * n + 12.0 * cfg.n_layer * seq * cfg.n_embd


def peak_tflops(name: str, dtype: str) -> float | None:
    """Dense peak TFLOP/s of the device called `name` for "bf16" or "f32"; None if unknown."""
    for fragment, bf16, f32 in PEAK_TFLOPS:
        if fragment in name:
            return bf16 if dtype == "bf16" else f32
    return None


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
    """This process's peak memory: the CuPy pool's bytes on a GPU, the peak RSS on the host."""
    if device == "cuda":
        import cupy

        return cupy.get_default_memory_pool().total_bytes() / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class Progress:
    """Rank 0's report. `bar=True`: one self-overwriting line per step with a bar, and a
    kept line at each evaluation; `bar=False` (logs, pipes): only the evaluation lines."""

    def __init__(self, total_steps: int, start_step: int, bar: bool, width: int = 24) -> None:
        self.total, self.bar, self.width = total_steps, bar, width
        self.start = time.perf_counter()
        self.start_step = start_step

    def step(self, step: int, loss: float, tokens_per_s: float) -> None:
        if not self.bar:
            return
        done = step / max(self.total, 1)
        filled = int(round(done * self.width))
        elapsed = time.perf_counter() - self.start
        rate = (step - self.start_step) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - step) / rate if rate > 0 else 0.0
        sys.stdout.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {step}/{self.total} "
                         f"loss {loss:.4f} | {_si(tokens_per_s)} tok/s | eta {eta:4.0f}s ")
        sys.stdout.flush()

    def line(self, text: str) -> None:
        if self.bar:
            sys.stdout.write("\r\033[K")
        print(text, flush=True)


def _si(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def format_record(rec: dict, total_steps: int) -> str:
    parts = [f"step {rec['step']:5d}/{total_steps}", f"loss {rec['train_loss']:.4f}"]
    if rec.get("val_loss") is not None:
        parts.append(f"val {rec['val_loss']:.4f}")
    parts += [f"lr {rec['lr']:.2e}", f"{_si(rec['tokens_per_s'])} tok/s",
              f"{rec['step_time_s'] * 1e3:.0f} ms/step"]
    if rec.get("mfu") is not None:
        parts.append(f"mfu {100 * rec['mfu']:.1f}%")
    parts.append(f"mem {rec['memory_mib']:.0f} MiB")
    return " | ".join(parts)
