"""Arrays of the emulated device: host memory, marked as device memory.

`EmulatedArray` is an ndarray subclass, so NumPy operations work on it and keep it on the
emulated device (as CuPy operations keep arrays on a GPU), while plans see a device array
and run their CUDA path. As with CuPy, mixing it with a host array in one NumPy call or
assigning a host array into it raises TypeError (strict mode; GPUPLAN_EMULATOR_STRICT=0
turns it off). Like `cupy.ndarray` it has ``.get()`` (a host copy), ``.set()``,
``.device`` and ``.data.ptr``. Allocations made through `namespace` are 256-byte aligned,
as cudaMalloc's are, so the kernels' vectorized paths see the alignment a GPU gives them.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from gpuplan.devices import EMULATED_DEVICE_ID as DEVICE_ID
from gpuplan.emulator import capture as _capture

_ALIGN = 256


class _Device:
    id = DEVICE_ID

    def __repr__(self) -> str:
        return "<emulated device>"

    def synchronize(self) -> None:
        return None


class _Data:
    """``a.data`` as CuPy has it: ``.ptr`` is the address of the first element."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class EmulatedArray(np.ndarray):
    """An ndarray living on the emulated device.

    While the emulated stream captures a graph, its array operations are recorded rather
    than run, and host reads refuse (gpuplan.emulator.capture); otherwise they are NumPy's.
    """

    device = _Device()

    @property
    def data(self) -> _Data:  # type: ignore[override]
        return _Data(self.ctypes.data)

    def get(self, stream: Any = None, out: np.ndarray | None = None) -> np.ndarray:
        """A host (NumPy) copy, as cupy.ndarray.get()."""
        host = np.array(self, copy=True, subok=False)
        if out is not None:
            out[...] = host
            return out
        return host

    def set(self, arr: Any, stream: Any = None) -> None:
        """Copy host data in, as cupy.ndarray.set()."""
        self.view(np.ndarray)[...] = np.asarray(arr).reshape(self.shape)

    def __repr__(self) -> str:
        return "emulated " + repr(np.asarray(self))

    def __reduce__(self):  # pickles as a host array (as CuPy arrays do not pickle to devices)
        return np.asarray(self).__reduce__()


def empty(shape: Any, dtype: Any = float, order: str = "C") -> EmulatedArray:
    """A 256-byte aligned uninitialized emulated array."""
    dt = np.dtype(dtype)
    shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(nbytes + _ALIGN, dtype=np.uint8)
    off = (-raw.ctypes.data) % _ALIGN
    flat = raw[off:off + nbytes].view(dt)
    out = flat.reshape(shape, order=order) if order in ("C", "F") else flat.reshape(shape)
    _capture.allocated(raw)
    return out.view(EmulatedArray)


# -- graph capture: while the emulated stream captures, these methods replace NumPy's on
# EmulatedArray (installed by set_capture_hooks, so arrays cost nothing extra otherwise):
# stream work is recorded (see _captured), host reads and pageable copies refuse.


def _plain(x: Any) -> Any:
    if isinstance(x, EmulatedArray):
        return x.view(np.ndarray)
    if isinstance(x, tuple):
        return tuple(_plain(v) for v in x)
    if isinstance(x, list):
        return [_plain(v) for v in x]
    return x


def _ufunc(self: EmulatedArray, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
    out = kwargs.get("out")

    def run(*ins: Any, **kw: Any) -> Any:
        kw = {k: _plain(v) for k, v in kw.items()}
        r = getattr(ufunc, method)(*_plain(ins), **kw)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return r

    name = f"numpy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
    return _captured(name, run, inputs, kwargs)


def _function(self: EmulatedArray, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
    return _captured(f"numpy.{func.__name__}",
                     lambda *a, **k: func._implementation(*a, **k), tuple(args), dict(kwargs))


def _refusing(what: str) -> Any:
    def method(self: EmulatedArray, *args: Any, **kwargs: Any) -> Any:
        raise _capture.refuse(what)
    return method


def _recording(name: str) -> Any:
    base = getattr(np.ndarray, name)

    def method(self: EmulatedArray, *args: Any, **kwargs: Any) -> Any:
        return _captured(f"ndarray.{name}", lambda *a, **k: base(*a, **k), (self, *args), kwargs)
    return method


def _bool_mask(key: Any) -> bool:
    """Whether an index holds a boolean array (a mask) of at least one dimension."""
    parts = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, np.ndarray) and k.dtype == np.bool_ and k.ndim > 0 for k in parts)


_MASK = ("boolean-mask indexing (CuPy sizes a mask's selection on the host: a sync; use a "
         "select such as gpuplan.functional.where)")


def _getitem(self: EmulatedArray, key: Any) -> Any:
    """Indexing as CuPy does it: a single element is a 0-d device array (reading it is a
    host read); a view needs no stream work; a gather (fancy index) is recorded; a boolean
    mask is refused (CuPy reads the mask's count back to size the result)."""
    if _bool_mask(key):
        raise _capture.refuse(f"ndarray.__getitem__ with {_MASK}")
    r = np.ndarray.__getitem__(self, key)
    if isinstance(r, np.generic):  # the same element as a 0-d view
        return np.ndarray.__getitem__(self, (*(key if isinstance(key, tuple) else (key,)),
                                             Ellipsis))
    if isinstance(r, np.ndarray) and _capture._root(r) is _capture._root(self):
        return r
    return _captured("ndarray.__getitem__", lambda *a: np.ndarray.__getitem__(*a), (self, key),
                     {})


def _setitem(self: EmulatedArray, key: Any, value: Any) -> None:
    """Assignment as CuPy does it: recorded stream work, except through a boolean mask
    (a host sync on a GPU), which is refused."""
    if _bool_mask(key):
        raise _capture.refuse(f"ndarray.__setitem__ with {_MASK}")
    _captured("ndarray.__setitem__", lambda *a: np.ndarray.__setitem__(*a), (self, key, value),
              {})


_CAPTURE_HOOKS = {
    "__getitem__": _getitem,
    "__array_ufunc__": _ufunc,
    "__array_function__": _function,
    "__setitem__": _setitem,
    "fill": _recording("fill"),
    "copy": _recording("copy"),
    "astype": _recording("astype"),
    "get": _refusing("reading a device array to the host (get / gpuplan.to_host)"),
    "set": _refusing("ndarray.set (a copy from pageable host memory)"),
    "item": _refusing("reading a device value on the host (item())"),
    "tolist": _refusing("reading device values on the host (tolist())"),
    "__float__": _refusing("reading a device value on the host (float())"),
    "__int__": _refusing("reading a device value on the host (int())"),
    "__bool__": _refusing("reading a device value on the host (bool(), e.g. an if on it)"),
    "__index__": _refusing("reading a device value on the host (used as an index)"),
}
_SAVED: dict[str, Any] = {}


def set_capture_hooks(on: bool) -> None:
    """Install (on) or remove the capture behaviour of EmulatedArray's methods."""
    for name, hook in _CAPTURE_HOOKS.items():
        if on:
            if name in EmulatedArray.__dict__:
                _SAVED[name] = EmulatedArray.__dict__[name]
            setattr(EmulatedArray, name, hook)
        elif name in _SAVED:
            setattr(EmulatedArray, name, _SAVED.pop(name))
        else:
            delattr(EmulatedArray, name)


# -- strict mode (on unless GPUPLAN_EMULATOR_STRICT=0): outside captures too, NumPy calls
# that mix an EmulatedArray with a host array (more than a scalar), and host arrays assigned
# into an EmulatedArray, raise TypeError as CuPy does for its arrays (no implicit host <->
# device copies), so code that would fail on a GPU fails here. What it cannot see:
# np.asarray(emulated) gives a host view silently (CuPy raises), as an ndarray subclass
# reaches NumPy's C conversion without a hook.


def _host_operands(x: Any) -> list:
    return [a for a in _arrays(x) if not isinstance(a, EmulatedArray) and a.ndim > 0]


def _strict_refuse(what: str, host: list) -> TypeError:
    shapes = ", ".join(str(a.shape) for a in host[:3])
    return TypeError(f"{what}: a host NumPy array (shape {shapes}) with an emulated-device "
                     f"array; CuPy refuses implicit host-device mixing (copy it with "
                     f"gpuplan.to_device / to_host first)")


def _strict_ufunc(self: EmulatedArray, ufunc: Any, method: str, *inputs: Any,
                  **kwargs: Any) -> Any:
    out = kwargs.get("out")
    host = _host_operands((inputs, out or ()))
    if host:
        raise _strict_refuse(f"numpy.{ufunc.__name__}", host)
    r = getattr(ufunc, method)(*_plain(inputs), **{k: _plain(v) for k, v in kwargs.items()})
    if out is not None:
        return out[0] if len(out) == 1 else out
    return _to_emulated(r)  # as NumPy wraps a subclass's results; scalars stay scalars


def _strict_function(self: EmulatedArray, func: Any, types: Any, args: Any,
                     kwargs: Any) -> Any:
    host = _host_operands((args, kwargs))
    if host:
        raise _strict_refuse(f"numpy.{func.__name__}", host)
    return np.ndarray.__array_function__(self, func, types, args, kwargs)


def _strict_setitem(self: EmulatedArray, key: Any, value: Any) -> None:
    if isinstance(value, np.ndarray) and not isinstance(value, EmulatedArray) and value.ndim:
        raise _strict_refuse("ndarray.__setitem__", [value])
    np.ndarray.__setitem__(self, key, value)


_STRICT_HOOKS = {"__array_ufunc__": _strict_ufunc, "__array_function__": _strict_function,
                 "__setitem__": _strict_setitem}


def set_strict(on: bool) -> None:
    """Install (on) or remove strict mode's methods on EmulatedArray (capture hooks, when
    installed, take precedence: they are installed after and saved these)."""
    for name, hook in _STRICT_HOOKS.items():
        if on:
            setattr(EmulatedArray, name, hook)
        elif EmulatedArray.__dict__.get(name) is hook:
            delattr(EmulatedArray, name)


def _arrays(x: Any) -> list:
    if isinstance(x, np.ndarray):
        return [x]
    if isinstance(x, (tuple, list)):
        return [a for v in x for a in _arrays(v)]
    if isinstance(x, dict):
        return [a for v in x.values() for a in _arrays(v)]
    return []


def _captured(what: str, op: Any, args: tuple, kwargs: dict) -> Any:
    """Run array operation `op` while capturing: on a GPU it is stream work (a CuPy
    kernel), so it is recorded to run again at every replay. It runs once now to give its
    results their shapes and memory (the values are those of unexecuted work: meaningless
    until a replay); a replay recomputes and writes the same memory. Host arrays among the
    operands (pageable copies) and host results (values read back) are refused."""
    for a in _arrays((args, kwargs)):
        if not isinstance(a, EmulatedArray) and a.ndim > 0:
            raise _capture.refuse(f"{what} with a host NumPy array operand (a copy from "
                                  f"pageable host memory)")
    with np.errstate(all="ignore"):
        result = op(*args, **kwargs)
    many = isinstance(result, tuple)
    outs = list(result) if many else [result]
    if any(r is not None and not isinstance(r, (np.ndarray, np.generic)) for r in outs):
        raise _capture.refuse(f"{what} returning a host value (a device value read back)")
    # A scalar result is a 0-d device array (what NumPy gives EmulatedArray, and CuPy gives).
    outs = [np.asarray(r).view(EmulatedArray) if isinstance(r, np.generic) else
            r.view(EmulatedArray) if type(r) is np.ndarray else r for r in outs]
    fresh = [k for k, r in enumerate(outs)
             if isinstance(r, np.ndarray) and not _shares(r, args, kwargs)]
    captured = {k: outs[k].view(np.ndarray) for k in fresh}

    def replay() -> None:
        with np.errstate(all="ignore"):
            again = op(*args, **kwargs)
        again = again if many else (again,)
        for k, dst in captured.items():
            np.copyto(dst, np.asarray(again[k]).view(np.ndarray), casting="unsafe")

    _capture._ACTIVE.record(what, replay,
                            tuple(_arrays((args, kwargs))) + tuple(outs[k] for k in fresh))
    return tuple(outs) if many else outs[0]


def _shares(r: np.ndarray, args: tuple, kwargs: dict) -> bool:
    """True when `r` is an operand or a view of one (no new memory to fill at replay)."""
    owner = _capture._root(r)
    return any(_capture._root(a) is owner for a in _arrays((args, kwargs)))


def asarray(a: Any, dtype: Any = None, order: Any = None, copy: bool | None = None) -> Any:
    """`a` on the emulated device (no copy when it already is one of the right dtype)."""
    if isinstance(a, EmulatedArray) and (dtype is None or a.dtype == np.dtype(dtype)) \
            and copy is not True:
        return a
    if isinstance(a, EmulatedArray):  # a device copy (stream work while capturing)
        out = empty(a.shape, a.dtype if dtype is None else dtype)
        out[...] = a
        return out
    if hasattr(a, "get") and not isinstance(a, np.ndarray):  # a CuPy array
        a = a.get()
    host = np.asarray(a, dtype=dtype)
    out = empty(host.shape, host.dtype)
    if _capture.active() is None:
        out.view(np.ndarray)[...] = host  # the upload itself (allowed in strict mode)
    else:
        out[...] = host  # the capture hook refuses it: a pageable copy
    return out


class _Namespace:
    """``numpy`` for emulated arrays: array-returning functions return EmulatedArrays."""

    __name__ = "gpuplan.emulator.namespace"
    ndarray = EmulatedArray

    def empty(self, shape: Any, dtype: Any = float, order: str = "C") -> EmulatedArray:
        return empty(shape, dtype, order)

    def zeros(self, shape: Any, dtype: Any = float) -> EmulatedArray:
        out = empty(shape, dtype)
        out.fill(0)
        return out

    def ones(self, shape: Any, dtype: Any = float) -> EmulatedArray:
        return self.full(shape, 1, dtype)

    def full(self, shape: Any, fill_value: Any, dtype: Any = None) -> EmulatedArray:
        dt = np.asarray(fill_value).dtype if dtype is None else dtype
        out = empty(shape, dt)
        out.fill(fill_value)
        return out

    def empty_like(self, a: Any, dtype: Any = None) -> EmulatedArray:
        return empty(np.shape(a), a.dtype if dtype is None else dtype)

    def zeros_like(self, a: Any, dtype: Any = None) -> EmulatedArray:
        return self.zeros(np.shape(a), a.dtype if dtype is None else dtype)

    def full_like(self, a: Any, fill_value: Any, dtype: Any = None) -> EmulatedArray:
        return self.full(np.shape(a), fill_value, a.dtype if dtype is None else dtype)

    def asarray(self, a: Any, dtype: Any = None, order: Any = None) -> Any:
        return asarray(a, dtype)

    def array(self, a: Any, dtype: Any = None, copy: bool = True, order: str = "K") -> Any:
        return asarray(a, dtype, copy=copy)

    def ascontiguousarray(self, a: Any, dtype: Any = None) -> Any:
        if isinstance(a, EmulatedArray) and a.flags.c_contiguous and \
                (dtype is None or a.dtype == np.dtype(dtype)):
            return a
        if isinstance(a, EmulatedArray):  # a device copy; 0-d becomes (1,) as in NumPy
            return asarray(a if a.ndim else a.reshape(1), dtype, copy=True)
        return asarray(np.ascontiguousarray(np.asarray(a), dtype=dtype))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(np, name)
        if not callable(attr) or isinstance(attr, type):
            return attr
        return _wrap(attr)


def _to_emulated(r: Any) -> Any:
    if isinstance(r, np.ndarray) and not isinstance(r, EmulatedArray):
        return r.view(EmulatedArray)
    if isinstance(r, tuple):
        return tuple(_to_emulated(x) for x in r)
    return r


@functools.cache
def _wrap(fn: Any) -> Any:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return _to_emulated(fn(*args, **kwargs))
    return call


namespace = _Namespace()

if os.environ.get("GPUPLAN_EMULATOR_STRICT", "1") != "0":
    set_strict(True)
