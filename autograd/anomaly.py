"""Anomaly mode: name the first op whose forward output or backward gradient is not finite.

``with autograd.detect_anomaly(): ...`` (PyTorch's name) makes every Function.apply record
the call stack of its forward and check its float outputs, and every node's backward
check the gradients it returns; the first non-finite one raises `AnomalyError` naming the
op, the direction, the output or input, and the user's source line that created the op
(the innermost frame outside the autograd package; the whole stack is in the
exception's notes). The in-place check (autograd.inplace) also names that line.

The check is one ``gp.functional.global_l2_norm`` over the arrays and a host read of its
0-d result; a non-finite norm is confirmed per array with ``sum(0 * x)`` (nan exactly when
x holds an inf or a nan), so a finite norm that overflows is not reported. It is slow
(one device sync per op), as PyTorch's anomaly mode is: a debugging tool. Off (the
default), apply and backward read one module flag.
"""

from __future__ import annotations

import linecache
import math
import os
import sys
from typing import Any

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import is_float

_enabled = False
_check_nan = True

_LIBRARY = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STACK_LIMIT = 40


class AnomalyError(RuntimeError):
    """An op produced non-finite values under detect_anomaly (forward or backward)."""


def is_anomaly_enabled() -> bool:
    return _enabled


def is_anomaly_check_nan_enabled() -> bool:
    return _enabled and _check_nan


class set_detect_anomaly:  # noqa: N801 - PyTorch's name
    """Set anomaly mode now; as a context manager, restore the previous mode on exit.

    check_nan=False records creation sites (for error messages) without checking values.
    """

    def __init__(self, mode: bool, check_nan: bool = True) -> None:
        global _enabled, _check_nan
        self._prev = (_enabled, _check_nan)
        _enabled, _check_nan = bool(mode), bool(check_nan)

    def __enter__(self) -> set_detect_anomaly:
        return self

    def __exit__(self, *exc: object) -> None:
        global _enabled, _check_nan
        _enabled, _check_nan = self._prev


class detect_anomaly:  # noqa: N801 - PyTorch's name
    """Context manager: anomaly mode inside (see the module docstring)."""

    def __init__(self, check_nan: bool = True) -> None:
        self.check_nan = check_nan

    def __enter__(self) -> detect_anomaly:
        self._mode = set_detect_anomaly(True, self.check_nan)
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__()


# -- where an op was created ------------------------------------------------------------------


def capture_stack(depth: int = 1) -> tuple[tuple[str, int, str], ...]:
    """(file, line, function) of the caller's caller (`depth` frames up) and outwards,
    innermost first."""
    frames = []
    f = sys._getframe(depth + 1)
    while f is not None and len(frames) < _STACK_LIMIT:
        frames.append((f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    return tuple(frames)


def user_site(stack: tuple) -> str:
    """"file:line in function" of the innermost frame outside the autograd package."""
    for filename, line, name in stack:
        if not os.path.abspath(filename).startswith(_LIBRARY):
            return f"{filename}:{line} in {name}"
    filename, line, name = stack[-1]
    return f"{filename}:{line} in {name}"


def format_stack(stack: tuple) -> str:
    lines = []
    for filename, line, name in reversed(stack):
        lines.append(f'  File "{filename}", line {line}, in {name}')
        text = linecache.getline(filename, line).strip()
        if text:
            lines.append(f"    {text}")
    return "\n".join(lines)


def op_name(fn: type, ctx: Any) -> str:
    """The Function's name, with its op when one class serves several (Unary('exp'))."""
    name = getattr(ctx, "name", None)
    return f"{fn.__name__}({name!r})" if isinstance(name, str) else fn.__name__


# -- finiteness ---------------------------------------------------------------------------------


def _float_arrays(values: Any) -> list[tuple[int, Any]]:
    out = []
    for k, a in enumerate(values):
        if hasattr(a, "data") and hasattr(a, "grad"):  # a Tensor
            a = a.data
        if hasattr(a, "dtype") and is_float(a.dtype) and a.size:
            out.append((k, a))
    return out


def _all_finite(arrays: list) -> bool:
    with np.errstate(over="ignore", invalid="ignore"):
        return math.isfinite(float(gp.to_host(gp.functional.global_l2_norm(arrays))))


def _is_finite(a: Any) -> bool:
    """Exact: ``sum(0 * a)`` is 0 for finite values and nan as soon as one is inf or nan."""
    with np.errstate(over="ignore", invalid="ignore"):
        zeros = gp.functional.unary("scale", a, alpha=0.0)
        return math.isfinite(float(gp.to_host(gp.functional.reduce("sum", zeros))))


def nonfinite(values: Any) -> list[int]:
    """Positions in `values` (arrays, Tensors or None) of float arrays holding an inf/nan."""
    arrays = _float_arrays(values)
    if not arrays or _all_finite([a for _, a in arrays]):
        return []
    return [k for k, a in arrays if not _is_finite(a)]


def _describe(a: Any) -> str:
    a = a.data if hasattr(a, "grad") else a
    return f"shape {tuple(a.shape)}, {a.dtype}"


def _raise(message: str, stack: tuple | None) -> None:
    err = AnomalyError(message)
    if stack:
        err.add_note("Forward call stack of the op (innermost last):\n" + format_stack(stack))
    raise err


# -- hooks called by Function.apply and the backward engine ------------------------------------


def on_forward(fn: type, ctx: Any, out: Any, inputs: list) -> None:
    """Record where the op was created; raise if an output is not finite."""
    stack = capture_stack(2)
    ctx._anomaly_stack = stack
    if not _check_nan:
        return
    outs = out if type(out) is tuple else (out,)
    bad = nonfinite(outs)
    if not bad:
        return
    k = bad[0]
    bad_in = nonfinite(inputs)
    cause = (f"input {bad_in[0]} ({_describe(inputs[bad_in[0]])}) was already non-finite"
             if bad_in else "its inputs were finite")
    _raise(f"autograd.detect_anomaly: {op_name(fn, ctx)} forward produced non-finite values "
           f"(inf or nan) in output {k} ({_describe(outs[k])}); {cause}. The op was created "
           f"at {user_site(stack)}.", stack)


def on_backward(node: Any, grad_outputs: list, grads: tuple) -> None:
    """Raise if a gradient that `node`'s backward returned is not finite."""
    if not _check_nan:
        return
    bad = nonfinite(grads)
    if not bad:
        return
    i = bad[0]
    bad_in = nonfinite(grad_outputs)
    cause = (f"the gradient it received for output {bad_in[0]} was already non-finite"
             if bad_in else "the gradients it received were finite")
    stack = getattr(node.ctx, "_anomaly_stack", None)
    where = (f"The op was created at {user_site(stack)}." if stack else
             "Run the forward under detect_anomaly too to see where the op was created.")
    _raise(f"autograd.detect_anomaly: {op_name(node.fn, node.ctx)} backward produced "
           f"non-finite values (inf or nan) in the gradient of input {i} "
           f"({_describe(grads[i])}); {cause}. {where}", stack)
