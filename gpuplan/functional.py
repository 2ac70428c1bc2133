"""Functional API: one call per op on NumPy or CuPy arrays, returning fresh outputs.

Every function here is defined next to its plans in ``gpuplan/ops/<family>.py`` (listed in
that module's ``__functional__``) and re-exported here, so ``gpuplan.functional.softmax``
is the array-level entry point autograd builds on. Each call selects (cached) and runs
the plan on the stream where its inputs live.
"""

from __future__ import annotations

import importlib

from gpuplan.ops import FAMILIES

__all__: list[str] = []
for _family in FAMILIES:
    _mod = importlib.import_module(f"gpuplan.ops.{_family}")
    for _name in _mod.__functional__:
        globals()[_name] = getattr(_mod, _name)
        __all__.append(_name)
del _family, _mod, _name
