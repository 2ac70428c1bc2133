"""The functional API's guard: a non-array or 0-d argument where a wrapper needs an array is
a gp.InvalidProblem naming the function and the argument (not Python's AttributeError or
IndexError from the wrapper's shape arithmetic); other errors pass through unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp

F = gp.functional
X = np.ones((3, 4), np.float32)


@pytest.mark.parametrize("call, words", [
    (lambda: F.unary("relu", [1.0, 2.0]), ("unary: argument 'x'", "an array", "list")),
    (lambda: F.matmul(X, "b"), ("matmul: argument 'b'", "an array", "str")),
    (lambda: F.softmax(np.float32(3.0)), ("softmax: argument 'x'", "rank >= 1", "0-d")),
    (lambda: F.rms_norm(np.float32(3.0), None), ("rms_norm: argument 'x'", "rank >= 1")),
    (lambda: F.layer_norm(X, None, 3), ("layer_norm: argument 'bias'", "an array", "int")),
    (lambda: F.global_l2_norm(3), ("global_l2_norm: argument 'arrays'",
                                   "a sequence of arrays", "int")),
])
def test_non_arrays_are_named(call, words):
    with pytest.raises(gp.InvalidProblem) as info:
        call()
    for w in words:
        assert w in str(info.value)


def test_other_errors_are_not_rewritten():
    with pytest.raises(gp.Unsupported, match="unary: argument 'op'"):
        F.unary("softplus", X)
    with pytest.raises(TypeError):  # a wrong call signature stays Python's error
        F.unary("relu")


def test_the_guard_keeps_the_wrapped_function():
    from gpuplan.ops.activation import plans as activation
    assert F.unary.__wrapped__ is activation.unary and F.unary.__name__ == "unary"
    np.testing.assert_array_equal(F.unary("neg", X), -X)
