"""Grad mode: whether Function.apply records (no_grad, enable_grad, inference_mode, ...).

The flag is process-global (not thread-local): the runtime drives one training loop per
process, and a module attribute is the cheapest thing apply() can read on every op.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_enabled = True
#: True inside inference_mode(): Tensors created then are marked inference tensors.
_inference = False
#: True once inference_mode() has been entered in this process: only then can an inference
#: tensor exist, and Function.apply look for one among its inputs.
_inference_used = False


def is_grad_enabled() -> bool:
    """True when ops record on the current tape."""
    return _enabled


class set_grad_enabled:  # noqa: N801 - PyTorch's name
    """Set grad mode to `mode` now; as a context manager, restore the previous mode on exit."""

    def __init__(self, mode: bool) -> None:
        global _enabled
        self._prev = _enabled
        _enabled = bool(mode)

    def __enter__(self) -> set_grad_enabled:
        return self

    def __exit__(self, *exc: object) -> None:
        global _enabled
        _enabled = self._prev


class _GradModeContext:
    _mode = True

    def __enter__(self) -> _GradModeContext:
        global _enabled
        self._prev = _enabled
        _enabled = self._mode
        return self

    def __exit__(self, *exc: object) -> None:
        global _enabled
        _enabled = self._prev

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Use as a decorator: run `fn` in this mode."""
        mode = self._mode

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = _GradModeContext()
            ctx._mode = mode
            with ctx:
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_GradModeContext):  # noqa: N801 - PyTorch's name
    """Ops run inside do not record: their outputs do not require grad."""

    _mode = False


class enable_grad(_GradModeContext):  # noqa: N801 - PyTorch's name
    """Re-enable recording inside a no_grad block."""

    _mode = True


class inference_mode:  # noqa: N801 - PyTorch's name
    """No recording (as no_grad), and every Tensor created inside is an *inference tensor*
    (``t.is_inference()``): outside inference mode it may be read by ops that do not record,
    but an in-place update of it, ``requires_grad_()`` on it, or `Tensor.__setitem__` /
    ``add_`` etc. raise RuntimeError, as in PyTorch. A context manager and a decorator;
    ``inference_mode(False)`` changes nothing (PyTorch's behaviour)."""

    def __init__(self, mode: bool = True) -> None:
        self._mode = bool(mode)

    def __enter__(self) -> inference_mode:
        global _enabled, _inference, _inference_used
        self._prev = (_enabled, _inference)
        if self._mode:
            _enabled, _inference, _inference_used = False, True, True
        return self

    def __exit__(self, *exc: object) -> None:
        global _enabled, _inference
        _enabled, _inference = self._prev

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Use as a decorator: run `fn` in inference mode."""
        mode = self._mode

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with inference_mode(mode):
                return fn(*args, **kwargs)

        return wrapper


def is_inference_mode_enabled() -> bool:
    """True inside inference_mode()."""
    return _inference
