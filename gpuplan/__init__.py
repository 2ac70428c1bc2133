"""gpuplan: kernel plans (descriptor -> selected SKU -> validated launch) over NumPy or CuPy.

Importing gpuplan never touches CUDA: kernels compile lazily, per device, on first use.
"""

import importlib as _importlib

from gpuplan import functional, graphs
from gpuplan.backend import (
    array_namespace,
    asarray,
    device_available,
    device_of,
    empty,
    full,
    is_device_array,
    to_device,
    to_host,
    zeros,
)
from gpuplan.dtypes import FLOAT_DTYPES, INDEX_DTYPES, bfloat16
from gpuplan.errors import (
    BufferTooSmall,
    GpuPlanError,
    InvalidProblem,
    MisalignedOperand,
    Unsupported,
    WorkspaceTooSmall,
)
from gpuplan.execute import concurrently, execute
from gpuplan.ops import FAMILIES as _FAMILIES
from gpuplan.plan import (
    BackendKind,
    KernelSku,
    Plan,
    PlanPreference,
    PrecisionGuarantee,
)
from gpuplan.stream import Stream, Workspace

# Re-export every family's plan, descriptor and args classes (gp.EmbeddingPlan, ...).
for _family in _FAMILIES:
    _mod = _importlib.import_module(f"gpuplan.ops.{_family}")
    for _name in _mod.__all__:
        globals()[_name] = getattr(_mod, _name)
del _family, _mod, _name

__version__ = "0.1.0"
