"""Pinned host buffers, cached per size, through which device arrays reach a host-only MPI."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from gpuplan import backend

_MIN_BYTES = 4096


def _bucket(nbytes: int) -> int:
    """Round up to a power of two (>= 4 KiB) so a few buffers serve many message sizes."""
    size = _MIN_BYTES
    while size < nbytes:
        size *= 2
    return size


class PinnedBufferCache:
    """Page-locked host byte buffers keyed by (slot, rounded size), least recently used first.

    A collective needs at most two live buffers at once (send and receive), so callers ask
    for distinct `slot`s; the same slot and size returns the same memory, which is only
    safe because every call staged through it is blocking (it returns after MPI and the
    copies end): non-blocking ones stage through fresh copies (`stage_to_new_host`).
    """

    def __init__(self, max_entries: int = 8) -> None:
        self.max_entries = max_entries
        self._buffers: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()

    def get(self, nbytes: int, slot: str = "send") -> np.ndarray:
        """A uint8 host array of exactly `nbytes` bytes backed by pinned memory."""
        key = (slot, _bucket(nbytes))
        buf = self._buffers.get(key)
        if buf is None:
            buf = _alloc_pinned(key[1])
            self._buffers[key] = buf
            while len(self._buffers) > self.max_entries:
                self._buffers.popitem(last=False)
        else:
            self._buffers.move_to_end(key)
        return buf[:nbytes]

    def clear(self) -> None:
        self._buffers.clear()

    def __len__(self) -> int:
        return len(self._buffers)


def _alloc_pinned(nbytes: int) -> np.ndarray:
    if not backend.cuda_available():  # the emulated device's arrays are host memory already
        return np.empty(nbytes, dtype=np.uint8)
    cp = backend.cupy_module()
    mem = cp.cuda.alloc_pinned_memory(nbytes)
    return np.frombuffer(mem, dtype=np.uint8, count=nbytes)


def sync_current_stream() -> None:
    """Block until the current CUDA stream is idle: MPI must see finished device data."""
    backend.synchronize()


def device_bytes(a: Any) -> Any:
    """A flat uint8 view of a C-contiguous device array."""
    return a.reshape(-1).view(np.uint8)


def stage_to_host(a: Any, cache: PinnedBufferCache, slot: str) -> np.ndarray:
    """Copy a C-contiguous device array into a pinned buffer; returns the uint8 host view."""
    sync_current_stream()
    host = cache.get(a.nbytes, slot)
    if a.nbytes:
        device_bytes(a).get(out=host)
    return host


def stage_to_device(host: np.ndarray, a: Any) -> None:
    """Copy pinned bytes back into a C-contiguous device array and wait for the copy."""
    if a.nbytes:
        device_bytes(a).set(host)
        sync_current_stream()


def stage_to_new_host(a: Any) -> np.ndarray:
    """A fresh host copy of a C-contiguous device array, made now (for a non-blocking call,
    whose buffer must stay its own until the call completes, so not a cached one)."""
    sync_current_stream()
    host = backend.to_host(a)
    if backend.device_of(a) != "cuda":  # the emulated device's to_host may be a view
        host = np.array(host, copy=True)
    return host


def copy_to_device(host: np.ndarray, a: Any) -> None:
    """Copy a host array into the C-contiguous device array `a` (same dtype and size) and
    wait for the copy."""
    if a.nbytes:
        stage_to_device(np.ascontiguousarray(host).reshape(-1).view(np.uint8), a)
