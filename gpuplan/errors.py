"""Error hierarchy of the plan API: every rejected call raises a GpuPlanError subclass."""

from __future__ import annotations


class GpuPlanError(ValueError):
    """Base class of every error raised by a plan (select, can_implement, run)."""


class Unsupported(GpuPlanError):
    """The op has no kernel for this dtype, option, backend or preference."""


class InvalidProblem(GpuPlanError):
    """The descriptor or an operand is malformed (negative extent, wrong shape, ...)."""


class BufferTooSmall(GpuPlanError):
    """An operand holds fewer elements than the descriptor needs."""


class WorkspaceTooSmall(GpuPlanError):
    """The workspace passed to run() is smaller than plan.workspace_size()."""


class MisalignedOperand(GpuPlanError):
    """An operand's address is not aligned as the kernel requires."""


def describe(op: str, arg: str, expected: object, given: object) -> str:
    """The one message format: op, argument, what was expected and what was given."""
    return f"{op}: argument '{arg}': expected {expected}, given {given}"


class GraphCaptureError(RuntimeError):
    """Something in a captured region cannot be captured into a CUDA graph (a host sync, a
    pageable host copy, a value read back), or a replay would touch freed memory. The
    capture is abandoned; the stream works as before."""
