"""Parameter initialisers (torch.nn.init names and formulas), filling tensors in place.

Values are drawn in float64 on the host, from ``autograd.random.default_generator.host``
(reseeded by ``ag.manual_seed``) or a given ``np.random.Generator``, rounded to the
tensor's dtype once and copied into it: the same seed gives the same bits on every device
(as ``nn.Linear``'s own init). Each call runs under ``no_grad`` and is recorded as an
in-place write (autograd.inplace), so a graph that saved the old values refuses backward.

Fans: torch reads a weight as [out, in, *receptive]. A Linear weight here is [in, out]
(its ``_in_out_layout`` flag, set by nn.Linear and MultiheadAttention), so its fans are
read transposed: ``kaiming_uniform_(linear.weight)`` has torch's bound for that layer.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import numpy as np

import gpuplan as gp
from autograd import random
from autograd.grad_mode import no_grad
from autograd.inplace import record_write
from autograd.tensor import Tensor

__all__ = [
    "calculate_gain", "constant_", "kaiming_normal_", "kaiming_uniform_", "normal_", "ones_",
    "trunc_normal_", "uniform_", "xavier_normal_", "xavier_uniform_", "zeros_",
]


def _rng(generator: np.random.Generator | None) -> np.random.Generator:
    return random.default_generator.host if generator is None else generator


def _fill(tensor: Tensor, values: Any, what: str) -> Tensor:
    """Write host float64 `values` (or a scalar) into `tensor` in place."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"nn.init.{what}: expected a Tensor, given {type(tensor).__name__}")
    if not gp.dtypes.is_float(tensor.dtype):
        raise ValueError(f"nn.init.{what}: tensor must have a float dtype, given "
                         f"{tensor.dtype}")
    with no_grad():
        if np.ndim(values) == 0:
            tensor.data[...] = float(values)
        else:
            host = np.asarray(values, dtype=np.float64).astype(tensor.dtype)
            tensor.data[...] = gp.to_device(host, tensor.device)
    record_write(tensor, f"nn.init.{what}")
    return tensor


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """torch's recommended gains: 1 (linear, conv*, sigmoid), 5/3 (tanh), sqrt(2) (relu),
    sqrt(2 / (1 + slope^2)) (leaky_relu, slope default 0.01), 3/4 (selu)."""
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d", "sigmoid")
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = float(param)
        else:
            raise ValueError(f"calculate_gain: negative_slope {param!r} is not a number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def _fans(tensor: Tensor, what: str) -> tuple[int, int]:
    """(fan_in, fan_out) as torch computes them for the torch layout of `tensor`."""
    shape = tuple(tensor.shape)
    if len(shape) < 2:
        raise ValueError(f"nn.init.{what}: fan in and fan out need a tensor of 2 or more "
                         f"dims, given shape {shape}")
    if getattr(tensor, "_in_out_layout", False) and len(shape) == 2:
        shape = shape[::-1]  # stored [in, out]: torch's [out, in] is its transpose
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def zeros_(tensor: Tensor) -> Tensor:
    return _fill(tensor, 0.0, "zeros_")


def ones_(tensor: Tensor) -> Tensor:
    return _fill(tensor, 1.0, "ones_")


def constant_(tensor: Tensor, val: float) -> Tensor:
    return _fill(tensor, float(val), "constant_")


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0,
             generator: np.random.Generator | None = None) -> Tensor:
    """U(a, b)."""
    if not a <= b:
        raise ValueError(f"nn.init.uniform_: expected a <= b, given a={a}, b={b}")
    return _fill(tensor, _rng(generator).uniform(a, b, tensor.shape), "uniform_")


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0,
            generator: np.random.Generator | None = None) -> Tensor:
    """N(mean, std^2)."""
    if std < 0:
        raise ValueError(f"nn.init.normal_: std must be >= 0, given {std}")
    return _fill(tensor, _rng(generator).normal(mean, std, tensor.shape), "normal_")


def xavier_uniform_(tensor: Tensor, gain: float = 1.0,
                    generator: np.random.Generator | None = None) -> Tensor:
    """U(-a, a) with ``a = gain * sqrt(6 / (fan_in + fan_out))``."""
    fan_in, fan_out = _fans(tensor, "xavier_uniform_")
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return _fill(tensor, _rng(generator).uniform(-bound, bound, tensor.shape),
                 "xavier_uniform_")


def xavier_normal_(tensor: Tensor, gain: float = 1.0,
                   generator: np.random.Generator | None = None) -> Tensor:
    """N(0, std^2) with ``std = gain * sqrt(2 / (fan_in + fan_out))``."""
    fan_in, fan_out = _fans(tensor, "xavier_normal_")
    std = gain * math.sqrt(2.0 / (fan_in + fan_out))
    return _fill(tensor, _rng(generator).normal(0.0, std, tensor.shape), "xavier_normal_")


def _kaiming_std(tensor: Tensor, a: float, mode: str, nonlinearity: str, what: str) -> float:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"nn.init.{what}: mode must be 'fan_in' or 'fan_out', given {mode!r}")
    fan_in, fan_out = _fans(tensor, what)
    fan = fan_in if mode == "fan_in" else fan_out
    if fan == 0:
        raise ValueError(f"nn.init.{what}: cannot initialise a tensor with {mode} = 0 "
                         f"(shape {tuple(tensor.shape)})")
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu",
                     generator: np.random.Generator | None = None) -> Tensor:
    """U(-b, b) with ``b = sqrt(3) * gain(nonlinearity, a) / sqrt(fan)``."""
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity, "kaiming_uniform_")
    return _fill(tensor, _rng(generator).uniform(-bound, bound, tensor.shape),
                 "kaiming_uniform_")


def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu",
                    generator: np.random.Generator | None = None) -> Tensor:
    """N(0, std^2) with ``std = gain(nonlinearity, a) / sqrt(fan)``."""
    std = _kaiming_std(tensor, a, mode, nonlinearity, "kaiming_normal_")
    return _fill(tensor, _rng(generator).normal(0.0, std, tensor.shape), "kaiming_normal_")


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0,
                  b: float = 2.0, generator: np.random.Generator | None = None) -> Tensor:
    """N(mean, std^2) truncated to [a, b] (bounds in the values' units, as torch). Draws
    normals and redraws those outside [a, b] (exactly the truncated distribution; vectorised)
    while [a, b] holds at least 5% of the mass; otherwise torch's inverse-CDF method,
    ``mean + std * Phi^-1(U(Phi(alpha), Phi(beta)))`` per element (NumPy has no erfinv)."""
    if not a < b or std <= 0:
        raise ValueError(f"nn.init.trunc_normal_: expected a < b and std > 0, given a={a}, "
                         f"b={b}, std={std}")
    rng, shape = _rng(generator), tuple(tensor.shape)
    unit = NormalDist()
    lo, hi = unit.cdf((a - mean) / std), unit.cdf((b - mean) / std)
    if hi - lo >= 0.05:
        x = rng.normal(mean, std, shape)
        outside = (x < a) | (x > b)
        while outside.any():
            x[outside] = rng.normal(mean, std, int(outside.sum()))
            outside = (x < a) | (x > b)
    else:
        u = np.clip(rng.uniform(lo, hi, shape).reshape(-1), np.nextafter(0.0, 1.0), 1 - 1e-16)
        z = np.fromiter(map(unit.inv_cdf, u), np.float64, u.size).reshape(shape)
        x = np.clip(mean + std * z, a, b)  # against rounding at the bounds
    return _fill(tensor, x, "trunc_normal_")
