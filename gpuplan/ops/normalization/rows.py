"""[rows, dim] views of [..., dim] operands for the row-wise norm families, and the named
error for a per-row statistic (mean, rstd) whose size does not match the rows."""

from __future__ import annotations

import math
from typing import Any

from gpuplan import backend
from gpuplan.errors import InvalidProblem, describe


def rows_view(a: Any) -> Any:
    """A C-contiguous [rows, dim] view (or copy) of a [..., dim] array."""
    if not a.flags.c_contiguous:
        a = backend.ascontiguous(a)
    return a if a.ndim == 2 else a.reshape(math.prod(a.shape[:-1]), a.shape[-1])


def stat_error(op: str, x: Any, x_name: str, **stats: Any) -> InvalidProblem:
    """The error for the first statistic that is not one value per row of x (built only
    after its reshape failed, so a right call pays nothing for the check)."""
    lead = tuple(x.shape[:-1])
    rows = math.prod(lead)
    name, a = next(((k, v) for k, v in stats.items() if v.size != rows),
                   next(iter(stats.items())))
    return InvalidProblem(describe(op, name, f"shape {lead} (one value per row of '{x_name}')",
                                   f"shape {tuple(a.shape)}"))
