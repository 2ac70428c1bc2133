"""Kernels on the emulated device: modules built by `build`, loaded with ctypes, launched with
CuPy's RawKernel calling convention ``kernel(grid, block, args, shared_mem=...)``.

Arguments are packed as a CUDA launch packs them (one pointer per parameter value) and
checked against the kernel's parameter list, which the module's entry table gives: arrays
for pointer parameters, and scalars whose type and size fit the parameter (a float64 given
for a ``float`` parameter is refused: a GPU would read half of its bytes).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpuplan.emulator import build, capture
from gpuplan.emulator.array import EmulatedArray

#: Parameter kinds (emu_abi.h).
POINTER, INT, UINT, FLOAT, BOOL, OTHER = 1, 2, 3, 4, 5, 6
_KIND_NAMES = {POINTER: "pointer", INT: "signed integer", UINT: "unsigned integer",
               FLOAT: "floating-point", BOOL: "bool", OTHER: "struct"}
#: An sm_80 device: 48 KiB of dynamic shared memory by default, 163 KiB when opted in.
DEFAULT_DYNAMIC_SMEM = 48 * 1024
MAX_DYNAMIC_SMEM = 166912

_LOCK = threading.RLock()
_RUNTIME: ctypes.CDLL | None = None


class KernelFault(RuntimeError):
    """A kernel did something undefined on the emulated device (the message says what, in
    which kernel, block and thread): out-of-bounds access, divergent warp collective,
    partial mask, deadlock, __trap(). The launch stops; other launches are unaffected."""


class LaunchError(ValueError):
    """A launch the CUDA driver would refuse (bad grid/block, arguments, shared memory)."""


class _Entry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("invoke", ctypes.c_void_p),
                ("nparams", ctypes.c_int), ("sizes", ctypes.POINTER(ctypes.c_int)),
                ("kinds", ctypes.POINTER(ctypes.c_int))]


def runtime() -> ctypes.CDLL:
    """The emulator runtime library, loaded once with global symbols for the modules."""
    global _RUNTIME
    with _LOCK:
        if _RUNTIME is None:
            lib = ctypes.CDLL(str(build.build_runtime()), mode=ctypes.RTLD_GLOBAL)
            lib.emu_launch.restype = ctypes.c_int
            lib.emu_launch.argtypes = [
                ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint),
                ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p),
                ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
            _RUNTIME = lib
        return _RUNTIME


class EmulatedModule:
    """One `.cu` file compiled for the emulated device (the RawModule counterpart)."""

    def __init__(self, path: Path, name_expressions: Sequence[str],
                 options: Sequence[str] = ()) -> None:
        runtime()
        self.path = Path(path)
        self.library = build.build_module(self.path, list(name_expressions), list(options))
        self._lib = ctypes.CDLL(str(self.library))
        get = self._lib.emu_module_entries
        get.restype = ctypes.POINTER(_Entry)
        get.argtypes = [ctypes.POINTER(ctypes.c_int)]
        n = ctypes.c_int()
        table = get(ctypes.byref(n))
        self._kernels: dict[str, EmulatedKernel] = {}
        for i in range(n.value):
            e = table[i]
            params = [(e.sizes[j], e.kinds[j]) for j in range(e.nparams)]
            name = e.name.decode()
            self._kernels[name] = EmulatedKernel(self, name, ctypes.addressof(e), params)

    def get_function(self, name_expression: str) -> EmulatedKernel:
        try:
            return self._kernels[name_expression]
        except KeyError:
            raise KeyError(f"{self.path.name}: no emulated kernel {name_expression!r}") from None


def _dims(v: Any, what: str, kernel: str) -> tuple[int, int, int]:
    t = tuple(int(x) for x in v) if isinstance(v, (tuple, list)) else (int(v),)
    if not 1 <= len(t) <= 3:
        raise LaunchError(f"kernel {kernel}: {what}: expected 1 to 3 extents, given {v!r}")
    return t + (1,) * (3 - len(t))


_KERNELS: weakref.WeakSet = weakref.WeakSet()


def reset_schedules() -> None:
    """Restart every kernel's sequence of launch schedules as at process start, so that a
    run after this call interleaves threads (and orders atomics) exactly as an earlier run
    did after its own call: two runs of one job in one process compare bit for bit."""
    for kernel in list(_KERNELS):
        kernel.launches = 0


def _seed(kernel: EmulatedKernel) -> int:
    """The launch's schedule seed: GPUPLAN_EMULATOR_SEED, the kernel and how many times this
    kernel has launched in this process (so a test's schedules do not depend on the tests
    that ran before it launching other kernels)."""
    kernel.launches += 1
    base = int(os.environ.get("GPUPLAN_EMULATOR_SEED", "0"))
    name = int.from_bytes(hashlib.blake2b(kernel.name.encode(), digest_size=8).digest(), "little")
    return (base * 0x9E3779B97F4A7C15 + name + kernel.launches * 0xBF58476D1CE4E5B9) % 2**64


class EmulatedKernel:
    """A kernel instance of an emulated module, called like a CuPy RawKernel."""

    def __init__(self, module: EmulatedModule, name: str, entry: int,
                 params: list[tuple[int, int]]) -> None:
        self.module = module
        self.name = name
        self._entry = entry
        self.params = params
        self.launches = 0
        self.max_dynamic_shared_size_bytes = DEFAULT_DYNAMIC_SMEM
        _KERNELS.add(self)

    def __setattr__(self, key: str, value: Any) -> None:
        if key == "max_dynamic_shared_size_bytes" and not 0 <= int(value) <= MAX_DYNAMIC_SMEM:
            raise LaunchError(f"kernel {self.name}: max_dynamic_shared_size_bytes: expected "
                              f"0..{MAX_DYNAMIC_SMEM} (sm_80), given {value}")
        object.__setattr__(self, key, value)

    def __repr__(self) -> str:
        return f"<EmulatedKernel {self.name} ({len(self.params)} parameters)>"

    def _pack(self, i: int, a: Any, size: int, kind: int, regions: list) -> ctypes._SimpleCData:
        def refuse(given: str) -> LaunchError:
            return LaunchError(f"kernel {self.name}: argument {i}: expected a value for a "
                               f"{size}-byte {_KIND_NAMES[kind]} parameter, given {given}")

        if kind == POINTER:
            if a is None:
                return ctypes.c_uint64(0)
            if isinstance(a, EmulatedArray):
                ptr = a.ctypes.data
                regions.append((ptr, a.nbytes, i))
                return ctypes.c_uint64(ptr)
            if isinstance(a, np.ndarray):
                raise refuse("a host NumPy array (kernels on the emulated device take "
                             "emulated arrays: gpuplan.to_device(a, 'emulated'))")
            if isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_)):
                return ctypes.c_uint64(int(a) % 2**64)  # a raw address
            raise refuse(type(a).__name__)
        if kind in (INT, UINT, BOOL):
            if isinstance(a, (bool, np.bool_)):
                value = int(a)
            elif isinstance(a, np.integer) and a.dtype.itemsize < size and a < 0:
                # CuPy stores a NumPy scalar at its own width in zeroed storage: a GPU
                # would read this negative value zero-extended, i.e. as a large positive one.
                raise refuse(f"a negative {a.dtype} scalar {a!r} ({a.dtype.itemsize} bytes: "
                             f"CuPy zero-extends it; pass an int{8 * size} or a Python int)")
            elif isinstance(a, (int, np.integer)):
                value = int(a)
            else:
                raise refuse(f"{type(a).__name__} {a!r}")
            lo, hi = (0, 2 ** (8 * size) - 1) if kind != INT else \
                (-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1)
            if not lo <= value <= hi:
                raise refuse(f"{value}, which does not fit")
            ctype = {1: ctypes.c_uint8, 2: ctypes.c_uint16, 4: ctypes.c_uint32,
                     8: ctypes.c_uint64}[size]
            return ctype(value % 2 ** (8 * size))
        if kind == FLOAT:
            if isinstance(a, np.floating):
                if a.dtype.itemsize != size:
                    raise refuse(f"a {a.dtype} scalar ({a.dtype.itemsize} bytes)")
                return ctypes.c_float(a) if size == 4 else ctypes.c_double(a)
            if isinstance(a, float):  # CuPy passes Python floats as double
                if size != 8:
                    raise refuse("a Python float (passed as an 8-byte double)")
                return ctypes.c_double(a)
            raise refuse(f"{type(a).__name__} {a!r}")
        raw = bytes(a) if isinstance(a, (bytes, np.void)) else None
        if raw is None or len(raw) != size:
            raise refuse(type(a).__name__)
        return ctypes.create_string_buffer(raw, size)

    def __call__(self, grid: Any, block: Any, args: Sequence[Any], shared_mem: int = 0,
                 stream: Any = None, reachable: Sequence[Any] = ()) -> None:
        """Launch; `reachable` names arrays the kernel reaches through pointer tables."""
        g3, b3 = _dims(grid, "grid", self.name), _dims(block, "block", self.name)
        if len(args) != len(self.params):
            raise LaunchError(f"kernel {self.name}: expected {len(self.params)} arguments, "
                              f"given {len(args)}")
        if not 0 <= shared_mem <= self.max_dynamic_shared_size_bytes:
            raise LaunchError(f"kernel {self.name}: shared_mem: expected 0.."
                              f"{self.max_dynamic_shared_size_bytes} bytes (raise "
                              f"max_dynamic_shared_size_bytes first), given {shared_mem}")
        regions: list[tuple[int, int, int]] = []
        values = [self._pack(i, a, size, kind, regions)
                  for i, (a, (size, kind)) in enumerate(zip(args, self.params, strict=True))]
        for extra in reachable:
            if isinstance(extra, EmulatedArray):
                regions.append((extra.ctypes.data, extra.nbytes, -1))
        cap = capture.active()
        if cap is not None:  # recorded with these argument values, run at every replay
            cap.record(f"kernel {self.name}",
                       lambda: self._launch(g3, b3, shared_mem, values, regions),
                       tuple(a for a in (*args, *reachable) if isinstance(a, EmulatedArray)))
            return
        self._launch(g3, b3, shared_mem, values, regions)

    def _launch(self, g3: tuple, b3: tuple, shared_mem: int, values: list,
                regions: list) -> None:
        ptrs = (ctypes.c_void_p * max(1, len(values)))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        flat = (ctypes.c_uint64 * max(1, 2 * len(regions)))(
            *[x for r in regions for x in r[:2]])
        which = (ctypes.c_int * max(1, len(regions)))(*[r[2] for r in regions])
        err = ctypes.create_string_buffer(2048)
        with _LOCK:
            rc = runtime().emu_launch(
                self._entry, (ctypes.c_uint * 3)(*g3), (ctypes.c_uint * 3)(*b3),
                int(shared_mem), ptrs, flat, which, len(regions), _seed(self), err, len(err))
        if rc == 2:
            raise LaunchError(err.value.decode(errors="replace"))
        if rc != 0:
            raise KernelFault(err.value.decode(errors="replace"))
