"""SwiGLU, Llama's gated MLP activation: y = silu(gate) * up elementwise, and its gradients.

    y     = g * s * u,                      s = sigmoid(g) = 1 / (1 + exp(-g))
    dgate = dy * u * s * (1 + g * (1 - s))
    dup   = dy * g * s

Its own family rather than a row of the activation table: that family maps one input to one
output (x -> y, and x, dy -> dx), while SwiGLU takes two inputs and its backward writes two
gradients; fused, it reads gate and up once and writes y once (silu then a multiply would
write and re-read silu(gate), and round it to the dtype in between).

Math runs in float32 for f16/bf16 (one rounding, at the store) and in the dtype itself for
f32/f64. Host: NumPy in the accumulator dtype over blocks spread on the host threads
(elementwise, so the result does not depend on the split).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, as_dtype, cuda_name
from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import call
from gpuplan.host_pool import for_blocks
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.plan import Candidate, Plan, elementwise_candidates
from gpuplan.spec import DType, Extent, In, OpSpec, Out
from gpuplan.stream import Stream, Workspace

__all__ = [
    "SwigluDescriptor", "SwigluArgs", "SwigluPlan",
    "SwigluBackwardDescriptor", "SwigluBackwardArgs", "SwigluBackwardPlan",
]
__functional__ = ["swiglu", "swiglu_backward"]

_MODULE = CudaModule(__file__, "swiglu.cu",
                     [f"swiglu_{k}<{cuda_name(t)}>" for k in ("forward", "backward")
                      for t in FLOAT_DTYPES])
_THREADS = 256
_MAX_GRID = 1 << 18

_FIELDS = (Extent("numel"), DType("dtype", FLOAT_DTYPES, default=np.float32))
_N = ("numel",)
_INPUTS = ("gate", "up", "dy")
FORWARD = OpSpec("swiglu", fields=_FIELDS,
                 operands=(In("gate", _N), In("up", _N), Out("y", _N)))
BACKWARD = OpSpec("swiglu_backward", fields=_FIELDS,
                  operands=(In("gate", _N), In("up", _N), In("dy", _N),
                            Out("dgate", _N, distinct=_INPUTS),
                            Out("dup", _N, distinct=(*_INPUTS, "dgate"))))

SwigluDescriptor = FORWARD.descriptor(
    "SwigluDescriptor", "y[numel] = silu(gate[numel]) * up[numel] (and its gradients); "
                        "forward and backward share it.")
#: forward and backward share the descriptor (same fields).
SwigluBackwardDescriptor = SwigluDescriptor
BACKWARD.descriptor_cls = SwigluDescriptor
SwigluArgs = FORWARD.args("SwigluArgs", "gate, up in; y out; all [numel] of dtype.")
SwigluBackwardArgs = BACKWARD.args(
    "SwigluBackwardArgs", "gate, up (the forward's inputs), dy in; dgate, dup out; all "
                          "[numel] of dtype.")


def _aligned16(*arrays: Any) -> np.int32:
    return np.int32(all(a.data.ptr % 16 == 0 for a in arrays))


class _SwigluPlan(Plan):
    category = "elementwise"

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        return elementwise_candidates(desc.dtype, stream)

    def _prepare(self) -> None:
        d = self.desc
        self._acc = accumulator(d.dtype)
        self._kernel = f"swiglu_{self._direction}<{cuda_name(d.dtype)}>"
        per_pack = 16 // as_dtype(d.dtype).itemsize
        self._grid = max(1, min(cdiv(cdiv(d.numel, per_pack), _THREADS), _MAX_GRID))


class SwigluPlan(_SwigluPlan):
    """y = silu(gate) * up (16-byte packs when aligned)."""

    op = "swiglu"
    spec = FORWARD
    _direction = "forward"

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        gate, up, y, acc = args.gate, args.up, args.y, self._acc
        one = acc.type(1)

        def block(lo: int, hi: int) -> None:
            g = gate[lo:hi].astype(acc)
            y[lo:hi] = g / (one + np.exp(-g)) * up[lo:hi].astype(acc, copy=False)

        with np.errstate(over="ignore", invalid="ignore"):
            for_blocks(gate.size, block)

    def _run_map(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = _MODULE.function(self._kernel, stream.device_id)
        launch(stream, fn, self._grid, _THREADS,
               (args.gate, args.up, args.y, np.int64(self.desc.numel),
                _aligned16(args.gate, args.up, args.y)))


class SwigluBackwardPlan(_SwigluPlan):
    """dgate, dup of y = silu(gate) * up (16-byte packs when aligned)."""

    op = "swiglu_backward"
    spec = BACKWARD
    _direction = "backward"

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        gate, up, dy, acc = args.gate, args.up, args.dy, self._acc
        one = acc.type(1)

        def block(lo: int, hi: int) -> None:
            g = gate[lo:hi].astype(acc)
            s = one / (one + np.exp(-g))
            d = dy[lo:hi].astype(acc, copy=False)
            args.dup[lo:hi] = d * g * s
            args.dgate[lo:hi] = d * up[lo:hi].astype(acc, copy=False) * s * (
                one + g * (one - s))

        with np.errstate(over="ignore", invalid="ignore"):
            for_blocks(gate.size, block)

    def _run_map(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = _MODULE.function(self._kernel, stream.device_id)
        launch(stream, fn, self._grid, _THREADS,
               (args.gate, args.up, args.dy, args.dgate, args.dup, np.int64(self.desc.numel),
                _aligned16(args.gate, args.up, args.dy, args.dgate, args.dup)))


# -- functional API ------------------------------------------------------------------------


def _same_shape(op: str, gate: Any, **others: Any) -> None:
    for name, a in others.items():
        if tuple(a.shape) != tuple(gate.shape):  # flat views would match in size only
            raise InvalidProblem(describe(op, name, f"shape {tuple(gate.shape)} like 'gate'",
                                          f"shape {tuple(a.shape)}"))


def _flat(x: Any) -> Any:
    return backend.ascontiguous(x).reshape(-1)


def swiglu(gate: Any, up: Any) -> Any:
    """silu(gate) * up elementwise; gate and up of one shape and dtype; y like gate."""
    _same_shape("swiglu", gate, up=up)
    g = _flat(gate)
    y = call(SwigluPlan, SwigluDescriptor(g.size, gate.dtype), like=gate, gate=g, up=_flat(up))
    return y.reshape(gate.shape)


def swiglu_backward(gate: Any, up: Any, dy: Any) -> tuple[Any, Any]:
    """(dgate, dup) of y = silu(gate) * up for the cotangent dy (all of gate's shape)."""
    _same_shape("swiglu_backward", gate, up=up, dy=dy)
    g = _flat(gate)
    dgate, dup = call(SwigluBackwardPlan, SwigluDescriptor(g.size, gate.dtype), like=gate,
                      gate=g, up=_flat(up), dy=_flat(dy))
    return dgate.reshape(gate.shape), dup.reshape(gate.shape)
