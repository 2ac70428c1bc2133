"""General matrix multiply: C = alpha * op(A) @ op(B) + beta * C (+ bias), strided batch.

All operands are row major and C-contiguous. With trans_a, A is stored [K, M] and op(A) = A^T,
otherwise A is [M, K]; with trans_b, B is stored [N, K], otherwise [K, N]. C is [batch, M, N];
A and B carry the same leading batch axis unless broadcast (a 2-D operand shared by every
batch entry). When both operands are 2-D, batch must be 1 and C is [M, N]. Per batch entry b:

    C[b, m, n] = alpha * sum_k op(A)[b, m, k] * op(B)[b, k, n] + beta * C[b, m, n] + bias[n]

beta == 0 never reads C (it may hold NaN). Half types multiply exactly and accumulate in f32;
the result is rounded once to the output dtype (except where noted for the cuBLAS bias path).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, HALF_DTYPES, accumulator, cuda_name, float64, short_name
from gpuplan.errors import InvalidProblem, Unsupported, describe
from gpuplan.execute import execute
from gpuplan.nvrtc import CudaModule, cdiv, launch, on_stream
from gpuplan.plan import (
    BackendKind,
    Candidate,
    Plan,
    check_dtype,
    check_operand,
    check_writable_distinct,
    host_candidate,
)
from gpuplan.stream import Stream, Workspace

__all__ = ["GemmDescriptor", "GemmArgs", "GemmPlan"]
__functional__ = ["matmul"]

_BOOLS = ("false", "true")
#: Tensor-core tile (must match gemm.cu tc::): 128x128 block tile, 256 threads, and
#: tc::SMEM_BYTES = STAGES(4) * 2 operands * max(128*40, 32*136) halves * 2 bytes.
_TC_TILE, _TC_THREADS, _TC_SMEM_BYTES = 128, 256, 4 * 2 * 5120 * 2
#: CUDA-core tiles per dtype: (BM, BN, TM, TN) of gemm_fma, 256 threads each.
_FMA_TILES = {"float": (128, 128, 8, 8), "double": (64, 64, 4, 4)}
#: Kernels index rows and k in int (k-tile bases run up to K + 1023); cuBLAS takes int.
_MAX_EXTENT = 2**31 - 1024
_GRID_YZ_MAX = 65535


def _tc_name(t: str, ta: bool, tb: bool, vec: bool) -> str:
    return f"gemm::gemm_tc<{t}, {_BOOLS[ta]}, {_BOOLS[tb]}, {_BOOLS[vec]}>"


def _fma_name(t: str, ta: bool, tb: bool) -> str:
    bm, bn, tm, tn = _FMA_TILES[t]
    return f"gemm::gemm_fma<{t}, {_BOOLS[ta]}, {_BOOLS[tb]}, {bm}, {bn}, {tm}, {tn}>"


_FLAGS = [(ta, tb) for ta in (False, True) for tb in (False, True)]
_MODULE = CudaModule(
    __file__,
    "gemm.cu",
    [_tc_name(cuda_name(t), ta, tb, v) for t in HALF_DTYPES for ta, tb in _FLAGS
     for v in (False, True)]
    + [_fma_name(t, ta, tb) for t in _FMA_TILES for ta, tb in _FLAGS]
    + [f"gemm::gemm_scale_bias<{cuda_name(t)}>" for t in FLOAT_DTYPES],
)


@dataclass(frozen=True)
class GemmDescriptor:
    m: int
    n: int
    k: int
    batch: int = 1
    trans_a: bool = False
    trans_b: bool = False
    alpha: float = 1.0
    beta: float = 0.0
    has_bias: bool = False
    broadcast_a: bool = False
    broadcast_b: bool = False
    dtype: Any = np.float32

    def a_shape(self) -> tuple[int, ...]:
        mat = (self.k, self.m) if self.trans_a else (self.m, self.k)
        return mat if self.broadcast_a else (self.batch, *mat)

    def b_shape(self) -> tuple[int, ...]:
        mat = (self.n, self.k) if self.trans_b else (self.k, self.n)
        return mat if self.broadcast_b else (self.batch, *mat)

    def c_shape(self) -> tuple[int, ...]:
        both_2d = self.broadcast_a and self.broadcast_b
        return (self.m, self.n) if both_2d else (self.batch, self.m, self.n)


@dataclass(frozen=True)
class GemmArgs:
    a: Any            # desc.a_shape(): [batch,] M, K  (K, M with trans_a)
    b: Any            # desc.b_shape(): [batch,] K, N  (N, K with trans_b)
    c: Any            # desc.c_shape(): read when beta != 0, always written
    bias: Any = None  # [N] when desc.has_bias


@functools.lru_cache(maxsize=1)
def _cublas() -> Any | None:
    """CuPy's low-level cuBLAS bindings, or None where libcublas cannot be loaded."""
    try:
        from cupy_backends.cuda.libs import cublas
    except Exception:  # noqa: BLE001 - missing libcublas: no cuBLAS SKU
        return None
    return cublas


class GemmPlan(Plan):
    """Batched GEMM with alpha/beta and a bias epilogue.

    SKUs on a GPU, in order of preference:
    - ``cublas`` (cublasGemmStridedBatchedEx): f16/bf16 on tensor cores with f32 compute,
      f32 with CUBLAS_COMPUTE_32F_PEDANTIC (full f32, never TF32, whatever the handle's math
      mode), f64 with 64F compute. Deterministic on one device (cuBLAS's guarantee for a
      given version, architecture and SM count), not bit-stable across devices. The bias
      (and beta, when there is a bias) is applied by a small kernel of ours that first sets
      C = beta*C + bias, then cuBLAS adds alpha*AB with beta = 1: with beta != 0 and a bias
      the addend is rounded to the output dtype once before the final rounding.
    - ``tiled`` (NVRTC): our kernels. f16/bf16 (sm_80+): mma.sync m16n8k16 tensor cores,
      128x128x32 tiles, 4-stage cp.async pipeline, f32 accumulation. f32/f64: register-tiled
      FMA kernel. No split-K and no atomics: deterministic. The FMA kernel's bits do not
      depend on the device (one fma chain per output in ascending k); the tensor-core
      kernel's do (the summation inside an mma instruction is the hardware's), so it is
      marked bit_stable=False.
    Host: ``numpy``, np.matmul in the accumulator dtype, rounded once.
    """

    op = "gemm"
    category = "gemm"

    @classmethod
    def _check_descriptor(cls, desc: GemmDescriptor) -> None:
        for name in ("m", "n", "k", "batch"):
            v = getattr(desc, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise InvalidProblem(describe(cls.op, name, "an extent >= 0", v))
            if v > _MAX_EXTENT:
                raise Unsupported(describe(cls.op, name, f"an extent <= {_MAX_EXTENT}", v))
        for name in ("alpha", "beta"):
            v = getattr(desc, name)
            if not isinstance(v, (int, float, np.integer, np.floating)) or isinstance(v, bool):
                raise InvalidProblem(describe(cls.op, name, "a real number", repr(v)))
        if desc.broadcast_a and desc.broadcast_b and desc.batch != 1:
            raise InvalidProblem(describe(cls.op, "batch", "1 when both operands are 2-D",
                                          desc.batch))

    @classmethod
    def _candidates(cls, desc: GemmDescriptor, on_device: bool) -> list[Candidate]:
        d = check_dtype(cls.op, "dtype", desc.dtype, FLOAT_DTYPES)
        if not on_device:
            return [host_candidate(d)]
        mp, acc = short_name(d), short_name(accumulator(d))
        cands = []
        # Without a GPU only the emulated device asks, which refuses cuBLAS by name (see
        # Plan.select); loading libcublas to find that out would import cupy_backends.
        if not backend.cuda_available() or _cublas() is not None:
            cands.append(Candidate("cublas", BackendKind.CUBLAS, True, False, mp, acc))
        half = d in HALF_DTYPES
        tile_n = _TC_TILE if half else _FMA_TILES[cuda_name(d)][1]
        if cdiv(desc.n, tile_n) <= _GRID_YZ_MAX:
            cands.append(Candidate("tiled", BackendKind.NVRTC, True, not half, mp, acc,
                                   min_compute_capability=80 if half else 0))
        return cands

    def _check_args(self, args: GemmArgs) -> None:
        d = self.desc
        check_operand(self.op, "a", args.a, d.a_shape(), d.dtype)
        check_operand(self.op, "b", args.b, d.b_shape(), d.dtype)
        check_operand(self.op, "c", args.c, d.c_shape(), d.dtype)
        if d.has_bias:
            check_operand(self.op, "bias", args.bias, (d.n,), d.dtype)
        elif args.bias is not None:
            raise InvalidProblem(describe(self.op, "bias", "None (descriptor has_bias=False)",
                                          f"an array of shape {tuple(args.bias.shape)}"))
        check_writable_distinct(self.op, {"c": args.c},
                                {"a": args.a, "b": args.b, "bias": args.bias})

    def _is_empty(self) -> bool:
        d = self.desc
        return d.m == 0 or d.n == 0 or d.batch == 0

    # -- host ---------------------------------------------------------------------------
    def _run_numpy(self, stream: Stream, ws: Workspace, args: GemmArgs) -> None:
        d = self.desc
        acc = accumulator(d.dtype)
        a = args.a.astype(acc, copy=False)
        b = args.b.astype(acc, copy=False)
        # Transposed operands go to BLAS as swapped-axes views (a transpose flag), except a
        # batched B: per-entry sgemm with a transposed B measured slower than copying it.
        if d.trans_a:
            a = np.swapaxes(a, -1, -2)
        if d.trans_b:
            b = np.swapaxes(b, -1, -2)
            b = np.ascontiguousarray(b) if b.ndim > 2 else b
        if d.beta == 0 and acc == args.c.dtype:
            # f32/f64: BLAS writes C directly; the same roundings as below, no temporaries.
            c = np.matmul(a, b, out=args.c)
            if d.alpha != 1:
                c *= acc.type(d.alpha)
            if d.has_bias:
                c += args.bias
            return
        v = np.matmul(a, b)
        if d.alpha != 1:
            v *= acc.type(d.alpha)
        if d.beta != 0:
            v += acc.type(d.beta) * args.c.astype(acc)
        if d.has_bias:
            v += args.bias.astype(acc, copy=False)
        args.c[...] = v

    # -- cuBLAS -------------------------------------------------------------------------
    def _run_cublas(self, stream: Stream, ws: Workspace, args: GemmArgs) -> None:
        d = self.desc
        beta = d.beta
        if d.has_bias or d.k == 0:
            self._scale_bias(stream, args)  # C = beta * C + bias
            beta = 1.0
        if d.k == 0:
            return
        cp = backend.cupy_module()
        cublas = _cublas()
        from cupy_backends.cuda.api import runtime

        dt = np.dtype(d.dtype)
        data_type = {np.dtype(np.float32): runtime.CUDA_R_32F,
                     np.dtype(np.float64): runtime.CUDA_R_64F,
                     np.dtype(np.float16): runtime.CUDA_R_16F}.get(dt, runtime.CUDA_R_16BF)
        if dt == float64:
            compute, scalar = cublas.CUBLAS_COMPUTE_64F, np.float64
        elif dt in HALF_DTYPES:
            compute, scalar = cublas.CUBLAS_COMPUTE_32F, np.float32
        else:  # f32: PEDANTIC forbids TF32 even if CUPY_TF32 set the handle's math mode
            compute, scalar = cublas.CUBLAS_COMPUTE_32F_PEDANTIC, np.float32
        alpha = np.array(d.alpha, dtype=scalar)
        beta_h = np.array(beta, dtype=scalar)
        # Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B goes first.
        m, n, k = d.n, d.m, d.k
        op_b = cublas.CUBLAS_OP_T if d.trans_b else cublas.CUBLAS_OP_N
        ld_b = d.k if d.trans_b else d.n
        op_a = cublas.CUBLAS_OP_T if d.trans_a else cublas.CUBLAS_OP_N
        ld_a = d.m if d.trans_a else d.k
        stride_b = 0 if d.broadcast_b else d.k * d.n
        stride_a = 0 if d.broadcast_a else d.m * d.k
        with on_stream(stream):  # CuPy's cuBLAS calls bind the handle to the current stream
            handle = cp.cuda.device.get_cublas_handle()
            mode = cublas.getPointerMode(handle)
            cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
            try:
                cublas.gemmStridedBatchedEx(
                    handle, op_b, op_a, m, n, k, alpha.ctypes.data,
                    args.b.data.ptr, data_type, ld_b, stride_b,
                    args.a.data.ptr, data_type, ld_a, stride_a,
                    beta_h.ctypes.data, args.c.data.ptr, data_type, d.n, d.m * d.n,
                    d.batch, compute, cublas.CUBLAS_GEMM_DEFAULT)
            finally:
                cublas.setPointerMode(handle, mode)

    def _scale_bias(self, stream: Stream, args: GemmArgs) -> None:
        d = self.desc
        t = cuda_name(d.dtype)
        fn = _MODULE.function(f"gemm::gemm_scale_bias<{t}>", stream.device_id)
        total = args.c.size
        scalar = np.float64 if np.dtype(d.dtype) == float64 else np.float32
        bias = args.bias if d.has_bias else args.c  # never read without a bias
        launch(stream, fn, int(min(cdiv(total, 256), 65536)), 256,
               (args.c, bias, np.int64(total), np.int64(d.n), scalar(d.beta),
                np.int32(d.has_bias)))

    # -- our kernels --------------------------------------------------------------------
    def _run_tiled(self, stream: Stream, ws: Workspace, args: GemmArgs) -> None:
        d = self.desc
        t = cuda_name(d.dtype)
        half = np.dtype(d.dtype) in HALF_DTYPES
        if half:
            contiguous_a = d.m if d.trans_a else d.k
            contiguous_b = d.k if d.trans_b else d.n
            vec = (contiguous_a % 8 == 0 and contiguous_b % 8 == 0
                   and backend.data_ptr(args.a) % 16 == 0 and backend.data_ptr(args.b) % 16 == 0)
            fn = _MODULE.function(_tc_name(t, d.trans_a, d.trans_b, vec), stream.device_id)
            _allow_dynamic_smem(fn, _TC_SMEM_BYTES)
            bm = bn = _TC_TILE
            block, smem, scalar = _TC_THREADS, _TC_SMEM_BYTES, np.float32
        else:
            fn = _MODULE.function(_fma_name(t, d.trans_a, d.trans_b), stream.device_id)
            bm, bn, tm, tn = _FMA_TILES[t]
            block, smem = (bm // tm) * (bn // tn), 0
            scalar = np.float64 if t == "double" else np.float32
        grid = (cdiv(d.m, bm), cdiv(d.n, bn), min(d.batch, _GRID_YZ_MAX))
        launch(stream, fn, grid, block,
               (args.a, args.b, args.c, args.bias if d.has_bias else args.c,
                np.int64(d.m), np.int64(d.n), np.int64(d.k), np.int64(d.batch),
                np.int64(0 if d.broadcast_a else d.m * d.k),
                np.int64(0 if d.broadcast_b else d.k * d.n),
                scalar(d.alpha), scalar(d.beta), np.int32(d.has_bias)),
               shared_mem=smem)


_SMEM_SET: dict[int, Any] = {}


def _allow_dynamic_smem(fn: Any, nbytes: int) -> None:
    """Raise a kernel's dynamic shared-memory cap above 48 KB (once per compiled function)."""
    if id(fn) not in _SMEM_SET:
        fn.max_dynamic_shared_size_bytes = nbytes
        _SMEM_SET[id(fn)] = fn  # held, so that its id is never reused by another function


# -- functional API ------------------------------------------------------------------------


def matmul(a: Any, b: Any, *, trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0,
           bias: Any = None) -> Any:
    """alpha * op(a) @ op(b) (+ bias[N]) as a fresh array of the inputs' dtype.

    a: [M, K] or [*batch, M, K] ([K, M] / [*batch, K, M] with trans_a); b: [K, N] or
    [*batch, K, N] ([N, K] / [*batch, N, K] with trans_b). A 2-D operand is broadcast over
    the other's batch axes; two batched operands must have equal batch axes. Returns
    [*batch, M, N] ([M, N] when both are 2-D).
    """
    op = "matmul"
    if backend.device_of(a) != backend.device_of(b):
        raise InvalidProblem(describe(op, "b", f"an array on {backend.device_of(a)} like 'a'",
                                      f"one on {backend.device_of(b)}"))
    if a.dtype != b.dtype:
        raise Unsupported(describe(op, "b", f"dtype {short_name(a.dtype)} like 'a'",
                                   short_name(b.dtype)))
    for name, x in (("a", a), ("b", b)):
        if x.ndim < 2:
            raise InvalidProblem(describe(op, name, "an array of rank >= 2", f"rank {x.ndim}"))
    lead_a, lead_b = tuple(a.shape[:-2]), tuple(b.shape[:-2])
    if lead_a and lead_b and lead_a != lead_b:
        raise InvalidProblem(describe(op, "b", f"batch axes {lead_a} like 'a' (or none)",
                                      f"batch axes {lead_b}"))
    m, k = (a.shape[-1], a.shape[-2]) if trans_a else (a.shape[-2], a.shape[-1])
    k_b, n = (b.shape[-1], b.shape[-2]) if trans_b else (b.shape[-2], b.shape[-1])
    if k != k_b:
        raise InvalidProblem(describe(op, "b", f"a contraction extent of {k} like 'a'", k_b))
    m, n, k = int(m), int(n), int(k)
    lead = lead_a or lead_b
    batch = math.prod(lead)
    xp = backend.array_namespace(a)
    a, b = xp.ascontiguousarray(a), xp.ascontiguousarray(b)
    bias = None if bias is None else xp.ascontiguousarray(bias)
    common = dict(trans_a=trans_a, trans_b=trans_b, alpha=float(alpha),
                  has_bias=bias is not None, dtype=a.dtype)
    if lead_a and not lead_b and not trans_a:
        # [*batch, M, K] @ [K, N] is one [batch*M, K] @ [K, N] GEMM.
        desc = GemmDescriptor(batch * m, n, k, broadcast_a=True, broadcast_b=True, **common)
        a = a.reshape(batch * m, k)
    else:
        desc = GemmDescriptor(m, n, k, batch=batch if lead else 1, broadcast_a=not lead_a,
                              broadcast_b=not lead_b, **common)
        a = a.reshape(batch, *a.shape[-2:]) if lead_a else a
        b = b.reshape(batch, *b.shape[-2:]) if lead_b else b
    c = xp.empty(desc.c_shape(), dtype=a.dtype)
    execute(GemmPlan, desc, GemmArgs(a, b, c, bias), like=a)
    return c.reshape(*lead, m, n)
