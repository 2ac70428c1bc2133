"""AdamW (decoupled weight decay, PyTorch semantics) with fused, multi-tensor kernels."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

import gpuplan as gp
from autograd.optim.optimizer import Optimizer
from gpuplan.ops.optimizer.adamw import HYPER_SIZE


def check_hyperparameter(optimizer: str, arg: str, what: str, value: Any,
                         hi: float | None = None) -> None:
    """PyTorch's ``ValueError("Invalid learning rate: -1")`` (`what`), for any value of
    argument `arg` that is not a finite real number in [0, hi) (NaN and inf too, which would
    poison every weight), naming the optimizer, the argument and what was expected."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and \
        not isinstance(value, bool) and math.isfinite(value) and value >= 0.0 and \
        (hi is None or value < hi)
    if not ok:
        want = f"in [0, {hi})" if hi is not None else ">= 0"
        raise ValueError(f"Invalid {what}: {value!r} ({optimizer}: argument '{arg}': "
                         f"expected a finite number {want})")


class AdamW(Optimizer):
    """PyTorch AdamW.

    At step t (from 1): ``p -= lr * wd * p``; ``m = b1 m + (1-b1) g``;
    ``v = b2 v + (1-b2) g^2``; ``p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)``.
    Moments are float32 (float64 for float64 parameters). With ``foreach=True`` (default)
    the parameters of a group that share dtypes and step count are updated by one
    ``gp.AdamWMultiTensorPlan`` launch; otherwise one ``gp.functional.adamw_step`` each.
    Both give the same bits.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, master_weights: bool = True,
                 foreach: bool = True) -> None:
        name = type(self).__name__
        check_hyperparameter(name, "lr", "learning rate", lr)
        check_hyperparameter(name, "eps", "epsilon value", eps)
        for i, beta in enumerate(betas):
            check_hyperparameter(name, "betas", f"beta parameter at index {i}", beta, hi=1.0)
        check_hyperparameter(name, "weight_decay", "weight_decay value", weight_decay)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps,
                                  "weight_decay": weight_decay}, master_weights)
        self.foreach = foreach

    def step(self) -> None:
        """One step of every parameter with a gradient. Under CUDA graph capture
        (gpuplan.graphs) the kernels read the step's factors from a device buffer that a
        before-replay hook refreshes (advancing the step count and taking the group's
        current lr), so every replay is the next step and follows the schedule; the state
        must exist by then (warm-up steps before capture)."""
        buckets: dict[tuple, list[tuple[dict, Any, dict, Any]]] = {}
        stream = None
        for group, p in self._params_with_grad():
            if stream is None:
                stream = gp.Stream.for_array(p.data)
                capturing = gp.graphs.is_capturing(stream)
            if capturing and "exp_avg" not in self.state.get(id(p), {}):
                raise gp.graphs.GraphCaptureError(
                    f"{type(self).__name__}.step(): optimizer state created during graph "
                    f"capture would be re-created at every replay: run warm-up steps before "
                    f"capture")
            state = self._param_state(p)
            if "exp_avg" not in state:
                state["exp_avg"] = self._zeros_like_master(p, state)
                state["exp_avg_sq"] = self._zeros_like_master(p, state)
            step = state["step"] + 1
            if not capturing:  # a replay's hook counts the captured step
                state["step"] = step
            target, lowp = self._target(p, state)
            grad = self._grad(group, p, target)
            key = (id(group), step, target.dtype, grad.dtype,
                   None if lowp is None else lowp.dtype, gp.device_of(target))
            buckets.setdefault(key, []).append((group, p, state, grad))
        for key, entries in buckets.items():
            group, step, dtype = entries[0][0], key[1], key[2]
            hyper = self._device_hyper(stream, entries, dtype) if capturing else None
            hp = dict(self._hyper(group, step), hyper=hyper)
            if self.foreach and len(entries) > 1 and all(_contiguous(e) for e in entries):
                self._multi_tensor_step(entries, hp)
            else:
                for _, p, state, grad in entries:
                    self._single_step(p, state, grad, hp)
            self._mark_stepped(e[1] for e in entries)

    def _device_hyper(self, stream: Any, entries: list, dtype: Any) -> Any:
        """A device buffer of the bucket's step factors (gp.functional.adamw_hyper) and the
        before-replay hook that advances its step count and refreshes it."""
        group = entries[0][0]
        buf = gp.empty((HYPER_SIZE,), dtype, device=stream.kind)

        def refresh() -> None:
            for _, _, state, _ in entries:
                state["step"] += 1
            hp = self._hyper(group, entries[0][2]["step"])
            gp.stream.upload(stream, buf, gp.functional.adamw_hyper(dtype, **hp))

        gp.graphs.before_replay(refresh, stream)
        return buf

    def _grad(self, group: dict, p: Any, target: Any) -> Any:
        """The gradient the step uses (Adam adds its L2 term here)."""
        return p.grad.data

    def _decoupled_decay(self, group: dict) -> float:
        """The plan's decoupled weight decay (``p *= 1 - lr * wd``): AdamW's own."""
        return float(group["weight_decay"])

    def _hyper(self, group: dict, step: int) -> dict[str, Any]:
        beta1, beta2 = group["betas"]
        return dict(lr=float(group["lr"]), beta1=float(beta1), beta2=float(beta2),
                    eps=float(group["eps"]), weight_decay=self._decoupled_decay(group),
                    step=int(step))

    def _single_step(self, p: Any, state: dict, grad: Any, hp: dict) -> None:
        target, lowp = self._target(p, state)
        gp.functional.adamw_step(target, grad, state["exp_avg"], state["exp_avg_sq"],
                                 param_lowp=lowp, **hp)

    def _multi_tensor_step(self, entries: list[tuple[dict, Any, dict, Any]], hp: dict) -> None:
        targets, lowps = zip(*(self._target(p, s) for _, p, s, _ in entries), strict=True)

        def flat(a: Any) -> Any:
            return a.reshape(-1)

        grads = [gp.backend.ascontiguous(g).reshape(-1) for _, _, _, g in entries]
        has_lowp = lowps[0] is not None
        desc = gp.AdamWMultiTensorDescriptor(
            sizes=tuple(int(t.size) for t in targets), dtype=targets[0].dtype,
            grad_dtype=grads[0].dtype, lowp_dtype=lowps[0].dtype if has_lowp else None)
        args = gp.AdamWMultiTensorArgs(
            params=[flat(t) for t in targets], grads=grads,
            exp_avgs=[flat(s["exp_avg"]) for _, _, s, _ in entries],
            exp_avg_sqs=[flat(s["exp_avg_sq"]) for _, _, s, _ in entries],
            params_lowp=[flat(lp) for lp in lowps] if has_lowp else None, **hp)
        gp.execute(gp.AdamWMultiTensorPlan, desc, args, like=targets[0])


def _contiguous(entry: tuple[dict, Any, dict, Any]) -> bool:
    """Flat views of in-place operands must alias them (else updates would be lost)."""
    _, p, state, _ = entry
    arrays = [p.data, state["exp_avg"], state["exp_avg_sq"], state.get("master", p.data)]
    return all(a.flags.c_contiguous for a in arrays)
