"""The emulated device's stream (cupy.cuda.Stream's interface): launches complete before they
return, except while it captures a graph."""

from __future__ import annotations

from typing import Any

from gpuplan.emulator import array as emulated_array
from gpuplan.emulator import capture as emulated_capture


class EmulatedStream:
    """The emulated device's only stream: launches complete before they return, except
    while it captures a graph (cupy.cuda.Stream's capture interface; see
    gpuplan.emulator.capture): then its work is recorded, and end_capture() returns a graph
    whose launch() replays it."""

    ptr = 0

    def __enter__(self) -> EmulatedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def synchronize(self) -> None:
        if emulated_capture.active() is not None:
            raise emulated_capture.refuse("stream synchronize")
        return None

    def begin_capture(self, mode: Any = None) -> None:
        emulated_capture.begin()
        emulated_array.set_capture_hooks(True)  # array operations record from now on

    def end_capture(self) -> emulated_capture.EmulatedGraph:
        capture = emulated_capture.end()
        emulated_array.set_capture_hooks(False)
        return emulated_capture.EmulatedGraph(capture)

    def is_capturing(self) -> bool:
        return emulated_capture.active() is not None
