"""SGD steps, fused and in place (PyTorch's torch.optim.SGD):

    g = grad + wd * p
    with momentum mu != 0: buf = g on the first step, else buf = mu * buf + (1 - dampening) * g;
                           g = g + mu * buf if nesterov else buf
    p = p - lr * g

Dtypes, SKUs and the shared checks: gpuplan/ops/optimizer/common.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import call
from gpuplan.nvrtc import launch
from gpuplan.ops.optimizer.common import (
    DTYPE_FIELDS,
    MODULE,
    THREADS,
    FusedStepPlan,
    check_real,
    flat_operands,
    grad_dtype,
    lowp_dtype,
    lowp_present,
)
from gpuplan.spec import REQUIRED, Extent, In, InOut, OpSpec, Out, Scalar
from gpuplan.stream import Stream, Workspace

__all__ = ["SGDDescriptor", "SGDArgs", "SGDPlan"]
__functional__ = ["sgd_step"]

SPEC = OpSpec(
    "sgd_step",
    fields=(Extent("n"), *DTYPE_FIELDS),
    operands=(InOut("param", ("n",), distinct=True), In("grad", ("n",), dtype=grad_dtype),
              InOut("momentum_buf", ("n",), present=True, distinct=("grad",)),
              Out("param_lowp", ("n",), dtype=lowp_dtype, present=lowp_present)),
    # Declared ranges, checked on every call before anything is written (a NaN lr).
    scalars=(Scalar("lr", REQUIRED, "real", lo=0.0), Scalar("momentum", 0.0, "real", lo=0.0),
             Scalar("dampening", 0.0, "real"), Scalar("weight_decay", 0.0, "real", lo=0.0),
             Scalar("nesterov", False),
             Scalar("first_step", False)),
    empty=("n",),
)
SGDDescriptor = SPEC.descriptor(
    "SGDDescriptor", "SGD over n weights (fields as AdamWDescriptor).")
SGDArgs = SPEC.args(
    "SGDArgs", "param [n] updated in place; grad [n]; momentum_buf [n] (in place; needed, and "
    "read, only when momentum != 0); param_lowp or None; lr, momentum, dampening, "
    "weight_decay, nesterov, first_step (buf = g instead of the momentum update) per call.")


class SGDPlan(FusedStepPlan):
    """One fused SGD (momentum, dampening, Nesterov, weight decay) step over one flat tensor."""

    op = "sgd_step"
    spec = SPEC
    kernel = "sgd_step_kernel"

    def _check_args(self, args: Any) -> None:
        op = self.op
        lr = check_real(op, "lr", args.lr, 0.0)
        mu = check_real(op, "momentum", args.momentum, 0.0)
        damp = check_real(op, "dampening", args.dampening, -np.inf)
        wd = check_real(op, "weight_decay", args.weight_decay, 0.0)
        if args.nesterov and (mu == 0.0 or damp != 0.0):
            raise InvalidProblem(describe(op, "nesterov", "momentum > 0 and dampening == 0",
                                          f"momentum={mu}, dampening={damp}"))
        buf = args.momentum_buf if mu != 0.0 else None
        if mu != 0.0 and buf is None:
            raise InvalidProblem(describe(op, "momentum_buf", "an array when momentum != 0",
                                          "None"))
        self._buf = buf
        p = self._dtype.type
        self._scalars = (p(lr), p(wd), p(mu), p(1.0 - damp))
        self._flags = (mu != 0.0, bool(args.first_step), bool(args.nesterov))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
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

    def _run_fused(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = MODULE.function(self._kernel, stream.device_id)
        unread = args.param  # pointer for the buffers the kernel skips (flags 0)
        buf = unread if self._buf is None else self._buf
        lowp = unread if args.param_lowp is None else args.param_lowp
        launch(stream, fn, self._grid, THREADS,
               (args.param, args.grad, buf, lowp, self._n) + self._scalars
               + tuple(np.int32(f) for f in self._flags) + (self._write_lowp,))


def sgd_step(param: Any, grad: Any, momentum_buf: Any, *, lr: float, momentum: float = 0.0,
             dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
             first_step: bool = False, param_lowp: Any = None) -> None:
    """One SGD step in place on param (and momentum_buf, param_lowp when given); every array
    has param's shape (in-place ones C-contiguous)."""
    p, g, buf, low = flat_operands(SGDPlan.op, param, (
        ("grad", grad, False), ("momentum_buf", momentum_buf, True),
        ("param_lowp", param_lowp, True)))
    desc = SGDDescriptor(p.size, p.dtype, g.dtype, None if low is None else low.dtype)
    call(SGDPlan, desc, like=p, param=p, grad=g, momentum_buf=buf, param_lowp=low, lr=lr,
         momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
         first_step=first_step)
