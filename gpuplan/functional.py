"""Functional API: one call per op on NumPy or CuPy arrays, returning fresh outputs.

Every function here is defined next to its plans in ``gpuplan/ops/<family>.py`` (listed in
that module's ``__functional__``) and re-exported here, so ``gpuplan.functional.softmax``
is the array-level entry point autograd builds on. Each call selects (cached) and runs
the plan on the stream where its inputs live.

The re-exported functions are guarded: a wrapper derives shapes from its arguments before
the plan validates them, so a non-array argument (a list, a string) or a 0-d array where
rows are needed would surface as Python's AttributeError/IndexError/TypeError without the
op's name. The guard costs nothing on success; on such an error it names the function,
the argument, what was expected and what was given (a `gp.InvalidProblem`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from gpuplan.errors import InvalidProblem, describe
from gpuplan.ops import FAMILIES


def _array_params(sig: inspect.Signature) -> dict[str, str]:
    """Parameters that take arrays, by annotation: 'Any' (an array), 'Any | None' (an array
    or None), 'list' (a sequence of arrays). Options are annotated str/bool/int/float."""
    kinds = {"Any": "array", "Any | None": "optional", "list": "sequence"}
    return {p.name: kinds[p.annotation] for p in sig.parameters.values()
            if p.annotation in kinds and p.name not in _NOT_ARRAYS}


#: 'Any'-annotated parameters that are not arrays (axes, shapes).
_NOT_ARRAYS = frozenset({"axes", "shape"})


def _culprit(sig: inspect.Signature, arrays: dict[str, str], args: tuple,
             kwargs: dict) -> tuple[str, str, str] | None:
    """(argument, expected, given) of the first array argument that is not an array, or is
    0-d; None when every one looks right (the error was something else)."""
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return None
    for name, value in bound.arguments.items():
        kind = arrays.get(name)
        if kind is None or (kind == "optional" and value is None):
            continue
        if kind == "sequence":
            if not isinstance(value, (tuple, list)):
                return name, "a sequence of arrays", type(value).__name__
            bad = [v for v in value if not (hasattr(v, "shape") and hasattr(v, "dtype"))]
            if bad:
                return name, "a sequence of arrays", f"one holding a {type(bad[0]).__name__}"
            continue
        if not (hasattr(value, "shape") and hasattr(value, "dtype")):
            return name, "an array", type(value).__name__
        if value.ndim == 0:
            return name, "an array of rank >= 1", "a 0-d array"
    return None


def _guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(fn)
    arrays = _array_params(sig)

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (AttributeError, IndexError, TypeError) as exc:
            found = _culprit(sig, arrays, args, kwargs)
            if found is None:
                raise
            raise InvalidProblem(describe(fn.__name__, *found)) from exc

    return guarded


__all__: list[str] = []
for _family in FAMILIES:
    _mod = importlib.import_module(f"gpuplan.ops.{_family}")
    for _name in _mod.__functional__:
        globals()[_name] = _guard(getattr(_mod, _name))
        __all__.append(_name)
del _family, _mod, _name
