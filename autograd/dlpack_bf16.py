"""DLPack for host bfloat16 arrays, which NumPy neither exports nor imports (its DLPack
covers integer, float and complex dtypes only; ml_dtypes' bfloat16 is none of those to it).

The capsule follows dlpack.h (the unversioned "dltensor" capsule every consumer reads,
PyTorch and JAX included): a DLManagedTensor built with ctypes whose data pointer is the
array's own memory (no copy), the array kept alive until the consumer calls the deleter,
or until the capsule is collected unconsumed. Importing reads a producer's capsule the same
way and wraps its memory as a bfloat16 NumPy array that calls the producer's deleter when
it is collected. Only CPU tensors of dtype code kDLBfloat, 16 bits, 1 lane go through here;
everything else stays with NumPy's and CuPy's own DLPack.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from typing import Any

import numpy as np

from gpuplan.dtypes import bfloat16

#: dlpack.h constants: DLDeviceType kDLCPU, DLDataTypeCode kDLBfloat.
KDL_CPU, KDL_BFLOAT = 1, 4


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                     ("deleter", _DELETER)]

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetContext.restype = ctypes.c_int
_api.PyCapsule_SetContext.argtypes = [ctypes.py_object, ctypes.c_void_p]
_api.PyCapsule_SetDestructor.restype = ctypes.c_int
_api.PyCapsule_SetDestructor.argtypes = [ctypes.py_object, ctypes.c_void_p]
_api.Py_IncRef.restype = None
_api.Py_IncRef.argtypes = [ctypes.py_object]

# The capsule keeps a pointer to its name: these buffers live as long as the module.
_NAME = ctypes.create_string_buffer(b"dltensor")
_USED = ctypes.create_string_buffer(b"used_dltensor")


@functools.lru_cache(maxsize=1)
def _callbacks() -> tuple[Any, Any]:
    """(deleter, capsule destructor): Numba C callbacks compiled on first use (the cache keeps
    them alive; `.address` is the C function pointer).

    They run no Python code: the destructor may run while an exception propagates (a
    consumer that refused the capsule), and the deleter on a thread without the GIL (a
    consumer freeing its tensor). Each drops the one reference `export` took on the holder
    (the DLManagedTensor, its shape and strides, the array): the consumer's deleter call,
    or else the destructor of a capsule nobody consumed."""
    try:
        from numba import cfunc, types
    except ImportError as exc:
        raise BufferError("__dlpack__: exporting bfloat16 needs Numba (pip install numba); "
                          "or export .float()") from exc
    libpython = ctypes.CDLL(None)  # the interpreter's own C API, called without the GIL

    def c(name: str, restype: Any, *argtypes: Any) -> Any:
        fn = getattr(libpython, name)
        fn.restype, fn.argtypes = restype, list(argtypes)
        return fn

    size = ctypes.c_size_t
    decref = c("Py_DecRef", None, size)
    gil_ensure = c("PyGILState_Ensure", ctypes.c_int)
    gil_release = c("PyGILState_Release", None, ctypes.c_int)
    is_valid = c("PyCapsule_IsValid", ctypes.c_int, size, size)
    get_context = c("PyCapsule_GetContext", size, size)
    name = ctypes.addressof(_NAME)
    ctx_word = _Managed.manager_ctx.offset // 8

    @cfunc(types.void(types.CPointer(types.uint64)), nopython=True)
    def deleter(managed):
        state = gil_ensure()
        decref(managed[ctx_word])
        gil_release(state)

    @cfunc(types.void(types.uintp), nopython=True)
    def destructor(capsule):  # runs with the GIL held (the capsule's dealloc)
        if is_valid(capsule, name):  # still "dltensor": nobody consumed it
            decref(get_context(capsule))

    return deleter, destructor


def is_bfloat16(a: Any) -> bool:
    return isinstance(a, np.ndarray) and a.dtype == bfloat16


def export(a: np.ndarray, *, stream: Any = None, max_version: Any = None,
           dl_device: Any = None, copy: bool | None = None) -> Any:
    """A "dltensor" capsule of the host bfloat16 array `a` (its memory unless copy=True);
    the array-API keywords of ``__dlpack__`` are taken as NumPy takes them."""
    del max_version  # an unversioned capsule, which consumers asking for 1.x also accept
    if stream is not None:
        raise BufferError(f"__dlpack__: a host array takes stream=None, given {stream!r}")
    if dl_device is not None and tuple(dl_device) != (KDL_CPU, 0):
        raise BufferError(f"__dlpack__: a host bfloat16 array exports to the CPU (1, 0) "
                          f"only, given dl_device={tuple(dl_device)}")
    if any(s < 0 or s % a.itemsize for s in a.strides):
        # (PyTorch aborts the process on a negative stride): a copy, unless copy=False
        if copy is False:
            raise BufferError(f"__dlpack__: strides {a.strides} (negative, or not whole "
                              f"elements) need a copy, but copy=False was given")
        copy = True
    if not a.flags.writeable and not copy:  # DLPack 0.8 cannot say read-only: as NumPy
        raise BufferError("__dlpack__: a read-only bfloat16 array cannot be exported (DLPack "
                          "has no read-only flag); pass copy=True or copy the array first")
    if copy:
        a = np.array(a, copy=True, order="C")
    ndim = a.ndim
    shape = (ctypes.c_int64 * max(ndim, 1))(*a.shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*(s // a.itemsize for s in a.strides))
    deleter, destructor = _callbacks()
    managed = _Managed()
    t = managed.dl_tensor
    t.data = a.ctypes.data if a.size else None
    t.device = _Device(KDL_CPU, 0)
    t.ndim = ndim
    t.dtype = _DataType(KDL_BFLOAT, 16, 1)
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    holder = (managed, shape, strides, a)
    managed.manager_ctx = id(holder)
    managed.deleter = _DELETER(deleter.address)
    _api.Py_IncRef(holder)  # dropped by the deleter, or by the destructor if unconsumed
    capsule = _api.PyCapsule_New(ctypes.addressof(managed), _NAME, None)
    _api.PyCapsule_SetContext(capsule, id(holder))
    _api.PyCapsule_SetDestructor(capsule, destructor.address)  # only now: the context is set
    return capsule


def _release(managed_address: int) -> None:
    managed = ctypes.cast(managed_address, ctypes.POINTER(_Managed))
    if managed.contents.deleter:
        managed.contents.deleter(managed)


def import_capsule(capsule: Any) -> np.ndarray | None:
    """The bfloat16 host array a "dltensor" capsule describes, sharing its memory (the
    capsule is consumed), or None, untouched, when it is not a CPU bfloat16 tensor."""
    if not _api.PyCapsule_IsValid(capsule, _NAME):
        raise BufferError("from_dlpack: expected an unconsumed \"dltensor\" capsule")
    address = _api.PyCapsule_GetPointer(capsule, _NAME)
    t = ctypes.cast(address, ctypes.POINTER(_Managed)).contents.dl_tensor
    dt = t.dtype
    if t.device.device_type != KDL_CPU or (dt.code, dt.bits, dt.lanes) != (KDL_BFLOAT, 16, 1):
        return None
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] * 2 for i in range(t.ndim))
    else:  # NULL strides: compact row-major
        strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * 2 for i in range(t.ndim))
    size = int(np.prod(shape, dtype=np.int64))
    if size == 0:
        _api.PyCapsule_SetName(capsule, _USED)
        _release(address)
        return np.empty(shape, dtype=bfloat16)
    lo = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides, strict=True))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides, strict=True)) + 2
    start = (t.data or 0) + t.byte_offset + lo
    raw = (ctypes.c_uint8 * (hi - lo)).from_address(start)
    # The producer's memory lives while raw does; not at exit while raw may still be read.
    weakref.finalize(raw, _release, address).atexit = False
    _api.PyCapsule_SetName(capsule, _USED)  # consumed: the finalizer calls the deleter
    flat = np.frombuffer(raw, dtype=np.uint8)  # flat.base is raw
    return np.lib.stride_tricks.as_strided(flat[-lo:].view(bfloat16), shape=shape,
                                           strides=strides)
