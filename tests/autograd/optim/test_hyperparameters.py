"""Optimizer constructors reject bad hyperparameters as PyTorch does (ValueError "Invalid
learning rate: -1"), NaN and inf included (which would make every weight NaN at the first
step), before any state exists."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autograd import optim
from autograd.nn import Parameter

NAN, INF = math.nan, math.inf


def _params():
    return [Parameter(np.zeros(3, np.float32))]


@pytest.mark.parametrize("kw,words", [
    ({"lr": -1}, "Invalid learning rate: -1"), ({"lr": NAN}, "Invalid learning rate: nan"),
    ({"lr": INF}, "Invalid learning rate: inf"), ({"lr": "0.1"}, "Invalid learning rate"),
    ({"eps": -1e-8}, "Invalid epsilon value"), ({"eps": NAN}, "Invalid epsilon value"),
    ({"betas": (1.0, 0.999)}, "Invalid beta parameter at index 0: 1.0"),
    ({"betas": (0.9, NAN)}, "Invalid beta parameter at index 1: nan"),
    ({"betas": (-0.1, 0.9)}, "Invalid beta parameter at index 0"),
    ({"weight_decay": NAN}, "Invalid weight_decay value: nan"),
    ({"weight_decay": -0.1}, "Invalid weight_decay value"),
])
def test_adamw_rejects(kw, words):
    with pytest.raises(ValueError) as err:
        optim.AdamW(_params(), **kw)
    assert str(err.value).startswith(words) and "(AdamW: argument '" in str(err.value)
    assert "expected a finite number" in str(err.value), str(err.value)


@pytest.mark.parametrize("kw,words", [
    ({"lr": -1}, "Invalid learning rate: -1"), ({"lr": NAN}, "Invalid learning rate: nan"),
    ({"lr": INF}, "Invalid learning rate"), ({"lr": 0.1, "momentum": NAN}, "Invalid momentum"),
    ({"lr": 0.1, "momentum": -0.9}, "Invalid momentum value: -0.9"),
    ({"lr": 0.1, "weight_decay": INF}, "Invalid weight_decay value: inf"),
    ({"lr": 0.1, "dampening": NAN}, "Invalid dampening value: nan"),
])
def test_sgd_rejects(kw, words):
    with pytest.raises(ValueError, match="SGD") as err:
        optim.SGD(_params(), **kw)
    assert str(err.value).startswith(words), str(err.value)


def test_good_values_are_accepted():
    optim.AdamW(_params(), lr=0, betas=(0.0, 0.0), eps=0.0, weight_decay=0)
    optim.AdamW(_params(), lr=np.float32(3e-4))
    optim.SGD(_params(), lr=0.1, momentum=0.9, dampening=-0.5, nesterov=False)
