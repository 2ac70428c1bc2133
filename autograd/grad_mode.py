"""Grad mode: whether Function.apply records on a tape (no_grad / enable_grad / set_grad_enabled).

The flag is process-global (not thread-local): the runtime drives one training loop per
process, and a module attribute is the cheapest thing apply() can read on every op.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_enabled = True


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
