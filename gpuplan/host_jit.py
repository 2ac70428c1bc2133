"""The compiled host kernels (gpuplan.host_kernels, numba), loaded on first use.

`kernels()` returns the kernel module, or None when the host SKUs are to run their NumPy
passes instead: numba is not installed (a ``pip install --no-deps`` machine), it failed to
load (a warning says why, once), GPUPLAN_HOST_JIT=0 is set, or inside `numpy_only()`.
The import (numba, and the kernels' compiled code from numba's on-disk cache, or a compile
of a few seconds the first time) happens at the first host call that can use a kernel, never
at ``import gpuplan``.

Which ops use them, float32 operands only (f64 keeps the NumPy passes and their accuracy):
GELU forward and backward (gpuplan.ops.activation.host, the host GEMM's GELU epilogue, and the
f16/bf16 GELU's float32 blocks), LayerNorm, RMSNorm and residual + LayerNorm, forward and
backward (gpuplan.ops.normalization.host), AdamW (gpuplan.ops.optimizer.adamw_host), the
attention plans' softmax and score gradients (gpuplan.host_kernels_attention, from
gpuplan.ops.attention.host) and the reduce's column sums over leading axes (bias gradients)
and the embedding backward (gpuplan.host_kernels_sums), both loaded through `extra`; and,
float32 and float64, the softmax family's small inputs (`extra("ops.softmax.host_kernels")`).
gpuplan.host_pool's threads poll with `wait_until` before they sleep.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import warnings
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np

_OFF = ("0", "off", "false", "no", "numpy")
_lock = threading.Lock()
_module: ModuleType | None = None
_loaded = False
_numpy_only = 0  # depth of numpy_only() blocks


def kernels() -> ModuleType | None:
    """gpuplan.host_kernels, or None to use the NumPy passes (see the module docstring)."""
    if _numpy_only:
        return None
    if not _loaded:
        _load()
    return _module


def _load() -> None:
    global _module, _loaded
    with _lock:
        if _loaded:
            return
        if os.environ.get("GPUPLAN_HOST_JIT", "").strip().lower() not in _OFF:
            try:
                from gpuplan import host_kernels
            except ModuleNotFoundError as exc:
                if exc.name not in ("numba", "llvmlite"):
                    raise
            except Exception as exc:  # noqa: BLE001 - any numba failure: fall back, say why
                warnings.warn(f"gpuplan: the compiled host kernels failed to load ({exc!r}); "
                              "the host ops run as NumPy passes", RuntimeWarning, stacklevel=3)
            else:
                _module = host_kernels
        _loaded = True


_extra: dict[str, ModuleType | None] = {}
_UNLOADED: Any = object()


def extra(name: str) -> ModuleType | None:
    """gpuplan.<name>, a further kernel module built on gpuplan.host_kernels, when `kernels()`
    is loaded and so is it; None otherwise. A module that fails to load (a numba error)
    warns once, and its ops keep their NumPy passes."""
    loaded = _extra.get(name, _UNLOADED)  # (only ever loaded while kernels() was not None)
    if loaded is not _UNLOADED:
        return None if _numpy_only else loaded
    if kernels() is None:
        return None
    if name not in _extra:
        with _lock:
            if name not in _extra:
                try:
                    module: ModuleType | None = importlib.import_module(f"gpuplan.{name}")
                except Exception as exc:  # noqa: BLE001 - any numba failure: fall back
                    warnings.warn(f"gpuplan: the compiled host kernels of {name} failed to "
                                  f"load ({exc!r}); their ops run as NumPy passes",
                                  RuntimeWarning, stacklevel=2)
                    module = None
                _extra[name] = module
    return _extra[name]


@contextlib.contextmanager
def numpy_only() -> Iterator[None]:
    """In the block, `kernels()` is None: every host op runs its NumPy passes (for tests that
    compare the two paths). Not thread-local: meant for a test's main thread."""
    global _numpy_only
    _numpy_only += 1
    try:
        yield
    finally:
        _numpy_only -= 1


def takes(*arrays: Any) -> bool:
    """Whether the kernels take these arrays (None: an absent operand): float32, C-contiguous
    and aligned, as their signatures declare."""
    return all(a is None or (a.dtype == np.float32 and a.flags.c_contiguous and a.flags.aligned)
               for a in arrays)
