"""General matrix multiply: C = f(alpha * op(A) @ op(B) + beta * C (+ bias)), strided batch.

All operands are row major and C-contiguous. With trans_a, A is stored [K, M] and op(A) = A^T,
otherwise A is [M, K]; with trans_b, B is stored [N, K], otherwise [K, N]. C is [batch, M, N];
A and B carry the same leading batch axis unless broadcast (a 2-D operand shared by every
batch entry). When both operands are 2-D, batch must be 1 and C is [M, N]. Per batch entry b:

    P[b, m, n] = alpha * sum_k op(A)[b, m, k] * op(B)[b, k, n] + beta * C[b, m, n] + bias[n]
    C[b, m, n] = f(P[b, m, n])

f is the identity (epilogue "none") or an activation of the activation family's table
(`gemm_sku.EPILOGUES`: "gelu", "gelu_tanh"), applied to P in the accumulator dtype before
the one rounding; with save_preact, P itself (rounded) is written to `preact`, what the
activation's backward needs.

alpha and beta are run arguments (`GemmArgs`), not descriptor fields: a new scale (a loss
scale, an attention 1/sqrt(d)) reuses the plan. beta == 0 never reads C (it may hold NaN).
Half types multiply exactly and accumulate in f32; the result is rounded once to the output
dtype (except where noted for the cuBLAS bias path).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, HALF_DTYPES, accumulator, as_dtype, cuda_name, float64
from gpuplan.dtypes import short_name as sn
from gpuplan.errors import InvalidProblem, Unsupported, describe
from gpuplan.execute import call
from gpuplan.nvrtc import allow_dynamic_smem, cdiv, launch
from gpuplan.ops.gemm import host as gemm_host
from gpuplan.ops.gemm.sku import (
    EPILOGUE_MODULE,
    EPILOGUES,
    FMA_TILES,
    MODULE,
    TC_SMEM_BYTES,
    TC_THREADS,
    TC_TILE,
    CublasGemm,
    activation_name,
    cublas,
    epilogue_activation,
    fma_name,
    tc_name,
)
from gpuplan.plan import BackendKind, Candidate, Plan, host_candidate
from gpuplan.spec import Choice, DType, Extent, Flag, In, OpSpec, Out, Scalar
from gpuplan.stream import Stream, Workspace

__all__ = ["GemmDescriptor", "GemmArgs", "GemmPlan"]
__functional__ = ["matmul"]

#: The CUDA modules (gemm_sku): plain GEMMs, and GEMMs with an activation epilogue.
_MODULE, _EPILOGUE_MODULE = MODULE, EPILOGUE_MODULE
#: Kernels index rows and k in int (k-tile bases run up to K + 1023); cuBLAS takes int.
_MAX_EXTENT = 2**31 - 1024
_GRID_YZ_MAX = 65535



# -- the declaration ----------------------------------------------------------------------


def _a_shape(d: Any) -> tuple[int, ...]:
    """[batch,] M, K (K, M with trans_a); no batch axis when broadcast_a."""
    mat = (d.k, d.m) if d.trans_a else (d.m, d.k)
    return mat if d.broadcast_a else (d.batch, *mat)


def _b_shape(d: Any) -> tuple[int, ...]:
    """[batch,] K, N (N, K with trans_b); no batch axis when broadcast_b."""
    mat = (d.n, d.k) if d.trans_b else (d.k, d.n)
    return mat if d.broadcast_b else (d.batch, *mat)


def _c_shape(d: Any) -> tuple[int, ...]:
    """[batch,] M, N: no batch axis when both operands are 2-D."""
    return (d.m, d.n) if d.broadcast_a and d.broadcast_b else (d.batch, d.m, d.n)


SPEC = OpSpec(
    "gemm",
    fields=(Extent("m"), Extent("n"), Extent("k"), Extent("batch", default=1),
            Flag("trans_a", default=False), Flag("trans_b", default=False),
            Flag("has_bias", default=False), Flag("broadcast_a", default=False),
            Flag("broadcast_b", default=False), DType("dtype", FLOAT_DTYPES, default=np.float32),
            Choice("epilogue", EPILOGUES, default="none"), Flag("save_preact", default=False)),
    operands=(In("a", _a_shape), In("b", _b_shape), Out("c", _c_shape),
              In("bias", ("n",), present="has_bias"),
              Out("preact", _c_shape, present="save_preact", distinct=("a", "b", "bias", "c"))),
    scalars=(Scalar("alpha", 1.0), Scalar("beta", 0.0)),
    empty=("m", "n", "batch"),  # k == 0 is not empty: C = beta * C + bias
)
GemmDescriptor = SPEC.descriptor(
    "GemmDescriptor", "C[batch, M, N] = f(alpha * op(A) @ op(B) + beta * C + bias), f the "
    "epilogue (see gemm.py); a_shape(), b_shape(), c_shape() give the operand shapes.")
GemmDescriptor.a_shape, GemmDescriptor.b_shape, GemmDescriptor.c_shape = (
    _a_shape, _b_shape, _c_shape)
GemmArgs = SPEC.args(
    "GemmArgs", "a, b, c (written; read when beta != 0), bias [N] when has_bias, preact (the "
    "pre-activation, c's shape) when save_preact; alpha, beta run-time reals.")


class GemmPlan(Plan):
    """Batched GEMM with alpha/beta, a bias and an activation epilogue.

    SKUs on a GPU, in order of preference:
    - ``cublas`` (cublasGemmStridedBatchedEx): f16/bf16 on tensor cores with f32 compute,
      f32 with CUBLAS_COMPUTE_32F_PEDANTIC (full f32, never TF32, whatever the handle's math
      mode), f64 with 64F compute. Deterministic on one device (cuBLAS's guarantee for a
      given version, architecture and SM count), not bit-stable across devices. The bias
      (and beta, when there is a bias) is applied by a small kernel of ours that first sets
      C = beta*C + bias, then cuBLAS adds alpha*AB with beta = 1: with beta != 0 and a bias
      the addend is rounded to the output dtype once before the final rounding. An
      activation epilogue is a second kernel of ours over C (so P is rounded before f).
    - ``tiled`` (NVRTC): our kernels. f16/bf16 (sm_80+ by the stream's compute capability):
      mma.sync m16n8k16 tensor cores, 128x128x32 tiles, 4-stage cp.async pipeline, f32
      accumulation. f32/f64: register-tiled FMA kernel. No split-K and no atomics:
      deterministic. The FMA kernel's bits do not depend on the device (one fma chain per
      output in ascending k); the tensor-core kernel's do (the summation inside an mma
      instruction is the hardware's), so it is marked bit_stable=False. The activation
      epilogue runs in the kernels' own epilogue, on the unrounded accumulator.
    Host: ``numpy``, np.matmul in the accumulator dtype, rounded once.
    """

    op = "gemm"
    category = "gemm"
    spec = SPEC

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        for name in ("m", "n", "k", "batch"):
            v = getattr(desc, name)
            if v > _MAX_EXTENT:
                raise Unsupported(describe(cls.op, name, f"an extent <= {_MAX_EXTENT}", v))
        if desc.broadcast_a and desc.broadcast_b and desc.batch != 1:
            raise InvalidProblem(describe(cls.op, "batch", "1 when both operands are 2-D",
                                          desc.batch))
        if desc.save_preact and desc.epilogue == "none":
            raise InvalidProblem(describe(cls.op, "save_preact", "False without an activation "
                                          "epilogue (the pre-activation is C)", True))

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = as_dtype(desc.dtype)
        if stream.is_host:
            return [host_candidate(d)]
        mp, acc = sn(d), sn(accumulator(d))
        cands = []
        # The emulated stream refuses cuBLAS by name (Plan.select): offered there so that
        # asking for it says why; on a GPU only where libcublas loads.
        if stream.is_emulated or cublas() is not None:
            cands.append(Candidate("cublas", BackendKind.CUBLAS, True, False, mp, acc))
        half = d in HALF_DTYPES
        tile_n = TC_TILE if half else FMA_TILES[cuda_name(d)][1]
        if cdiv(desc.n, tile_n) <= _GRID_YZ_MAX:
            # mma.sync / cp.async: Plan.select compares this with stream.compute_capability.
            cands.append(Candidate("tiled", BackendKind.NVRTC, True, not half, mp, acc,
                                   min_compute_capability=80 if half else 0))
        return cands

    def _prepare(self) -> None:
        d = self.desc
        self._acc = accumulator(d.dtype)
        self._kscalar = np.float64 if as_dtype(d.dtype) == float64 else np.float32
        self._stride_a = 0 if d.broadcast_a else d.m * d.k
        self._stride_b = 0 if d.broadcast_b else d.k * d.n
        self._act = epilogue_activation(d.epilogue)
        self._module = _MODULE if self._act is None else _EPILOGUE_MODULE
        variant = self._cand.variant
        if variant == "tiled":
            self._prepare_tiled()
        elif variant == "cublas":
            self._prepare_cublas()
        if variant != "numpy":
            t = cuda_name(d.dtype)
            self._scale_bias_kernel = f"gemm::gemm_scale_bias<{t}>"
            self._act_kernel = None if self._act is None else activation_name(t, d.epilogue)

    def _check_args(self, args: Any) -> None:
        alpha, beta = args.alpha, args.beta
        # x - x == 0 is False for NaN and +-inf: the common case costs two comparisons.
        if type(alpha) is float and type(beta) is float and alpha - alpha == 0 == beta - beta:
            return
        for name, v in (("alpha", alpha), ("beta", beta)):
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise InvalidProblem(describe(self.op, name, "a real number", repr(v)))
            if not math.isfinite(v):
                raise InvalidProblem(describe(self.op, name, "a finite number", v))

    # -- host ---------------------------------------------------------------------------
    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d, acc = self.desc, self._acc
        alpha, beta = args.alpha, args.beta
        a = args.a.astype(acc, copy=False)
        b = args.b.astype(acc, copy=False)
        # Transposed operands go to BLAS as swapped-axes views (a transpose flag), except a
        # batched B: per-entry sgemm with a transposed B measured slower than copying it.
        if d.trans_a:
            a = np.swapaxes(a, -1, -2)
        if d.trans_b:
            b = np.swapaxes(b, -1, -2)
            b = np.ascontiguousarray(b) if b.ndim > 2 else b
        act = self._act
        if (act is not None and act.forward32 is not None and args.preact is not None
                and beta == 0 and acc == np.float32 and args.preact.dtype == acc):
            # f32 with a saved pre-activation: BLAS writes it, then bias and the activation
            # run a cache-sized block at a time into C (the same roundings as below).
            v = gemm_host.matmul(a, b, args.preact)
            if alpha != 1:
                v *= acc.type(alpha)
            gemm_host.bias_activation(act.forward32, v, args.bias if d.has_bias else None, args.c,
                                      act.bias_forward32)
            return
        if beta == 0 and acc == args.c.dtype:
            # f32/f64: BLAS writes C directly, each thread scaling and adding the bias to
            # its part; the same roundings as below, no temporaries.
            v = gemm_host.matmul(a, b, args.c, alpha, args.bias if d.has_bias else None)
        else:
            v = gemm_host.matmul(a, b, np.empty(args.c.shape, acc))
            if alpha != 1:
                v *= acc.type(alpha)
            if beta != 0:
                v += acc.type(beta) * args.c.astype(acc)
            if d.has_bias:
                v += args.bias.astype(acc, copy=False)
        if self._act is not None:
            if args.preact is not None:
                args.preact[...] = v
            with np.errstate(over="ignore"):
                v = self._act.forward(v, None)
        if v is not args.c:
            args.c[...] = v

    # -- cuBLAS -------------------------------------------------------------------------
    def _prepare_cublas(self) -> None:
        self._cublas_call = CublasGemm.of(self.desc, self._stride_a, self._stride_b)

    def _run_cublas(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d = self.desc
        beta = args.beta
        if d.has_bias or d.k == 0:
            self._scale_bias(stream, args)  # C = beta * C + bias
            beta = 1.0
        if d.k > 0:
            self._cublas_call.run(stream, args.a, args.b, args.c, args.alpha, beta)
        if self._act is not None:
            self._activation(stream, args)  # preact = C, C = f(C)

    def _scale_bias(self, stream: Stream, args: Any) -> None:
        """C = beta * C + bias (the cuBLAS SKU's bias pass, launched before cuBLAS)."""
        d = self.desc
        fn = self._module.function(self._scale_bias_kernel, stream.device_id)
        total = args.c.size
        bias = args.bias if d.has_bias else args.c  # never read without a bias
        launch(stream, fn, int(min(cdiv(total, 256), 65536)), 256,
               (args.c, bias, np.int64(total), np.int64(d.n), self._kscalar(args.beta),
                np.int32(d.has_bias)))

    def _activation(self, stream: Stream, args: Any) -> None:
        """preact = C (when saved), C = f(C): the cuBLAS SKU's activation pass, after it."""
        fn = self._module.function(self._act_kernel, stream.device_id)
        total = args.c.size
        launch(stream, fn, int(min(cdiv(total, 256), 65536)), 256,
               (args.c, args.preact, np.int64(total)))

    # -- our kernels --------------------------------------------------------------------
    def _prepare_tiled(self) -> None:
        d = self.desc
        t, epi = cuda_name(d.dtype), d.epilogue
        if as_dtype(d.dtype) in HALF_DTYPES:
            contiguous_a = d.m if d.trans_a else d.k
            contiguous_b = d.k if d.trans_b else d.n
            # cp.async tiles need 8-element rows; the 16-byte bases are checked per call.
            self._vec_extents = contiguous_a % 8 == 0 and contiguous_b % 8 == 0
            self._kernels = (tc_name(t, d.trans_a, d.trans_b, False, epi),
                             tc_name(t, d.trans_a, d.trans_b, True, epi))
            bm = bn = TC_TILE
            self._block, self._smem = TC_THREADS, TC_SMEM_BYTES
        else:
            self._vec_extents = False
            self._kernels = (fma_name(t, d.trans_a, d.trans_b, epi),) * 2
            bm, bn, tm, tn = FMA_TILES[t]
            self._block, self._smem = (bm // tm) * (bn // tn), 0
        self._grid = (cdiv(d.m, bm), cdiv(d.n, bn), min(d.batch, _GRID_YZ_MAX))
        self._extents = (np.int64(d.m), np.int64(d.n), np.int64(d.k), np.int64(d.batch),
                         np.int64(self._stride_a), np.int64(self._stride_b))

    def _run_tiled(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d = self.desc
        vec = (self._vec_extents and backend.data_ptr(args.a) % 16 == 0
               and backend.data_ptr(args.b) % 16 == 0)
        fn = self._module.function(self._kernels[vec], stream.device_id)
        if self._smem:
            allow_dynamic_smem(fn, self._smem, stream.device_id)
        scalar = self._kscalar  # the accumulator's: f32 for the tensor-core kernels
        launch(stream, fn, self._grid, self._block,
               (args.a, args.b, args.c, args.preact, args.bias if d.has_bias else args.c)
               + self._extents + (scalar(args.alpha), scalar(args.beta), np.int32(d.has_bias)),
               shared_mem=self._smem)


# -- functional API ------------------------------------------------------------------------

#: (a.shape, b.shape, dtype, trans_a, trans_b, has_bias, epilogue, save_preact) ->
#: (descriptor, a view shape or None, b view shape or None, output shape or None): derived
#: once per problem shape.
_PROBLEMS: dict[tuple, tuple] = {}


def _matmul_problem(a_shape: tuple, b_shape: tuple, dtype: Any, trans_a: bool, trans_b: bool,
                    has_bias: bool, epilogue: str, save_preact: bool) -> tuple:
    """The GEMM descriptor of matmul on these shapes, and the views to pass it. The rank,
    batch-axis and contraction errors are raised here: once per problem shape."""
    op = "matmul"
    if as_dtype(dtype) not in FLOAT_DTYPES:  # named here, not as the GEMM descriptor's field
        raise Unsupported(describe(op, "a", "dtype " + " or ".join(sn(t) for t in FLOAT_DTYPES),
                                   sn(as_dtype(dtype))))
    for name, shape in (("a", a_shape), ("b", b_shape)):
        if len(shape) < 2:
            raise InvalidProblem(describe(op, name, "an array of rank >= 2",
                                          f"rank {len(shape)}"))
    lead_a, lead_b = a_shape[:-2], b_shape[:-2]
    if lead_a and lead_b and lead_a != lead_b:
        raise InvalidProblem(describe(op, "b", f"batch axes {lead_a} like 'a' (or none)",
                                      f"batch axes {lead_b}"))
    m, k = (a_shape[-1], a_shape[-2]) if trans_a else (a_shape[-2], a_shape[-1])
    k_b, n = (b_shape[-1], b_shape[-2]) if trans_b else (b_shape[-2], b_shape[-1])
    if k != k_b:
        raise InvalidProblem(describe(op, "b", f"a contraction extent of {k} like 'a'", k_b))
    lead = lead_a or lead_b
    batch = math.prod(lead)
    common = dict(trans_a=trans_a, trans_b=trans_b, has_bias=has_bias, dtype=dtype,
                  epilogue=epilogue, save_preact=save_preact)
    if lead_a and not lead_b and not trans_a:
        # [*batch, M, K] @ [K, N] is one [batch*M, K] @ [K, N] GEMM.
        desc = GemmDescriptor(batch * m, n, k, broadcast_a=True, broadcast_b=True, **common)
    else:
        desc = GemmDescriptor(m, n, k, batch=batch if lead else 1, broadcast_a=not lead_a,
                              broadcast_b=not lead_b, **common)
    views = [_a_shape(desc), _b_shape(desc)]
    out = (*lead, m, n)
    return (desc, None if views[0] == a_shape else views[0],
            None if views[1] == b_shape else views[1], None if out == _c_shape(desc) else out)


def matmul(a: Any, b: Any, *, trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0,
           bias: Any = None, epilogue: str = "none", save_preact: bool = False) -> Any:
    """f(alpha * op(a) @ op(b) (+ bias[N])) as a fresh array of the inputs' dtype, f the
    `epilogue` ("none", "gelu", "gelu_tanh"); with save_preact, returns (out, preact), preact
    the argument of f (what f's backward needs).

    a: [M, K] or [*batch, M, K] ([K, M] / [*batch, K, M] with trans_a); b: [K, N] or
    [*batch, K, N] ([N, K] / [*batch, N, K] with trans_b). A 2-D operand is broadcast over
    the other's batch axes; two batched operands must have equal batch axes. Returns
    [*batch, M, N] ([M, N] when both are 2-D). Strided inputs are copied; dtypes, devices
    and the bias are checked once, by the plan.
    """
    key = (a.shape, b.shape, a.dtype, trans_a, trans_b, bias is not None, epilogue, save_preact)
    problem = _PROBLEMS.get(key)
    if problem is None:
        if len(_PROBLEMS) >= 1024:
            _PROBLEMS.clear()
        problem = _PROBLEMS[key] = _matmul_problem(
            tuple(a.shape), tuple(b.shape), a.dtype, bool(trans_a), bool(trans_b),
            bias is not None, epilogue, save_preact)
    desc, a_view, b_view, out_shape = problem
    for name, x in (("b", b), ("bias", bias)):  # named as matmul's, not the plan's (gemm)
        if x is not None and x.dtype != a.dtype:
            raise Unsupported(describe("matmul", name, f"dtype {sn(as_dtype(a.dtype))} like "
                                                       f"'a'", sn(as_dtype(x.dtype))))
    if not a.flags.c_contiguous:
        a = backend.ascontiguous(a)
    if not b.flags.c_contiguous:
        b = backend.ascontiguous(b)
    if bias is not None and not bias.flags.c_contiguous:
        bias = backend.ascontiguous(bias)
    c, preact = call(GemmPlan, desc, like=a, a=a if a_view is None else a.reshape(a_view),
                     b=b if b_view is None else b.reshape(b_view), bias=bias, alpha=alpha)
    if out_shape is not None:
        c = c.reshape(out_shape)
        preact = None if preact is None else preact.reshape(out_shape)
    return (c, preact) if save_preact else c
