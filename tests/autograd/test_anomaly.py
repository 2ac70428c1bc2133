"""detect_anomaly: the first op whose forward output or backward gradient is not finite."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from autograd import anomaly, inplace
from autograd.function import Function
from autograd.nn import functional as F


class Log(Function):
    """y = log(x) (array-namespace math: these tests need no log plan)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        with np.errstate(invalid="ignore", divide="ignore"):
            return gp.array_namespace(x).log(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved
        return dy / x


class Sqrt(Function):
    """y = sqrt(x): finite at 0, but its gradient 1 / (2 sqrt(x)) is not."""

    @staticmethod
    def forward(ctx, x):
        y = x ** 0.5
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved
        with np.errstate(divide="ignore"):
            return dy * 0.5 / y


def leaf(values, device="cpu", requires_grad=True, dtype=np.float64):
    return ag.tensor(np.asarray(values, dtype=dtype), requires_grad=requires_grad,
                     device=device)


def here() -> str:
    """"file:line" of the caller's next line (where the op under test is created)."""
    return f"{__file__}:{sys._getframe(1).f_lineno + 1}"


def test_log_of_a_negative_names_the_op_and_the_line(device):
    x = leaf([1.0, -2.0, 3.0], device)
    with ag.detect_anomaly(), pytest.raises(ag.AnomalyError) as info:
        site = here()
        Log.apply(x)
    message = str(info.value)
    assert "Log forward produced non-finite values" in message
    assert "output 0 (shape (3,), float64); its inputs were finite" in message
    assert f"created at {site} in test_log_of_a_negative" in message
    assert "Forward call stack" in "".join(info.value.__notes__)


def test_without_anomaly_mode_the_nan_passes_silently(device):
    y = Log.apply(leaf([1.0, -2.0], device))
    assert np.isnan(y.numpy()[1])


def test_first_op_is_named_not_a_later_one(device):
    x = leaf([1000.0, 1.0], device)
    with ag.detect_anomaly(), pytest.raises(ag.AnomalyError, match=r"Unary\('exp'\) forward"):
        x.exp() * leaf([0.0, 1.0], device)      # exp overflows, then 0 * inf = nan


def test_zero_times_inf_from_outside_names_the_non_finite_input(device):
    zero, inf = leaf([0.0, 1.0], device), leaf([np.inf, 2.0], device, requires_grad=False)
    with ag.detect_anomaly(), pytest.raises(ag.AnomalyError) as info:
        zero * inf
    assert "Binary('mul') forward" in str(info.value)
    assert "input 1 (shape (2,), float64) was already non-finite" in str(info.value)


def test_backward_producing_inf_names_the_op(device):
    x = leaf([0.0, 4.0], device)
    with ag.detect_anomaly():
        site = here()
        y = Sqrt.apply(x)
        assert np.isfinite(y.numpy()).all()
        with pytest.raises(ag.AnomalyError) as info:
            (y * 3.0).sum().backward()
    message = str(info.value)
    assert ("Sqrt backward produced non-finite values (inf or nan) in the gradient of input 0 "
            "(shape (2,), float64); the gradients it received were finite") in message
    assert f"created at {site}" in message
    assert x.grad is None


def test_backward_check_without_a_recorded_forward(device):
    x = leaf([0.0], device)
    y = Sqrt.apply(x)
    with ag.detect_anomaly(), pytest.raises(ag.AnomalyError, match="Run the forward under"):
        y.backward(np.ones(1))


def test_large_finite_values_are_not_reported(device):
    """The norm of 1e30 (float32) overflows; the exact check clears it."""
    x = leaf([1e30, -3e38], device, dtype=np.float32)
    with ag.detect_anomaly():
        y = x * 1.0
    assert np.isfinite(y.numpy()).all()


def test_integer_outputs_and_empty_arrays_are_skipped(device):
    class WithIndex(Function):
        @staticmethod
        def forward(ctx, x):
            idx = gp.array_namespace(x).asarray(x.argmax(keepdims=True))
            ctx.mark_non_differentiable(idx)
            return x * 1, idx

        @staticmethod
        def backward(ctx, dy, didx):
            return dy

    with ag.detect_anomaly():
        WithIndex.apply(leaf([1.0, 5.0], device))
        leaf(np.zeros((0, 3)), device) * 2.0


def test_check_nan_false_records_sites_only(device):
    with ag.detect_anomaly(check_nan=False):
        y = Log.apply(leaf([-1.0], device))
    assert np.isnan(y.numpy()).all()
    assert anomaly.user_site(y._node.ctx._anomaly_stack).startswith(__file__)


def test_modes_nest_and_restore():
    assert not ag.is_anomaly_enabled()
    with ag.detect_anomaly():
        assert ag.is_anomaly_enabled()
        with ag.set_detect_anomaly(False):
            assert not ag.is_anomaly_enabled()
            Log.apply(leaf([-1.0]))          # not checked
        assert ag.is_anomaly_enabled()
    assert not ag.is_anomaly_enabled()
    ag.set_detect_anomaly(True)
    try:
        assert ag.is_anomaly_enabled()
    finally:
        ag.set_detect_anomaly(False)


def _small_network(device):
    rng = np.random.default_rng(0)
    arrays = [rng.uniform(-1, 1, s) for s in ((4, 6), (6, 6), (6,), (6,))]
    x, w, g, b = [leaf(a, device) for a in arrays]
    before = inplace.last_write
    with ag.Tape() as tape:
        h = F.layer_norm(F.gelu(F.linear(x, w, b)), 6, g, b)
        loss = F.cross_entropy(h, np.array([0, 5, 2, 1]))
    graph = [(n.fn, tuple(type(p).__name__ for p in n.parents)) for n in tape.nodes]
    sites = [getattr(n.ctx, "_anomaly_stack", None) for n in tape.nodes]
    wrote = inplace.last_write != before
    loss.backward()
    return graph, sites, wrote, [t.grad.numpy() for t in (x, w, g, b)]


def test_fast_path_records_the_same_graph(device):
    graph, sites, wrote, grads = _small_network(device)
    assert not wrote                           # forward stamps nothing
    assert all(s is None for s in sites)       # and records no call stack
    with ag.detect_anomaly():
        graph_a, sites_a, _, grads_a = _small_network(device)
    assert graph_a == graph and len(graph) == 4
    assert all(s for s in sites_a)
    for g, ga in zip(grads, grads_a, strict=True):
        np.testing.assert_array_equal(g, ga)
