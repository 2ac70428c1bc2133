"""Fused, in-place optimizer steps: AdamW and SGD (PyTorch semantics) over master weights.

Weights and moments are f32 (or f64, for gradient checks); gradients f32/f16/bf16 (f64 with
f64 weights) and are read in the weights' precision. All arrays are flat [n] here (the
functional API flattens). With t = step (starting at 1), AdamW is

    p = p * (1 - lr * wd)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g^2
    p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

and SGD is g = grad + wd * p; with momentum mu != 0: buf = g on the first step, else
buf = mu * buf + (1 - dampening) * g; g = g + mu * buf if nesterov else buf; p = p - lr * g.
Scalars derived from the hyperparameters are computed once in float64 and rounded to the
weights' dtype. When `param_lowp` (f16/bf16) is given it receives the updated weights rounded
to nearest even, for a low-precision forward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import (
    HALF_DTYPES,
    as_dtype,
    bfloat16,
    cuda_name,
    float16,
    float32,
    float64,
    short_name,
)
from gpuplan.errors import BufferTooSmall, InvalidProblem, describe
from gpuplan.execute import execute
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.plan import (
    BackendKind,
    Candidate,
    Plan,
    check_dtype,
    check_operand,
    host_candidate,
)
from gpuplan.stream import Stream, Workspace

__all__ = [
    "AdamWDescriptor",
    "AdamWArgs",
    "AdamWPlan",
    "AdamWMultiTensorDescriptor",
    "AdamWMultiTensorArgs",
    "AdamWMultiTensorPlan",
    "SGDDescriptor",
    "SGDArgs",
    "SGDPlan",
]
__functional__ = ["adamw_step", "sgd_step"]

#: (param dtype, grad dtype) pairs with a kernel; every pair is instantiated for both lowp types.
_PAIRS = [(float32, float32), (float32, float16), (float32, bfloat16), (float64, float64)]
_GRAD_DTYPES = {float32: (float32, float16, bfloat16), float64: (float64,)}


def _instances(kernel: str) -> list[str]:
    return [f"{kernel}<{cuda_name(p)}, {cuda_name(g)}, {cuda_name(low)}>" for p, g in _PAIRS
            for low in HALF_DTYPES]


_MODULE = CudaModule(
    __file__,
    "optimizer.cu",
    _instances("adamw_step_kernel") + _instances("adamw_multi_tensor_kernel")
    + _instances("sgd_step_kernel"),
)
_THREADS = 256
_MAX_BLOCKS = 16384
#: elements per block of the multi-tensor kernel
MULTI_TENSOR_CHUNK = 16384


# -- shared checks and helpers ---------------------------------------------------------------


def _resolve_dtypes(op: str, desc: Any) -> tuple[np.dtype, np.dtype, np.dtype | None]:
    p = check_dtype(op, "dtype", desc.dtype, (float32, float64))
    g = p if desc.grad_dtype is None else as_dtype(desc.grad_dtype)
    check_dtype(op, "grad_dtype", g, _GRAD_DTYPES[p])
    low = None if desc.lowp_dtype is None else check_dtype(op, "lowp_dtype", desc.lowp_dtype,
                                                           HALF_DTYPES)
    return p, g, low


def _candidates_for(desc: Any, op: str, on_device: bool, workspace: int = 0) -> list[Candidate]:
    p, _, _ = _resolve_dtypes(op, desc)
    if not on_device:
        return [host_candidate(p)]
    sp = short_name(p)
    # Elementwise with fixed constants: no reduction, so the bits do not depend on the launch.
    return [Candidate("fused", BackendKind.NVRTC, True, True, sp, sp, workspace)]


def _check_real(op: str, name: str, v: Any, lo: float, hi: float = math.inf,
                hi_open: bool = False) -> float:
    ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
    if ok:
        f = float(v)
        ok = math.isfinite(f) and lo <= f and (f < hi if hi_open else f <= hi)
    if not ok:
        rng = f"[{lo}, {hi})" if hi_open else f"[{lo}, {hi}]"
        raise InvalidProblem(describe(op, name, f"a finite number in {rng}", repr(v)))
    return float(v)


def _span(a: Any) -> tuple[int, int]:
    ptr = a.data.ptr if backend.is_device_array(a) else a.ctypes.data
    return ptr, ptr + a.nbytes


def _check_disjoint(op: str, named: Sequence[tuple[str, Any]]) -> None:
    """InvalidProblem if any two of the (contiguous) buffers overlap: every one but the
    gradients is written, and a shared buffer would be updated twice."""
    spans = sorted((_span(a) + (name,) for name, a in named if a is not None and a.size),
                   key=lambda s: s[0])
    for (_, end0, n0), (start1, _, n1) in zip(spans, spans[1:], strict=False):
        if start1 < end0:
            raise InvalidProblem(describe(op, n1, f"a buffer distinct from '{n0}'",
                                          "an overlapping buffer"))


def _check_same_side(op: str, stream: Stream, name: str, a: Any) -> None:
    if a is None:
        return
    on_device = not stream.is_host
    if backend.is_device_array(a) != on_device or (on_device and a.device.id != stream.device_id):
        where = f"device {stream.device_id} (CuPy)" if on_device else "host (NumPy)"
        raise InvalidProblem(describe(op, name, f"an array on {where} to match the plan's stream",
                                      f"one on {backend.device_of(a)}"))


def _dummy(a: Any, b: Any) -> Any:
    """An unused pointer argument: the kernel never touches it when its flag is 0."""
    return b if a is None else a


# -- AdamW --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdamWDescriptor:
    n: int
    dtype: Any = np.float32         # weights and moments: f32 or f64
    grad_dtype: Any = None          # None: dtype; f32 weights also take f16/bf16 gradients
    lowp_dtype: Any = None          # f16/bf16 when param_lowp is written, else None


@dataclass(frozen=True)
class AdamWArgs:
    param: Any                      # [n] dtype, updated in place
    grad: Any                       # [n] grad_dtype
    exp_avg: Any                    # [n] dtype, updated in place
    exp_avg_sq: Any                 # [n] dtype, updated in place
    lr: float
    step: int                       # 1 on the first step
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 1e-2
    param_lowp: Any = None          # [n] lowp_dtype, overwritten, or None


def _adamw_scalars(op: str, args: Any, dtype: np.dtype) -> tuple:
    """(decay, beta1, 1-beta1, beta2, 1-beta2, step_size, 1/sqrt(bc2), eps) as `dtype`."""
    lr = _check_real(op, "lr", args.lr, 0.0)
    b1 = _check_real(op, "beta1", args.beta1, 0.0, 1.0, hi_open=True)
    b2 = _check_real(op, "beta2", args.beta2, 0.0, 1.0, hi_open=True)
    eps = _check_real(op, "eps", args.eps, 0.0)
    wd = _check_real(op, "weight_decay", args.weight_decay, 0.0)
    t = args.step
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
        raise InvalidProblem(describe(op, "step", "an integer >= 1", repr(t)))
    bc1, bc2 = 1.0 - b1 ** int(t), 1.0 - b2 ** int(t)
    vals = (1.0 - lr * wd, b1, 1.0 - b1, b2, 1.0 - b2, lr / bc1, 1.0 / math.sqrt(bc2), eps)
    return tuple(dtype.type(v) for v in vals)


def _adamw_numpy(p: Any, g: Any, m: Any, v: Any, lowp: Any, s: tuple) -> None:
    decay, b1, omb1, b2, omb2, step_size, inv_sqrt_bc2, eps = s
    # In place, rounding exactly like the expressions in the comments (no temporaries
    # beyond two scratch arrays).
    g = g.astype(p.dtype, copy=False)
    t = np.multiply(g, omb1)
    m *= b1
    m += t                        # m = b1 * m + (1 - b1) * g
    np.multiply(g, g, out=t)
    t *= omb2
    v *= b2
    v += t                        # v = b2 * v + (1 - b2) * g * g
    den = np.sqrt(v)
    den *= inv_sqrt_bc2
    den += eps
    np.divide(m, den, out=t)
    t *= step_size
    p *= decay
    p -= t                        # p = p * decay - step_size * (m / (sqrt(v) / sqrt(bc2) + eps))
    if lowp is not None:
        lowp[...] = p.astype(lowp.dtype)


class AdamWPlan(Plan):
    """One fused AdamW step over one flat tensor (SKUs: ``numpy``, ``fused``: one launch)."""

    op = "adamw_step"
    category = "optimizer"

    @classmethod
    def _candidates(cls, desc: AdamWDescriptor, on_device: bool) -> list[Candidate]:
        return _candidates_for(desc, cls.op, on_device)

    def _check_args(self, args: AdamWArgs) -> None:
        p, g, low = _resolve_dtypes(self.op, self.desc)
        shape = (self.desc.n,)
        check_operand(self.op, "param", args.param, shape, p)
        check_operand(self.op, "grad", args.grad, shape, g)
        check_operand(self.op, "exp_avg", args.exp_avg, shape, p)
        check_operand(self.op, "exp_avg_sq", args.exp_avg_sq, shape, p)
        _check_lowp(self.op, "param_lowp", args.param_lowp, shape, low)
        _check_disjoint(self.op, [("param", args.param), ("grad", args.grad),
                                  ("exp_avg", args.exp_avg), ("exp_avg_sq", args.exp_avg_sq),
                                  ("param_lowp", args.param_lowp)])
        self._scalars = _adamw_scalars(self.op, args, p)

    def _is_empty(self) -> bool:
        return self.desc.n == 0

    def _run_numpy(self, stream: Stream, ws: Workspace, args: AdamWArgs) -> None:
        _adamw_numpy(args.param, args.grad, args.exp_avg, args.exp_avg_sq, args.param_lowp,
                     self._scalars)

    def _run_fused(self, stream: Stream, ws: Workspace, args: AdamWArgs) -> None:
        n = self.desc.n
        fn = _MODULE.function(_kernel_name("adamw_step_kernel", self.desc), stream.device_id)
        lowp = args.param_lowp
        launch(stream, fn, min(cdiv(n, _THREADS), _MAX_BLOCKS), _THREADS,
               (args.param, args.grad, args.exp_avg, args.exp_avg_sq, _dummy(lowp, args.param),
                np.int64(n)) + self._scalars + (np.int32(lowp is not None),))


def _check_lowp(op: str, name: str, a: Any, shape: tuple, low: np.dtype | None) -> None:
    if low is None:
        if a is not None:
            raise InvalidProblem(describe(op, name, "None (the descriptor's lowp_dtype is None)",
                                          f"an array of {short_name(a.dtype)}"))
        return
    check_operand(op, name, a, shape, low)


def _kernel_name(kernel: str, desc: Any) -> str:
    p, g, low = _resolve_dtypes("optimizer", desc)
    return f"{kernel}<{cuda_name(p)}, {cuda_name(g)}, {cuda_name(low or bfloat16)}>"


# -- AdamW over many tensors in one launch ------------------------------------------------------


@dataclass(frozen=True)
class AdamWMultiTensorDescriptor:
    sizes: tuple[int, ...]          # element count of every tensor
    dtype: Any = np.float32
    grad_dtype: Any = None
    lowp_dtype: Any = None


@dataclass(frozen=True)
class AdamWMultiTensorArgs:
    params: Sequence[Any]           # one flat array per size, like AdamWArgs per tensor
    grads: Sequence[Any]
    exp_avgs: Sequence[Any]
    exp_avg_sqs: Sequence[Any]
    lr: float
    step: int
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 1e-2
    params_lowp: Sequence[Any] | None = None


class AdamWMultiTensorPlan(Plan):
    """AdamW over a list of tensors sharing dtypes and hyperparameters.

    The ``fused`` SKU makes one launch: a table of (n, param, grad, exp_avg, exp_avg_sq,
    lowp) addresses per tensor and a (tensor, start) row per block of MULTI_TENSOR_CHUNK
    elements, both written into the workspace; each element gets exactly AdamWPlan's math.
    """

    op = "adamw_multi_tensor_step"
    category = "optimizer"

    @classmethod
    def _check_descriptor(cls, desc: AdamWMultiTensorDescriptor) -> None:
        super()._check_descriptor(desc)
        for k, s in enumerate(desc.sizes):
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
                raise InvalidProblem(describe(cls.op, f"sizes[{k}]", "an extent >= 0", s))

    @classmethod
    def _chunk_count(cls, desc: AdamWMultiTensorDescriptor) -> int:
        return sum(cdiv(int(s), MULTI_TENSOR_CHUNK) for s in desc.sizes)

    @classmethod
    def _candidates(cls, desc: AdamWMultiTensorDescriptor, on_device: bool) -> list[Candidate]:
        table_bytes = 8 * (6 * len(desc.sizes) + 2 * cls._chunk_count(desc))
        return _candidates_for(desc, cls.op, on_device, table_bytes)

    def _check_args(self, args: AdamWMultiTensorArgs) -> None:
        p, g, low = _resolve_dtypes(self.op, self.desc)
        t = len(self.desc.sizes)
        lists = {"params": args.params, "grads": args.grads, "exp_avgs": args.exp_avgs,
                 "exp_avg_sqs": args.exp_avg_sqs}
        if low is not None:
            lists["params_lowp"] = args.params_lowp
        elif args.params_lowp is not None:
            raise InvalidProblem(describe(self.op, "params_lowp",
                                          "None (the descriptor's lowp_dtype is None)",
                                          type(args.params_lowp).__name__))
        for name, seq in lists.items():
            if not isinstance(seq, (list, tuple)) or len(seq) != t:
                given = f"{len(seq)} arrays" if isinstance(seq, (list, tuple)) else repr(seq)
                raise InvalidProblem(describe(self.op, name, f"a list of {t} arrays", given))
        named = []
        dtypes = {"params": p, "grads": g, "exp_avgs": p, "exp_avg_sqs": p, "params_lowp": low}
        for k, n in enumerate(self.desc.sizes):
            for name, seq in lists.items():
                label = f"{name}[{k}]"
                _check_same_side(self.op, self._stream, label, seq[k])
                if name == "params_lowp":
                    _check_lowp(self.op, label, seq[k], (int(n),), low)
                else:
                    check_operand(self.op, label, seq[k], (int(n),), dtypes[name])
                named.append((label, seq[k]))
        _check_disjoint(self.op, named)
        self._scalars = _adamw_scalars(self.op, args, p)

    def _is_empty(self) -> bool:
        return self._chunk_count(self.desc) == 0

    def _lowp(self, args: AdamWMultiTensorArgs, k: int) -> Any:
        return None if self.desc.lowp_dtype is None else args.params_lowp[k]

    def _run_numpy(self, stream: Stream, ws: Workspace, args: AdamWMultiTensorArgs) -> None:
        for k, n in enumerate(self.desc.sizes):
            if n:
                _adamw_numpy(args.params[k], args.grads[k], args.exp_avgs[k],
                             args.exp_avg_sqs[k], self._lowp(args, k), self._scalars)

    def _run_fused(self, stream: Stream, ws: Workspace, args: AdamWMultiTensorArgs) -> None:
        sizes = [int(s) for s in self.desc.sizes]
        t, nchunks = len(sizes), self._chunk_count(self.desc)
        host = np.zeros(6 * t + 2 * nchunks, dtype=np.int64)
        tensors = host[: 6 * t].reshape(t, 6)
        chunks = host[6 * t:].reshape(nchunks, 2)
        row = 0
        for k, n in enumerate(sizes):
            lowp = self._lowp(args, k)
            tensors[k] = (n, args.params[k].data.ptr, args.grads[k].data.ptr,
                          args.exp_avgs[k].data.ptr, args.exp_avg_sqs[k].data.ptr,
                          0 if lowp is None else lowp.data.ptr)
            c = cdiv(n, MULTI_TENSOR_CHUNK)
            chunks[row:row + c, 0] = k
            chunks[row:row + c, 1] = np.arange(c, dtype=np.int64) * MULTI_TENSOR_CHUNK
            row += c
        table = ws.view(np.int64, host.size)
        # Ordered on the stream after earlier launches that read this workspace; returns once
        # the pageable host table has been staged, so `host` may be freed.
        table.set(host, stream=stream.cuda_stream)
        fn = _MODULE.function(_kernel_name("adamw_multi_tensor_kernel", self.desc),
                              stream.device_id)
        reachable = [a for k in range(t) for a in (args.params[k], args.grads[k],
                                                   args.exp_avgs[k], args.exp_avg_sqs[k],
                                                   self._lowp(args, k)) if a is not None]
        launch(stream, fn, nchunks, _THREADS,
               (table[: 6 * t], table[6 * t:], np.int64(MULTI_TENSOR_CHUNK)) + self._scalars
               + (np.int32(self.desc.lowp_dtype is not None),), reachable=reachable)


# -- SGD ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SGDDescriptor:
    n: int
    dtype: Any = np.float32
    grad_dtype: Any = None
    lowp_dtype: Any = None


@dataclass(frozen=True)
class SGDArgs:
    param: Any                      # [n] dtype, updated in place
    grad: Any                       # [n] grad_dtype
    momentum_buf: Any               # [n] dtype, updated in place; None allowed when momentum == 0
    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    first_step: bool = False        # buf = g instead of the momentum update
    param_lowp: Any = None


class SGDPlan(Plan):
    """One fused SGD (momentum, dampening, Nesterov, weight decay) step over one flat tensor."""

    op = "sgd_step"
    category = "optimizer"

    @classmethod
    def _candidates(cls, desc: SGDDescriptor, on_device: bool) -> list[Candidate]:
        return _candidates_for(desc, cls.op, on_device)

    def _check_args(self, args: SGDArgs) -> None:
        p, g, low = _resolve_dtypes(self.op, self.desc)
        shape = (self.desc.n,)
        lr = _check_real(self.op, "lr", args.lr, 0.0)
        mu = _check_real(self.op, "momentum", args.momentum, 0.0)
        damp = _check_real(self.op, "dampening", args.dampening, -math.inf)
        wd = _check_real(self.op, "weight_decay", args.weight_decay, 0.0)
        if args.nesterov and (mu == 0.0 or damp != 0.0):
            raise InvalidProblem(describe(self.op, "nesterov", "momentum > 0 and dampening == 0",
                                          f"momentum={mu}, dampening={damp}"))
        check_operand(self.op, "param", args.param, shape, p)
        check_operand(self.op, "grad", args.grad, shape, g)
        buf = args.momentum_buf if mu != 0.0 else None
        if mu != 0.0:
            if args.momentum_buf is None:
                raise InvalidProblem(describe(self.op, "momentum_buf",
                                              "an array when momentum != 0", "None"))
            check_operand(self.op, "momentum_buf", buf, shape, p)
        _check_lowp(self.op, "param_lowp", args.param_lowp, shape, low)
        _check_disjoint(self.op, [("param", args.param), ("grad", args.grad),
                                  ("momentum_buf", buf), ("param_lowp", args.param_lowp)])
        self._buf = buf
        self._scalars = tuple(p.type(v) for v in (lr, wd, mu, 1.0 - damp))
        self._flags = (mu != 0.0, bool(args.first_step), bool(args.nesterov))

    def _is_empty(self) -> bool:
        return self.desc.n == 0

    def _run_numpy(self, stream: Stream, ws: Workspace, args: SGDArgs) -> None:
        lr, wd, mu, one_minus_damp = self._scalars
        use_momentum, first, nesterov = self._flags
        p = args.param
        d = args.grad.astype(p.dtype)
        if wd != 0:
            d = d + wd * p
        if use_momentum:
            buf = self._buf
            buf[...] = d if first else mu * buf + one_minus_damp * d
            d = d + mu * buf if nesterov else buf
        p[...] = p - lr * d
        if args.param_lowp is not None:
            args.param_lowp[...] = p.astype(args.param_lowp.dtype)

    def _run_fused(self, stream: Stream, ws: Workspace, args: SGDArgs) -> None:
        n = self.desc.n
        fn = _MODULE.function(_kernel_name("sgd_step_kernel", self.desc), stream.device_id)
        lowp = args.param_lowp
        launch(stream, fn, min(cdiv(n, _THREADS), _MAX_BLOCKS), _THREADS,
               (args.param, args.grad, _dummy(self._buf, args.param), _dummy(lowp, args.param),
                np.int64(n)) + self._scalars
               + tuple(np.int32(f) for f in self._flags) + (np.int32(lowp is not None),))


# -- functional API ------------------------------------------------------------------------


def _flat(op: str, name: str, a: Any, shape: tuple, in_place: bool) -> Any:
    """A flat view of `a` (in-place operands must be contiguous, or updates would be lost)."""
    if a is None:
        return None
    if not hasattr(a, "shape"):
        raise InvalidProblem(describe(op, name, "an array", type(a).__name__))
    if a.size < math.prod(shape):
        raise BufferTooSmall(describe(op, name, f"at least {math.prod(shape)} elements "
                                      f"(shape {shape})", f"{a.size} (shape {tuple(a.shape)})"))
    if tuple(a.shape) != shape:
        raise InvalidProblem(describe(op, name, f"shape {shape}", f"shape {tuple(a.shape)}"))
    if not a.flags.c_contiguous:
        if in_place:
            raise InvalidProblem(describe(op, name, "a C-contiguous array (updated in place)",
                                          "a strided view"))
        a = backend.ascontiguous(a)
    return a.reshape(-1)


def adamw_step(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, *, lr: float,
               beta1: float, beta2: float, eps: float, weight_decay: float, step: int,
               param_lowp: Any = None) -> None:
    """One AdamW step in place on param, exp_avg, exp_avg_sq (and param_lowp if given)."""
    op, shape = AdamWPlan.op, tuple(param.shape)
    flats = [_flat(op, name, a, shape, name != "grad") for name, a in (
        ("param", param), ("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq),
        ("param_lowp", param_lowp))]
    desc = AdamWDescriptor(math.prod(shape), param.dtype, grad.dtype,
                           None if param_lowp is None else param_lowp.dtype)
    execute(AdamWPlan, desc, AdamWArgs(*flats[:4], lr=lr, step=step, beta1=beta1, beta2=beta2,
                                       eps=eps, weight_decay=weight_decay,
                                       param_lowp=flats[4]), like=param)


def sgd_step(param: Any, grad: Any, momentum_buf: Any, *, lr: float, momentum: float = 0.0,
             dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
             first_step: bool = False, param_lowp: Any = None) -> None:
    """One SGD step in place on param (and momentum_buf, param_lowp when given)."""
    op, shape = SGDPlan.op, tuple(param.shape)
    flats = [_flat(op, name, a, shape, name != "grad") for name, a in (
        ("param", param), ("grad", grad), ("momentum_buf", momentum_buf),
        ("param_lowp", param_lowp))]
    desc = SGDDescriptor(math.prod(shape), param.dtype, grad.dtype,
                         None if param_lowp is None else param_lowp.dtype)
    execute(SGDPlan, desc, SGDArgs(flats[0], flats[1], flats[2], lr=lr, momentum=momentum,
                                   dampening=dampening, weight_decay=weight_decay,
                                   nesterov=nesterov, first_step=first_step,
                                   param_lowp=flats[3]), like=param)
