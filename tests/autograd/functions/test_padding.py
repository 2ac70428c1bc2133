"""F.pad: constant (any dims, negative pads crop) and reflect/replicate/circular, against
np.pad, with gradchecks; bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd.nn import functional as F
from tests.helpers import gradcheck_on

X = np.random.default_rng(0).uniform(-1, 1, (2, 3, 4))


def _np_pairs(pad, ndim):
    pairs = [(0, 0)] * ndim
    for i in range(len(pad) // 2):
        pairs[ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return pairs


@pytest.mark.parametrize("pad", [(1, 2), (0, 1, 2, 0), (1, 1, 0, 0, 2, 3), (-1, 2), (2, -3, 1, 0)])
def test_constant_matches_numpy_and_gradchecks(device, pad):
    pairs = _np_pairs(pad, X.ndim)
    grown = np.pad(X, [(max(a, 0), max(b, 0)) for a, b in pairs], constant_values=0.5)
    crop = tuple(slice(max(-a, 0), grown.shape[i] - max(-b, 0))
                 for i, (a, b) in enumerate(pairs))
    got = F.pad(ag.tensor(X, device=device), pad, value=0.5)
    np.testing.assert_array_equal(got.numpy(), grown[crop])
    gradcheck_on(device, lambda x: F.pad(x, pad, value=-2.0), X)


@pytest.mark.parametrize("mode,np_mode", [("reflect", "reflect"), ("replicate", "edge"),
                                          ("circular", "wrap")])
@pytest.mark.parametrize("pad", [(1, 2), (2, 0, 1, 2)])
def test_other_modes_match_numpy_and_gradcheck(device, mode, np_mode, pad):
    got = F.pad(ag.tensor(X, device=device), pad, mode=mode)
    np.testing.assert_array_equal(got.numpy(), np.pad(X, _np_pairs(pad, X.ndim), mode=np_mode))
    gradcheck_on(device, lambda x: F.pad(x, pad, mode=mode), X)


def test_replicate_gradient_adds_duplicates():
    x = ag.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    F.pad(x, (2, 1), mode="replicate").sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 1.0, 2.0])


@pytest.mark.parametrize("kwargs,match", [
    (dict(pad=(1,)), "even length"),
    (dict(pad=(1, 1) * 4), "even length"),
    (dict(pad=(-3, -2)), "negative size"),
    (dict(pad=(1, 1), mode="wrap"), "mode must be"),
    (dict(pad=(4, 0), mode="reflect"), "pads <= 3"),
    (dict(pad=(5, 0), mode="circular"), "pads <= 4"),
    (dict(pad=(-1, 0), mode="replicate"), "pads >= 0"),
    (dict(pad=(1, 0), mode="reflect", value=1.0), "value applies"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        F.pad(ag.tensor(X), **kwargs)
