"""gradcheck: compare a Function's analytic gradients with central differences in float64."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import gpuplan as gp
from autograd.grad_mode import no_grad
from autograd.tape import Tape, run_backward
from autograd.tensor import Tensor
from gpuplan import backend
from gpuplan.dtypes import is_float


class GradcheckError(AssertionError):
    """Analytic and numerical gradients disagree (the message gives the worst element)."""


def _outputs(out: Any) -> list[Tensor]:
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o for o in outs if isinstance(o, Tensor) and is_float(o.dtype)]


def gradcheck(fn: Callable[..., Any], inputs: Sequence[Any], eps: float = 1e-6,
              atol: float = 1e-5, rtol: float = 1e-3, seed: int = 0) -> bool:
    """Check every requires_grad input's gradient of ``fn(*inputs)``.

    With fixed random cotangents u_k (one per float output), L = sum_k <u_k, out_k>: the
    analytic dL/dx (one backward) is compared with (L(x + eps e_i) - L(x - eps e_i)) / 2eps
    for every element i of every input that requires grad. Inputs must be float64.
    Returns True or raises GradcheckError naming the worst mismatch.
    """
    inputs = list(inputs)
    checked = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    if not checked:
        raise ValueError("gradcheck: no input requires grad")
    for i in checked:
        if inputs[i].dtype != np.float64:
            raise ValueError(f"gradcheck: input {i} must be float64, given {inputs[i].dtype}")
        inputs[i].data = backend.ascontiguous(inputs[i].data)
    saved_grads = [inputs[i].grad for i in checked]
    for i in checked:
        inputs[i].grad = None
    try:
        with Tape() as tape:
            outs = _outputs(fn(*inputs))
        rng = np.random.default_rng(seed)
        cot = [rng.standard_normal(o.shape) for o in outs]
        roots = [(o, gp.asarray(u, dtype=o.dtype, device=o.device))
                 for o, u in zip(outs, cot, strict=True) if o.requires_grad]
        if roots:
            run_backward(roots, owner=tape)
        analytic = {i: (np.zeros(inputs[i].shape) if inputs[i].grad is None
                        else gp.to_host(inputs[i].grad.data).astype(np.float64))
                    for i in checked}
        worst = None
        for i in checked:
            numeric = _numeric_grad(fn, inputs, i, cot, eps)
            err = np.abs(analytic[i] - numeric) - (atol + rtol * np.abs(numeric))
            if err.size and (worst is None or err.max() > worst[0]):
                j = int(np.argmax(err))
                worst = (float(err.max()), i, np.unravel_index(j, err.shape),
                         analytic[i].reshape(-1)[j], numeric.reshape(-1)[j])
        if worst is not None and worst[0] > 0:
            _, i, where, a, n = worst
            raise GradcheckError(
                f"gradcheck: gradient of input {i} at {tuple(int(w) for w in where)}: "
                f"analytic {a:.10g} vs numerical {n:.10g} (atol={atol}, rtol={rtol})")
        return True
    finally:
        for i, g in zip(checked, saved_grads, strict=True):
            inputs[i].grad = g


def _loss(fn: Callable[..., Any], inputs: list, cot: list[np.ndarray]) -> float:
    with no_grad():
        outs = _outputs(fn(*inputs))
    return float(sum(np.sum(gp.to_host(o.data).astype(np.float64) * u)
                     for o, u in zip(outs, cot, strict=True)))


def _numeric_grad(fn: Callable[..., Any], inputs: list, i: int, cot: list[np.ndarray],
                  eps: float) -> np.ndarray:
    x = inputs[i]
    flat = x.data.reshape(-1)
    grad = np.zeros(flat.shape[0])
    for j in range(flat.shape[0]):
        orig = flat[j].item()
        flat[j] = orig + eps
        plus = _loss(fn, inputs, cot)
        flat[j] = orig - eps
        minus = _loss(fn, inputs, cot)
        flat[j] = orig
        grad[j] = (plus - minus) / (2 * eps)
    return grad.reshape(x.shape)
