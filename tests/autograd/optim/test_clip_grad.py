"""clip_grad_norm_ is get_total_norm then clip_grads_with_norm_ (the split a model-parallel
clip uses: a norm summed over ranks, then the same scaling)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from autograd import optim
from autograd.nn import Parameter


def params_with_grads(values: list[float]) -> list[Parameter]:
    params = []
    for i, v in enumerate(values):
        p = Parameter(np.zeros((i + 2,), np.float64))
        p.grad = ag.tensor(np.full((i + 2,), v))
        params.append(p)
    return params


def test_get_total_norm_of_tensors_and_arrays():
    params = params_with_grads([3.0, 4.0])
    want = math.sqrt(9 * 2 + 16 * 3)
    assert optim.get_total_norm([p.grad for p in params]) == pytest.approx(want, rel=1e-15)
    assert optim.get_total_norm([p.grad.data for p in params]) == pytest.approx(want,
                                                                               rel=1e-15)
    assert optim.get_total_norm([]) == 0.0


def test_clip_grads_with_norm_scales_only_below_one():
    params = params_with_grads([3.0, 4.0])
    optim.clip_grads_with_norm_(params, max_norm=10.0, total_norm=5.0)
    assert all(np.all(p.grad.data == v) for p, v in zip(params, [3.0, 4.0], strict=True))
    optim.clip_grads_with_norm_(params, max_norm=1.0, total_norm=4.0, eps=0.0)
    np.testing.assert_array_equal(params[0].grad.data, np.full(2, 0.75))
    np.testing.assert_array_equal(params[1].grad.data, np.full(3, 1.0))


def test_clip_grad_norm_is_the_two_steps_bitwise():
    a, b = params_with_grads([0.3, -1.7, 2.9]), params_with_grads([0.3, -1.7, 2.9])
    total = optim.clip_grad_norm_(iter(a), 0.5)  # a generator is read once
    assert total == optim.get_total_norm([p.grad for p in b])
    optim.clip_grads_with_norm_(b, 0.5, total)
    for p, q in zip(a, b, strict=True):
        np.testing.assert_array_equal(p.grad.data, q.grad.data)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, gp.bfloat16])
def test_clip_grad_norm_on_a_device_is_the_two_steps_bitwise(device, dtype):
    """One plan call (norm and scaling of every gradient) against get_total_norm then
    clip_grads_with_norm_, and against float64: scaled only when max_norm / total < 1."""
    rng = np.random.default_rng(3)
    values = [rng.uniform(-1, 1, s).astype(dtype) for s in ((40, 3), (17,), (0,), (5, 5))]

    def params():
        out = []
        for v in values:
            p = Parameter(gp.to_device(np.zeros(v.shape, dtype), device))
            p.grad = ag.tensor(v.copy(), device=device)
            out.append(p)
        return out

    for max_norm in (0.5, 100.0):
        a, b = params(), params()
        total = optim.clip_grad_norm_(a, max_norm)
        assert total == optim.get_total_norm([p.grad for p in b])
        assert total == pytest.approx(math.sqrt(sum(float((v.astype(np.float64) ** 2).sum())
                                                    for v in values)), rel=1e-5)
        optim.clip_grads_with_norm_(b, max_norm, total)
        coef = min(max_norm / (total + 1e-6), 1.0)
        for p, q, v in zip(a, b, values, strict=True):
            got = gp.to_host(p.grad.data)
            np.testing.assert_array_equal(got.view(np.uint8), gp.to_host(q.grad.data)
                                          .view(np.uint8))
            np.testing.assert_allclose(got.astype(np.float64), coef * v.astype(np.float64),
                                       rtol=1e-2 if dtype == gp.bfloat16 else 1e-6)


@pytest.mark.parametrize("value,dtype", [(1e20, np.float32), (1e-30, np.float32),
                                         (1e200, np.float64), (1e-200, np.float64)])
def test_norms_of_huge_and_tiny_gradients_are_finite_and_exact(value, dtype):
    """1e20 float32 gradients gave an inf norm (and clipping zeroed them), 1e-30 ones 0:
    the global norm is scaled now; the clipped gradients have norm max_norm."""
    params = []
    for i, n in enumerate((3, 5000)):
        p = Parameter(np.zeros((n,), dtype))
        p.grad = ag.tensor(np.full((n,), value * (i + 1), dtype))
        params.append(p)
    want = math.hypot(*(float(x) for p in params for x in p.grad.data))
    total = optim.get_total_norm([p.grad for p in params])
    assert total == pytest.approx(want, rel=1e-6, abs=0)
    got = optim.clip_grad_norm_(params, max_norm=1e-3)
    assert got == pytest.approx(want, rel=1e-6, abs=0)
    if want > 1e-3:
        assert optim.get_total_norm([p.grad for p in params]) == pytest.approx(1e-3, rel=1e-5)


def test_a_nan_gradient_still_gives_a_nan_norm():
    """Scaling never hides a non-finite gradient (what train.py --on-nonfinite checks)."""
    params = params_with_grads([1e200, 1e-200])
    params[1].grad.data[1] = np.nan
    assert math.isnan(optim.get_total_norm([p.grad for p in params]))
    assert math.isnan(optim.clip_grad_norm_(params, 1.0))
