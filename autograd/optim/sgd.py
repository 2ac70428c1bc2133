"""SGD with momentum, dampening, weight decay and Nesterov (PyTorch semantics), fused."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import gpuplan as gp
from autograd.optim.adamw import check_hyperparameter
from autograd.optim.optimizer import Optimizer


class SGD(Optimizer):
    """PyTorch SGD, one fused ``gp.functional.sgd_step`` per parameter.

    With ``g = grad + weight_decay * p``: if momentum, ``buf = g`` on the first step and
    ``buf = momentum * buf + (1 - dampening) * g`` after; ``g = g + momentum * buf`` when
    nesterov else ``g = buf``. Then ``p -= lr * g``.
    """

    def __init__(self, params: Iterable[Any], lr: float, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                 master_weights: bool = True) -> None:
        check_hyperparameter("SGD", "lr", "learning rate", lr)
        check_hyperparameter("SGD", "momentum", "momentum value", momentum)
        check_hyperparameter("SGD", "weight_decay", "weight_decay value", weight_decay)
        if isinstance(dampening, bool) or not isinstance(dampening, (int, float)) or \
                not math.isfinite(dampening):
            raise ValueError(f"Invalid dampening value: {dampening!r} (SGD: argument "
                             "'dampening': expected a finite number)")
        if nesterov and (momentum <= 0.0 or dampening != 0.0):
            raise ValueError("SGD: nesterov needs momentum > 0 and dampening == 0")
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": nesterov},
                         master_weights)

    def step(self) -> None:
        """One step of every parameter with a gradient. Not under CUDA graph capture: lr,
        momentum and the first-step flag are kernel arguments a graph would freeze."""
        stepped = []
        for i, (group, p) in enumerate(self._params_with_grad()):
            if i == 0 and gp.graphs.is_capturing(gp.Stream.for_array(p.data)):
                raise gp.graphs.GraphCaptureError(
                    "SGD.step(): cannot be captured in a CUDA graph (its lr and momentum "
                    "are kernel arguments the graph would freeze at their capture values); "
                    "capture AdamW/Adam, or run SGD.step() outside the graph")
            state = self._param_state(p)
            buf = None
            if group["momentum"] != 0.0:
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = self._zeros_like_master(p, state)
                    state["momentum_buffer"] = buf
            target, lowp = self._target(p, state)
            gp.functional.sgd_step(
                target, p.grad.data, buf, lr=float(group["lr"]),
                momentum=float(group["momentum"]), dampening=float(group["dampening"]),
                weight_decay=float(group["weight_decay"]), nesterov=bool(group["nesterov"]),
                first_step=state["step"] == 0, param_lowp=lowp)
            state["step"] += 1
            stepped.append(p)
        self._mark_stepped(stepped)
