"""Lazy, per-device cache of NVRTC-compiled kernel modules read from package `.cu` files.

Each op family declares one `CudaModule` at import time (no compilation then): the `.cu`
file beside its Python module and the full list of template instances it launches
(`name_expressions`). The first `function()` call on a device compiles the module with
`cupy.RawModule` (CuPy caches the binary on disk as well), or, for the emulated device, with
the host compiler: the device compiles it (`gpuplan.devices.Device.load_module`).
`scripts/check_kernels.py` walks `registry()` to compile every instance for sm_80 and sm_90
without a GPU, and with ``--execute`` to run every instance on the emulated device.

CuPy's disk cache key ignores headers found through ``-I``, so the options carry a hash of
every header the module includes (``-DGPUPLAN_HEADERS=<sha>``): editing a `.cuh` recompiles.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gpuplan import backend, devices

#: The CUDA headers the families share (gpuplan_common.cuh, ...).
INCLUDE_DIR = Path(__file__).resolve().parent / "ops" / "include"
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
#: Options we add to CuPy's own (CuPy adds --std=c++17, its include paths and -arch).
COMPILE_OPTIONS: tuple[str, ...] = ("--std=c++17", "-DGPUPLAN_NVRTC=1")

_REGISTRY: list[CudaModule] = []
_LOCK = threading.Lock()
#: (module file, name expression) of every kernel instance launch() has launched in this
#: process (what `scripts/check_kernels.py --execute` counts), and the name of each
#: compiled function.
LAUNCHED: set[tuple[str, str]] = set()
_NAMES: dict[int, tuple[str, str]] = {}


class CudaModule:
    """One `.cu` file of templated kernels and the instances of them the plans use."""

    def __init__(self, anchor: str, filename: str, name_expressions: Sequence[str],
                 options: Sequence[str] = (), enums: dict[str, Sequence[str]] | None = None
                 ) -> None:
        self.path = Path(anchor).with_name(filename)
        self.name_expressions = tuple(dict.fromkeys(name_expressions))
        # The family's folder and the shared headers' folder are on the include path.
        self._base_options = (COMPILE_OPTIONS + (f"-I{self.path.parent}", f"-I{INCLUDE_DIR}")
                              + tuple(options)
                              + enum_options(enums or {}))
        self._options: tuple[str, ...] | None = None
        self._modules: dict[int, Any] = {}
        self._functions: dict[tuple[int, str], Any] = {}
        _REGISTRY.append(self)

    def source(self) -> str:
        return self.path.read_text()

    @property
    def options(self) -> tuple[str, ...]:
        """Compile options, ending with -DGPUPLAN_HEADERS=<hash of the included headers>."""
        if self._options is None:
            self._options = self._base_options + (f"-DGPUPLAN_HEADERS={self.headers_hash()}",)
        return self._options

    def headers(self) -> list[Path]:
        """Every header included with quotes, found beside the .cu file or in the shared
        headers' folder (recursively), as the compiler finds them."""
        seen: dict[Path, None] = {}
        todo = [self.path]
        while todo:
            for inc in _INCLUDE_RE.findall(todo.pop().read_text()):
                for d in (self.path.parent, INCLUDE_DIR):
                    p = d / inc
                    if p.is_file():
                        if p not in seen:
                            seen[p] = None
                            todo.append(p)
                        break
        return list(seen)

    def headers_hash(self) -> str:
        h = hashlib.sha256()
        for p in sorted(self.headers()):
            h.update(p.name.encode() + b"\0" + p.read_bytes())
        return h.hexdigest()[:16]

    def function(self, name_expression: str, device_id: int) -> Any:
        """The compiled kernel `name_expression` on device `device_id` (compiled on first use)."""
        key = (device_id, name_expression)
        fn = self._functions.get(key)
        if fn is not None:
            return fn
        if name_expression not in self.name_expressions:
            raise KeyError(f"{self.path.name}: kernel {name_expression!r} is not among the "
                           f"declared name_expressions")
        with _LOCK:
            device = devices.for_device_id(device_id)
            mod = self._modules.get(device_id)
            if mod is None:
                mod = self._modules[device_id] = device.load_module(
                    self.path, self.name_expressions, self.options, device_id)
            if device.name == "cuda":  # a RawKernel is fetched with its device current
                with backend.cupy_module().cuda.Device(device_id):
                    fn = mod.get_function(name_expression)
            else:
                fn = mod.get_function(name_expression)
            self._functions[key] = fn  # held: its id in _NAMES stays its own
            _NAMES[id(fn)] = (self.path.name, name_expression)
        return fn

    def __repr__(self) -> str:
        return f"CudaModule({self.path.name}, {len(self.name_expressions)} instances)"


def enum_options(enums: dict[str, Sequence[str]]) -> tuple[str, ...]:
    """-D options that give the source its enums from Python tables: for
    ``{"Activation": ("relu", "gelu")}`` the macro ``GPUPLAN_ENUM_Activation`` expands to
    ``RELU = 0, GELU = 1`` (use it as ``enum Activation { GPUPLAN_ENUM_Activation };``), so
    the Python names and the CUDA enumerators come from one table."""
    out = []
    for enum, names in enums.items():
        if not enum.isidentifier():
            raise ValueError(f"enum name {enum!r} is not an identifier")
        items = []
        for i, name in enumerate(names):
            ident = name.upper()
            if not ident.isidentifier():
                raise ValueError(f"enum {enum}: {name!r} is not an identifier")
            items.append(f"{ident}={i}")
        out.append(f"-DGPUPLAN_ENUM_{enum}=" + ",".join(items))
    return tuple(out)


def registry() -> list[CudaModule]:
    """Every CudaModule declared by the imported op families."""
    return list(_REGISTRY)


@contextlib.contextmanager
def on_stream(stream: Any) -> Iterator[None]:
    """Make `stream` current, and its device (CuPy array ops, cuBLAS handles and kernels all
    follow the current device, not the stream's); nothing to do on other devices."""
    if stream.kind != "cuda":
        yield
        return
    with backend.cupy_module().cuda.Device(stream.device_id), stream.cuda_stream:
        yield


def launch(stream: Any, kernel: Any, grid: int | tuple, block: int | tuple, args: tuple,
           shared_mem: int = 0, reachable: Sequence[Any] = ()) -> None:
    """Launch `kernel` on a gpuplan Stream, with the stream's device current.

    `reachable`: arrays the kernel reaches through pointer tables rather than arguments (the
    emulated device's bounds checks allow them; a GPU needs nothing)."""
    grid = grid if isinstance(grid, tuple) else (int(grid),)
    block = block if isinstance(block, tuple) else (int(block),)
    stream.device.launch(stream, kernel, grid, block, args, shared_mem, reachable)
    name = _NAMES.get(id(kernel))
    if name is not None:
        LAUNCHED.add(name)


#: Kernels whose dynamic shared-memory cap was raised, and to how many bytes (the function
#: is held, so that its id is never reused by another).
_SMEM_CAPS: dict[int, tuple[Any, int]] = {}


def allow_dynamic_smem(fn: Any, nbytes: int, device_id: int) -> None:
    """Raise compiled kernel `fn`'s dynamic shared-memory cap to `nbytes` when that is over
    the 48 KB every kernel may use, before its first launch with that much. The attribute is
    set with `device_id` current: a CuPy RawKernel applies it to its function for the
    current device, whatever device it was fetched for."""
    if nbytes <= 48 * 1024 or _SMEM_CAPS.get(id(fn), (None, 0))[1] >= nbytes:
        return
    devices.for_device_id(device_id).allow_dynamic_smem(fn, nbytes, device_id)
    _SMEM_CAPS[id(fn)] = (fn, nbytes)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
