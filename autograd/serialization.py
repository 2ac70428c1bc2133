"""Save and load named tensors as safetensors files (any of our dtypes, bf16 included)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

import gpuplan as gp
from autograd.tensor import Tensor
from gpuplan.confined_write import atomic_write
from gpuplan.dtypes import as_dtype, bfloat16

# safetensors' dtype codes for the dtypes a state dict of ours can hold. safetensors.numpy
# writes bf16 but cannot read it back, so reading goes through safetensors' byte-level API.
_CODES: dict[np.dtype, str] = {
    np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
    bfloat16: "BF16", np.dtype(np.int64): "I64", np.dtype(np.int32): "I32",
    np.dtype(np.int16): "I16", np.dtype(np.int8): "I8", np.dtype(np.uint64): "U64",
    np.dtype(np.uint32): "U32", np.dtype(np.uint16): "U16", np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL",
}
_DTYPES = {code: dtype for dtype, code in _CODES.items()}


def _host_array(name: str, value: Any) -> np.ndarray:
    """`value` (Tensor, host or device array) as a contiguous host array, checked."""
    if isinstance(value, Tensor):
        value = value.data
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise TypeError(f"autograd.save: entry {name!r} must be a Tensor or an array, given "
                        f"{type(value).__name__}")
    array = gp.to_host(value)
    if not array.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
        array = np.ascontiguousarray(array)
    if as_dtype(array.dtype) not in _CODES:
        raise TypeError(f"autograd.save: entry {name!r} has dtype {array.dtype}, expected one "
                        f"of {sorted(d.name for d in _CODES)}")
    return array


def save(state_dict: Mapping[str, Any], path: str | os.PathLike,
         metadata: Mapping[str, str] | None = None) -> None:
    """Write `state_dict` (name -> Tensor or host/device array) to the safetensors file `path`.

    Values are stored bit-exactly in their own dtype (float64/32/16, bfloat16, ints, bool);
    `metadata` is a str -> str mapping kept in the file's header. Every entry is checked
    before anything is written, so a bad one leaves no file behind.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"autograd.save: state_dict must be a mapping of names to tensors, "
                        f"given {type(state_dict).__name__}")
    meta = dict(metadata or {})
    bad = [k for k, v in meta.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise TypeError(f"autograd.save: metadata must map str to str, given {bad[0]!r}: "
                        f"{type(meta[bad[0]]).__name__}")
    arrays: dict[str, np.ndarray] = {}
    for name, value in state_dict.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"autograd.save: names must be non-empty strings, given {name!r}")
        arrays[name] = _host_array(name, value)
    import safetensors.numpy  # imported on use: `import autograd` must not need it

    # all or nothing, through a fresh exclusive temporary file: never a link planted there
    atomic_write(Path(path), safetensors.numpy.save(arrays, metadata=meta or None))


def load(path: str | os.PathLike, device: str | None = None) -> dict[str, Tensor]:
    """The tensors of the safetensors file `path` by name (in the file's order), as torch.load
    gives back what was saved: leaf Tensors on `device` (None or "cpu": the host). The raw
    arrays (and the metadata) come from `read_safetensors`."""
    return {name: Tensor(a) for name, a in read_safetensors(path, device)[0].items()}


def load_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The str -> str metadata in the header of the safetensors file `path`."""
    return read_safetensors(path, None, arrays=False)[1]


def read_safetensors(path: str | os.PathLike, device: str | None = None,
                     arrays: bool = True) -> tuple[dict[str, Any], dict[str, str]]:
    """(arrays by name, metadata) of a safetensors file; one-line errors naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"autograd.load: no such file: {path}")
    import safetensors

    try:
        with safetensors.safe_open(str(path), framework="np") as f:
            metadata = dict(f.metadata() or {})
        items = safetensors.deserialize(path.read_bytes()) if arrays else []
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one message
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"autograd.load: {path} is not a readable safetensors file "
                         f"({text})") from None
    out: dict[str, Any] = {}
    for name, view in items:
        dtype = _DTYPES.get(view["dtype"])
        if dtype is None:
            raise ValueError(f"autograd.load: {path}: entry {name!r} has dtype "
                             f"{view['dtype']}, expected one of {sorted(_DTYPES)}")
        array = np.frombuffer(view["data"], dtype=dtype).reshape(view["shape"])
        array = array.copy()  # writable, owns its memory
        out[name] = array if device in (None, "cpu") else gp.to_device(array, device)
    return out, metadata


__all__ = ["load", "load_metadata", "read_safetensors", "save"]
