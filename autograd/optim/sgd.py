"""SGD with momentum, dampening, weight decay and Nesterov (PyTorch semantics), fused."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import gpuplan as gp
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
        if lr < 0.0 or momentum < 0.0 or weight_decay < 0.0:
            raise ValueError(f"SGD: lr, momentum and weight_decay must be >= 0, given "
                             f"lr={lr}, momentum={momentum}, weight_decay={weight_decay}")
        if nesterov and (momentum <= 0.0 or dampening != 0.0):
            raise ValueError("SGD: nesterov needs momentum > 0 and dampening == 0")
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": nesterov},
                         master_weights)

    def step(self) -> None:
        stepped = []
        for group, p in self._params_with_grad():
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
