"""Function.apply refuses to save an inference tensor for backward (torch's rule)."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag


def test_inference_tensor_saved_for_backward_raises():
    with ag.inference_mode():
        x = ag.tensor(np.ones(3))
    w = ag.tensor(np.full(3, 2.0), requires_grad=True)
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        _ = x * w  # mul saves both operands
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        _ = ag.maximum(w, x)  # saved as the second operand
    y = x + w  # add saves nothing: allowed, as torch
    y.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.ones(3))
    with ag.no_grad():
        np.testing.assert_array_equal((x * w).numpy(), np.full(3, 2.0))  # not recorded
    z = x.clone() * w  # the documented work-around
    z.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.full(3, 2.0))
