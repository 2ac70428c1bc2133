"""Plan families, one folder per op family: ``gpuplan/ops/<family>/``.

A family folder holds everything about its ops (docs/adding_an_op.md walks through one):

- ``__init__.py``: the public names, listed in ``__all__`` (descriptors, args, plans:
  re-exported as ``gpuplan.<Name>``) and ``__functional__`` (array-level wrappers: array in,
  fresh arrays out, re-exported by ``gpuplan.functional``; what autograd calls);
- ``plans.py`` (and more modules where the family is large): the descriptors, args and plans;
- ``<name>.cu``: the CUDA kernels (shared headers are in ``gpuplan/ops/include/``);
- ``host.py`` where the NumPy implementation is more than a few lines in the plans;
- ``reference.py``: an independent float64 reference written from the math;
- ``cases.py``: the kernel cases (``CASES``), run on the device under test by pytest and by
  ``scripts/check_kernels.py --execute``.

The registry is the folders: a folder of this package with an ``__init__.py`` is a family
(``include/``, headers only, is not).
"""

from __future__ import annotations

import pkgutil
from pathlib import Path


def families(paths: list[str] | None = None) -> tuple[str, ...]:
    """The family folders on `paths` (default: this package's search path), sorted."""
    found = {m.name for m in pkgutil.iter_modules(paths if paths is not None else __path__)
             if m.ispkg}
    return tuple(sorted(found))


def folder(family: str) -> Path:
    """The folder of `family` on this package's search path."""
    for base in __path__:
        p = Path(base) / family
        if (p / "__init__.py").is_file():
            return p
    raise KeyError(f"gpuplan.ops: no family folder {family!r}; families: {', '.join(families())}")


#: The families shipped with gpuplan (their folders, read once at import).
FAMILIES: tuple[str, ...] = families()
