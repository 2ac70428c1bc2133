"""The emulated device as a gpuplan device plug-in (`gpuplan.devices.Device`): arrays in host
memory (`EmulatedArray`), the `.cu` kernels compiled by the host compiler and run with every
CUDA thread a fiber (`EmulatedModule`), one stream whose launches complete before they
return, graph capture by recording (gpuplan.emulator.capture). The compute capability is
that of the sm_80 part whose PTX it executes (mma.sync, ldmatrix, cp.async)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpuplan.devices import Device
from gpuplan.emulator import array, capture
from gpuplan.emulator.device import EmulatedModule
from gpuplan.emulator.stream import EmulatedStream

#: The compute capability of the part the emulated device executes the PTX of.
COMPUTE_CAPABILITY = 80


class EmulatedDevice(Device):
    name = "emulated"
    has_cublas = False
    device_id = array.DEVICE_ID

    def __init__(self) -> None:
        self.stream = EmulatedStream()  # the device's only stream

    def array_type(self) -> type:
        return array.EmulatedArray

    def namespace(self) -> Any:
        return array.namespace

    def compute_capability(self, device_id: int | None) -> str:
        return str(COMPUTE_CAPABILITY)

    def capture_active(self, stream: Any) -> Any:
        return capture.active()

    def upload(self, stream: Any, dst: Any, host: np.ndarray) -> None:
        cap = capture.active()
        if cap is None:
            np.copyto(dst.view(np.ndarray), host)
            return
        snap = host.copy()  # the graph owns the snapshot: replays read these values
        target = dst.view(np.ndarray)
        cap.keep.append(snap)
        cap.record("upload", lambda: np.copyto(target, snap), (dst,))

    def load_module(self, path: Path, name_expressions: tuple[str, ...],
                    options: tuple[str, ...], device_id: int) -> Any:
        return EmulatedModule(path, name_expressions, options)

    def launch(self, stream: Any, kernel: Any, grid: tuple, block: tuple, args: tuple,
               shared_mem: int, reachable: Any) -> None:
        kernel(grid, block, args, shared_mem=shared_mem, reachable=reachable)
