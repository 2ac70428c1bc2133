"""Dropout (forward, backward, keep mask) from a counter-based Philox4x32-10 generator.

The mask is a pure function of (p, seed, offset, i), the same bits on the host and on every
device and launch shape, so backward regenerates it instead of storing it:

    key     = (lo32(seed), hi32(seed))                       seed: 0 <= seed < 2**64
    counter = (lo32(j), hi32(j), 0, 0),  j = (offset + i // 4) mod 2**64
    word_i  = Philox4x32-10(counter, key)[i % 4]
    u_i     = float32(word_i >> 8) * 2**-24                  (exact, in [0, 1))
    keep_i  = u_i >= float32(p)

Element i of a flat (C-order) array uses counter offset + i // 4, so one call consumes
`philox_counters(numel)` = ceil(numel / 4) counters: a caller drawing several masks from one
seed advances `offset` by that much between calls to keep them independent.

Forward  y[i] = keep_i ? x[i] * scale : 0,   scale = 1 / (1 - p)
Backward dx[i] = keep_i ? dy[i] * scale : 0  (the same mask, regenerated from seed and offset)
For f32/f16/bf16 the scale is float32(1 / (1 - p)) (1/(1-p) computed in float64, rounded
once) and the product is taken in float32 then rounded to nearest even; for f64 both are
float64. p == 0 copies; p == 1 drops everything (zeros, as PyTorch).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, as_dtype, cuda_name, float64, short_name
from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import call
from gpuplan.nvrtc import CudaModule, cdiv, launch, on_stream
from gpuplan.plan import BackendKind, Candidate, Plan, host_candidate
from gpuplan.spec import DType, Extent, In, OpSpec, Out, Real, Scalar
from gpuplan.stream import Stream, Workspace

__all__ = [
    "DropoutDescriptor",
    "DropoutArgs",
    "DropoutPlan",
    "DropoutBackwardDescriptor",
    "DropoutBackwardArgs",
    "DropoutBackwardPlan",
    "DropoutMaskDescriptor",
    "DropoutMaskArgs",
    "DropoutMaskPlan",
]
__functional__ = ["dropout", "dropout_backward", "dropout_mask"]

_MODULE = CudaModule(
    __file__,
    "dropout.cu",
    [f"dropout_apply<{cuda_name(t)}>" for t in FLOAT_DTYPES] + ["dropout_keep_mask"],
)

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_U32 = 0xFFFFFFFF
_U64 = 2**64
_THREADS = 256
_MAX_BLOCKS = 16384
#: counters generated per host pass (bounds the host's temporary memory to ~100 MB)
_HOST_CHUNK = 1 << 20


def philox4x32_10(counters: np.ndarray, key: tuple[int, int],
                  high: tuple[int, int] = (0, 0)) -> np.ndarray:
    """Philox4x32-10 on the host: words [len, 4] uint32 for 64-bit counters (c0, c1) and the
    two high counter words `high` = (c2, c3), key = (k0, k1). Random123's reference algorithm."""
    j = np.asarray(counters, dtype=np.uint64)
    c0 = (j & np.uint64(_U32)).astype(np.uint64)
    c1 = (j >> np.uint64(32)).astype(np.uint32)
    c2 = np.full(j.shape, high[0], dtype=np.uint64)
    c3 = np.full(j.shape, high[1], dtype=np.uint32)
    k0, k1 = int(key[0]) & _U32, int(key[1]) & _U32
    for r in range(10):
        if r:
            k0, k1 = (k0 + _W0) & _U32, (k1 + _W1) & _U32
        p0 = c0 * _M0  # < 2**64: exact in uint64
        p1 = c2 * _M1
        n0 = (p1 >> np.uint64(32)).astype(np.uint32) ^ c1 ^ np.uint32(k0)
        n2 = (p0 >> np.uint64(32)).astype(np.uint32) ^ c3 ^ np.uint32(k1)
        c1 = (p1 & np.uint64(_U32)).astype(np.uint32)
        c3 = (p0 & np.uint64(_U32)).astype(np.uint32)
        c0 = n0.astype(np.uint64)
        c2 = n2.astype(np.uint64)
    return np.stack([c0.astype(np.uint32), c1, c2.astype(np.uint32), c3], axis=-1)


def philox_counters(numel: int) -> int:
    """Counters one dropout call over `numel` elements consumes (advance `offset` by this)."""
    return cdiv(int(numel), 4)


def keep_mask_host(n: int, p: float, seed: int, offset: int = 0, start: int = 0) -> np.ndarray:
    """The keep mask [n] bool of elements [start, start + n) on the host, exactly as the
    kernels compute it."""
    mask = np.empty(n, dtype=np.bool_)
    p32 = np.float32(p)
    key = (seed & _U32, seed >> 32)
    first, groups = start // 4, cdiv(start + n, 4)  # counters covering the elements
    for g0 in range(first, groups, _HOST_CHUNK):
        g1 = min(groups, g0 + _HOST_CHUNK)
        j = (np.arange(g0, g1, dtype=np.uint64) + np.uint64(offset))  # wraps mod 2**64
        words = philox4x32_10(j, key).reshape(-1)
        u = (words >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)
        lo, hi = max(start, 4 * g0), min(start + n, 4 * g1)
        mask[lo - start:hi - start] = (u >= p32)[lo - 4 * g0:hi - 4 * g0]
    return mask


def drop_scale(p: float, dtype: Any) -> np.floating:
    """1 / (1 - p) rounded once to the kernel's scale type (0 when p == 1: all dropped)."""
    s = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
    return np.float64(s) if as_dtype(dtype) == float64 else np.float32(s)


def _grid(n: int) -> int:
    return max(1, min(cdiv(philox_counters(n), _THREADS), _MAX_BLOCKS))


# -- declarations ---------------------------------------------------------------------------

_N = ("n",)
_FIELDS = (Extent("n"), Real("p", lo=0.0, hi=1.0),
           DType("dtype", FLOAT_DTYPES, default=np.float32))
#: the per-call counter stream: a new (seed, offset) every step never selects a new plan.
_RNG = (Scalar("seed", kind="int", lo=0, hi=2**64, hi_open=True),
        Scalar("offset", 0, "int", lo=0, hi=2**64, hi_open=True))
FORWARD = OpSpec("dropout", fields=_FIELDS, operands=(In("x", _N), Out("y", _N)), scalars=_RNG)
BACKWARD = OpSpec("dropout_backward", fields=_FIELDS, operands=(In("dy", _N), Out("dx", _N)),
                  scalars=_RNG)
MASK = OpSpec("dropout_mask", fields=(Extent("n"), Real("p", lo=0.0, hi=1.0)),
              operands=(Out("mask", _N, np.bool_),), scalars=_RNG)

DropoutDescriptor = FORWARD.descriptor(
    "DropoutDescriptor", "Dropout of `n` elements with drop probability `p` (0 <= p <= 1); "
                         "forward and backward share it.")
DropoutBackwardDescriptor = DropoutDescriptor
BACKWARD.descriptor_cls = DropoutDescriptor
DropoutArgs = FORWARD.args(
    "DropoutArgs", "x, y [n]; seed, offset: the Philox key and first counter, each in "
                   "[0, 2**64).")
DropoutBackwardArgs = BACKWARD.args(
    "DropoutBackwardArgs", "dy, dx [n]; the forward's seed and offset.")
DropoutMaskDescriptor = MASK.descriptor("DropoutMaskDescriptor", "Keep mask of `n` elements.")
DropoutMaskArgs = MASK.args("DropoutMaskArgs", "mask [n] bool, written; seed, offset.")


class _RandomPlan(Plan):
    """Shared checks and launch constants of the Philox plans."""

    def _check_args(self, args: Any) -> None:
        for name in ("seed", "offset"):
            v = getattr(args, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or \
                    not 0 <= v < _U64:
                raise InvalidProblem(describe(self.op, name, "an integer in [0, 2**64)",
                                              repr(v)))

    def _prepare(self) -> None:
        d = self.desc
        self._p = float(d.p)
        self._grid = _grid(d.n)
        self._consts = (np.int64(d.n),)
        self._p32 = np.float32(self._p)


class DropoutPlan(_RandomPlan):
    """y[i] = keep_i * x[i] / (1 - p) with the Philox keep mask of the module docstring.

    SKUs: ``numpy`` (host) and ``philox`` (one thread per counter, four elements each,
    vector loads when aligned). Elementwise with a launch-independent mask: deterministic,
    bit-stable, and bit-identical to the host except that the device flushes f32/bf16
    subnormal products to zero (CuPy compiles with -ftz=true).
    """

    op = "dropout"
    category = "elementwise"
    spec = FORWARD
    _in, _out = "x", "y"

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = as_dtype(desc.dtype)
        if stream.is_host:
            return [host_candidate(d)]
        acc = short_name(accumulator(d))
        return [Candidate("philox", BackendKind.NVRTC, True, True, short_name(d), acc)]

    def _prepare(self) -> None:
        super()._prepare()
        dtype = self.desc.dtype
        self._acc = accumulator(dtype)
        self._scale = drop_scale(self._p, dtype)
        self._kernel = f"dropout_apply<{cuda_name(dtype)}>"

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        x, y = getattr(args, self._in), getattr(args, self._out)
        if self._p == 0:
            y[...] = x
            return
        keep = keep_mask_host(self.desc.n, self._p, int(args.seed), int(args.offset))
        prod = x.astype(self._acc) * self._scale
        y[...] = np.where(keep, prod, 0).astype(self.desc.dtype)

    def _run_philox(self, stream: Stream, ws: Workspace, args: Any) -> None:
        x, y = getattr(args, self._in), getattr(args, self._out)
        if self._p == 0:
            with on_stream(stream):
                y[...] = x
            return
        fn = _MODULE.function(self._kernel, stream.device_id)
        aligned = np.int32(all(a.data.ptr % (4 * a.dtype.itemsize) == 0 for a in (x, y)))
        launch(stream, fn, self._grid, _THREADS,
               (x, y, *self._consts, np.uint64(args.seed), np.uint64(args.offset), self._p32,
                self._scale, aligned))


class DropoutBackwardPlan(DropoutPlan):
    """dx[i] = keep_i * dy[i] / (1 - p), the forward's mask regenerated from (seed, offset)."""

    op = "dropout_backward"
    spec = BACKWARD
    _in, _out = "dy", "dx"


class DropoutMaskPlan(_RandomPlan):
    """mask[i] = keep_i (bool), the mask DropoutPlan applies for the same (p, seed, offset)."""

    op = "dropout_mask"
    category = "random"
    spec = MASK

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        backend_kind = BackendKind.NUMPY if stream.is_host else BackendKind.NVRTC
        return [Candidate("numpy" if stream.is_host else "philox", backend_kind, True, True,
                          "f32", "f32")]

    def _sku_dtype(self) -> Any:
        return np.bool_

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        args.mask[...] = keep_mask_host(self.desc.n, self._p, int(args.seed), int(args.offset))

    def _run_philox(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = _MODULE.function("dropout_keep_mask", stream.device_id)
        launch(stream, fn, self._grid, _THREADS,
               (args.mask, *self._consts, np.uint64(args.seed), np.uint64(args.offset),
                self._p32, np.int32(args.mask.data.ptr % 4 == 0)))


# -- functional API ------------------------------------------------------------------------


def _flat(a: Any) -> Any:
    return backend.ascontiguous(a).reshape(-1)


def dropout(x: Any, p: float, seed: int, offset: int = 0) -> Any:
    """y = x * keep / (1 - p), same shape and dtype as x (p == 0: a copy; p == 1: zeros)."""
    flat = _flat(x)
    y = call(DropoutPlan, DropoutDescriptor(flat.size, p, x.dtype), like=x, x=flat, seed=seed,
             offset=offset)
    return y.reshape(x.shape)


def dropout_backward(dy: Any, p: float, seed: int, offset: int = 0) -> Any:
    """dx = dy * keep / (1 - p) with the forward's mask, regenerated from (seed, offset)."""
    flat = _flat(dy)
    dx = call(DropoutBackwardPlan, DropoutDescriptor(flat.size, p, dy.dtype), like=dy, dy=flat,
              seed=seed, offset=offset)
    return dx.reshape(dy.shape)


def dropout_mask(shape: Any, p: float, seed: int, offset: int = 0, device: str = "cpu") -> Any:
    """The keep mask (bool, `shape`, on 'cpu', 'cuda' or 'emulated') that dropout applies."""
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise InvalidProblem(describe("dropout_mask", "shape", "extents >= 0", shape))
    mask = backend.empty(shape, np.bool_, device)
    flat = mask.reshape(-1)
    call(DropoutMaskPlan, DropoutMaskDescriptor(flat.size, p), like=mask, mask=flat, seed=seed,
         offset=offset)
    return mask
