"""The emulated device: the exact `.cu` kernels run on the host, every CUDA thread a fiber.

``GPUPLAN_DEVICE=emulated`` makes the emulated device *the* device (``device="cuda"``
requests and `gpuplan.Stream.current()` resolve to it); ``device="emulated"`` asks for it
explicitly anywhere a device is accepted. Arrays live in host memory (`EmulatedArray`);
plans select and run their NVRTC SKU with the launch code a GPU would run, and the kernel
is the same source compiled by g++ against an emulation header (see build.py, runtime.cpp).
"""

from gpuplan.emulator.array import DEVICE_ID, EmulatedArray
from gpuplan.emulator.device import (
    EmulatedKernel,
    EmulatedModule,
    KernelFault,
    LaunchError,
    reset_schedules,
)
from gpuplan.emulator.ptx import UnknownInstruction

__all__ = ["DEVICE_ID", "EmulatedArray", "EmulatedKernel", "EmulatedModule", "KernelFault",
           "LaunchError", "UnknownInstruction", "reset_schedules"]
