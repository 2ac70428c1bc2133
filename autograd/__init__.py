"""autograd: a small tape-based autograd over gpuplan (Tensor, Tape, Function, gradcheck).

``autograd.nn`` and ``autograd.optim`` load on first access (``ag.nn``) or by import.
"""

from __future__ import annotations

import importlib as _importlib
from typing import Any as _Any

# autograd.tensor first: it binds the op modules, which import Function.
from autograd import random
from autograd import tensor as _tensor_module
from autograd.anomaly import AnomalyError, detect_anomaly, is_anomaly_enabled, set_detect_anomaly
from autograd.checkpoint import checkpoint
from autograd.factories import (
    arange,
    eye,
    full,
    full_like,
    ones,
    ones_like,
    rand,
    randint,
    randn,
    tensor,
    zeros,
    zeros_like,
)
from autograd.function import Context, Function
from autograd.functions.activation import abs, clamp, clip, log, rsqrt, sigmoid, silu, sqrt
from autograd.functions.arithmetic import (
    floor_divide,
    maximum,
    minimum,
    pow,
    promote_types,
    remainder,
    result_type,
)
from autograd.functions.indexing import gather, index_select, scatter_add
from autograd.functions.logical import (
    all,
    any,
    bitwise_and,
    bitwise_not,
    bitwise_or,
    bitwise_xor,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
)
from autograd.functions.reduce import (
    amax,
    amin,
    argmax,
    argmin,
    max,
    mean,
    min,
    prod,
    std,
    sum,
    topk,
    var,
)
from autograd.functions.select import masked_fill, tril, triu, where
from autograd.functions.shape import broadcast_to, cat, chunk, split, stack
from autograd.grad_mode import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from autograd.gradcheck import GradcheckError, gradcheck
from autograd.interop import from_dlpack
from autograd.random import manual_seed
from autograd.serialization import load, save
from autograd.tape import Tape, current_tape
from autograd.tensor import Tensor

__all__ = [
    "Tensor", "tensor", "zeros", "ones", "full", "randn", "Tape", "current_tape", "Function",
    "Context", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "gradcheck",
    "GradcheckError", "cat", "split", "chunk", "stack", "broadcast_to", "sum", "mean", "max",
    "min", "prod", "amax", "amin", "argmax", "argmin", "topk", "var", "std", "gather",
    "scatter_add", "index_select",
    "manual_seed", "random", "nn", "optim", "detect_anomaly", "set_detect_anomaly",
    "is_anomaly_enabled", "AnomalyError", "arange", "zeros_like", "ones_like", "full_like",
    "rand", "randint", "eye", "from_dlpack", "inference_mode", "is_inference_mode_enabled",
    "save", "load", "checkpoint",
    "abs", "clamp", "clip", "log", "sqrt", "rsqrt", "sigmoid", "silu", "maximum", "minimum",
    "pow", "where", "masked_fill", "tril", "triu",
    "remainder", "floor_divide", "result_type", "promote_types", "any", "all", "bitwise_and",
    "bitwise_or", "bitwise_xor", "bitwise_not", "logical_and", "logical_or", "logical_xor",
    "logical_not",
]


def __getattr__(name: str) -> _Any:
    if name in ("nn", "optim"):
        return _importlib.import_module(f"autograd.{name}")
    raise AttributeError(f"module 'autograd' has no attribute {name!r}")
