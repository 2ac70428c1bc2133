"""nll_loss (weights, ignore_index, reductions, class dim 1), cross_entropy with weight, one_hot
and mse_loss reductions, against NumPy; gradchecks; bad input."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd.nn import functional as F
from tests.helpers import gradcheck_on

RNG = np.random.default_rng(3)
LOGP = np.log(np.random.default_rng(1).dirichlet(np.ones(5), size=6))
T = np.array([1, 4, -100, 0, 3, 4])
W = np.array([0.5, 2.0, 1.0, 3.0, 0.25])


def _ref_nll(x, t, w=None, ignore_index=-100, reduction="mean"):
    w = np.ones(x.shape[1]) if w is None else w
    keep = t != ignore_index
    tt = np.where(keep, t, 0)
    coef = np.where(keep, w[tt], 0.0)
    loss = -coef * x[np.arange(len(t)), tt]
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.sum() / coef.sum()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weight", [None, W])
def test_nll_loss_matches_numpy_and_gradchecks(device, reduction, weight):
    def fn(x):
        return F.nll_loss(x, T, weight=weight, reduction=reduction)

    got = fn(ag.tensor(LOGP, device=device))
    assert got.shape == (() if reduction != "none" else T.shape)
    np.testing.assert_allclose(got.numpy(), _ref_nll(LOGP, T, weight, reduction=reduction),
                               rtol=1e-12)
    gradcheck_on(device, fn, LOGP)


def test_nll_loss_class_dim_one_and_unbatched():
    x = RNG.standard_normal((2, 5, 3))
    t = np.array([[0, 4, 2], [1, -100, 3]])
    flat = x.transpose(0, 2, 1).reshape(-1, 5)
    got = F.nll_loss(ag.tensor(x), t, reduction="none").numpy()
    np.testing.assert_allclose(got, _ref_nll(flat, t.reshape(-1), reduction="none").reshape(2, 3))
    one = F.nll_loss(ag.tensor(LOGP[0]), np.array(2)).item()
    assert one == pytest.approx(-LOGP[0, 2])


def test_nll_loss_all_ignored_mean_is_nan_like_torch():
    got = F.nll_loss(ag.tensor(LOGP[:2]), np.array([-100, -100])).item()
    assert np.isnan(got)


def test_cross_entropy_with_weight_is_weighted_nll():
    x = RNG.standard_normal((6, 5))
    logp = x - np.log(np.exp(x).sum(1, keepdims=True))
    got = F.cross_entropy(ag.tensor(x), T, weight=W).item()
    assert got == pytest.approx(_ref_nll(logp, T, W), rel=1e-12)
    gradcheck_on("cpu", lambda z: F.cross_entropy(z, T, weight=W), x)
    with pytest.raises(ValueError, match="label_smoothing"):
        F.cross_entropy(ag.tensor(x), T, weight=W, label_smoothing=0.1)


@pytest.mark.parametrize("kwargs,match", [
    (dict(target=np.array([0, 5, 1, 1, 1, 1])), r"\[0, 5\)"),
    (dict(target=np.array([0, -1, 1, 1, 1, 1])), r"\[0, 5\)"),
    (dict(target=np.zeros(6)), "integer class indices"),
    (dict(target=np.zeros(5, np.int64)), "target must have shape"),
    (dict(target=T, weight=np.ones(4)), "weight must have shape"),
    (dict(target=T, reduction="avg"), "reduction must be one of"),
])
def test_nll_loss_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        F.nll_loss(ag.tensor(LOGP), **kwargs)


def test_one_hot():
    idx = np.array([[0, 2], [1, 3]])
    got = F.one_hot(ag.tensor(idx))
    assert got.dtype == np.int64 and not got.requires_grad
    np.testing.assert_array_equal(got.numpy(), np.eye(4, dtype=np.int64)[idx])
    np.testing.assert_array_equal(F.one_hot(idx, num_classes=6).numpy(),
                                  np.eye(6, dtype=np.int64)[idx])
    with pytest.raises(ValueError, match="< num_classes=3"):
        F.one_hot(idx, num_classes=3)
    with pytest.raises(ValueError, match=">= 0"):
        F.one_hot(np.array([1, -1]))
    with pytest.raises(ValueError, match="integer"):
        F.one_hot(np.array([1.0]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss_reductions_gradcheck(device, reduction):
    a, b = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
    got = F.mse_loss(ag.tensor(a, device=device), ag.tensor(b, device=device),
                     reduction=reduction).numpy()
    sq = (a - b) ** 2
    want = {"none": sq, "sum": sq.sum(), "mean": sq.mean()}[reduction]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    gradcheck_on(device, lambda x, y: F.mse_loss(x, y, reduction=reduction), a, b)
    with pytest.raises(ValueError, match="reduction"):
        F.mse_loss(ag.tensor(a), ag.tensor(b), reduction="bad")
