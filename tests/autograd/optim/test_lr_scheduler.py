"""optim.lr_scheduler: LambdaLR, StepLR, CosineAnnealingLR, LinearLR, SequentialLR against
their closed forms (and torch when importable), state_dict round trips, resuming."""

from __future__ import annotations

import math

import numpy as np
import pytest

import autograd as ag
from autograd import optim
from autograd.nn import Parameter
from autograd.optim import lr_scheduler as S

STEPS = 12


def _opt(lrs=(0.5, 2.0)):
    return optim.SGD([{"params": [Parameter(ag.zeros(1))], "lr": lr} for lr in lrs], lr=1.0)


def _sequence(make, steps=STEPS):
    """[lr of each group at epoch 0, 1, ...]: the first after construction."""
    opt = _opt()
    sched = make(opt)
    out = [sched.get_last_lr()]
    for _ in range(steps):
        opt.step()
        sched.step()
        out.append(sched.get_last_lr())
        assert out[-1] == [g["lr"] for g in opt.param_groups]
    return np.array(out)


def _linear(e, s=0.25, f=1.0, n=4):
    return s + (f - s) * min(e, n) / n


CASES = {
    "lambda": (lambda o: S.LambdaLR(o, lambda e: 0.9 ** e + 0.1 * e),
               lambda b, e: b * (0.9 ** e + 0.1 * e)),
    "step": (lambda o: S.StepLR(o, step_size=3, gamma=0.5),
             lambda b, e: b * 0.5 ** (e // 3)),
    "cosine": (lambda o: S.CosineAnnealingLR(o, T_max=7, eta_min=0.01),
               lambda b, e: 0.01 + (b - 0.01) * (1 + math.cos(math.pi * e / 7)) / 2),
    "linear": (lambda o: S.LinearLR(o, start_factor=0.25, total_iters=4),
               lambda b, e: b * _linear(e)),
    "sequential": (lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.25, total_iters=4),
                                                S.StepLR(o, step_size=3, gamma=0.5)],
                                            milestones=[5]),
                   lambda b, e: b * (_linear(e) if e < 5 else 0.5 ** ((e - 5) // 3))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_sequence_matches_closed_form(name):
    make, formula = CASES[name]
    want = np.array([[formula(b, e) for b in (0.5, 2.0)] for e in range(STEPS + 1)])
    np.testing.assert_allclose(_sequence(make), want, rtol=1e-14, atol=1e-15)


def test_lambda_per_group_and_sequential_three_phases():
    got = _sequence(lambda o: S.LambdaLR(o, [lambda e: 1.0, lambda e: 1.0 / (e + 1)]), 3)
    np.testing.assert_allclose(got, [[0.5, 2.0], [0.5, 1.0], [0.5, 2 / 3], [0.5, 0.5]])

    def make(o):
        return S.SequentialLR(o, [S.LambdaLR(o, lambda e: 0.1), S.StepLR(o, 1, gamma=0.5),
                                  S.CosineAnnealingLR(o, T_max=2)], milestones=[2, 4])

    got = _sequence(make, 6)[:, 0]
    np.testing.assert_allclose(got, [0.05, 0.05, 0.5, 0.25, 0.5, 0.25, 0.0], atol=1e-15)


@pytest.mark.parametrize("name", list(CASES))
def test_state_dict_round_trip_continues_identically(name):
    make, _ = CASES[name]
    opt_a = _opt()
    a = make(opt_a)
    for _ in range(6):
        a.step()
    state = a.state_dict()
    assert "optimizer" not in state
    opt_b = _opt()
    b = make(opt_b)
    b.load_state_dict(state)
    assert b.get_last_lr() == a.get_last_lr()
    for _ in range(4):
        a.step()
        b.step()
        assert b.get_last_lr() == a.get_last_lr()
        assert [g["lr"] for g in opt_b.param_groups] == [g["lr"] for g in opt_a.param_groups]


def test_resume_with_last_epoch_and_initial_lr():
    opt = _opt()
    with pytest.raises(KeyError, match="initial_lr"):
        S.StepLR(opt, step_size=2, last_epoch=3)
    for g in opt.param_groups:
        g["initial_lr"] = g["lr"]
    sched = S.StepLR(opt, step_size=2, gamma=0.1, last_epoch=3)  # resumes at epoch 4
    assert sched.last_epoch == 4
    np.testing.assert_allclose(sched.get_last_lr(), [0.5 * 0.01, 2.0 * 0.01])


@pytest.mark.parametrize("make,match", [
    (lambda o: S.StepLR(o, step_size=0), "step_size"),
    (lambda o: S.CosineAnnealingLR(o, T_max=0), "T_max"),
    (lambda o: S.LinearLR(o, start_factor=0.0), "start_factor"),
    (lambda o: S.LambdaLR(o, [lambda e: 1.0]), "one per param group"),
    (lambda o: S.SequentialLR(o, [S.StepLR(o, 1)], milestones=[2]), "milestones"),
    (lambda o: S.SequentialLR(o, [S.StepLR(_opt(), 1)], milestones=[]), "this optimizer"),
])
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make(_opt())


def test_cosine_with_warmup_still_exported():
    opt = _opt((1.0,))
    sched = optim.CosineWithWarmup(opt, warmup_steps=2, total_steps=4)
    assert sched.get_last_lr() == [0.5] and optim.lr_scheduler.CosineWithWarmup is \
        optim.CosineWithWarmup


@pytest.mark.parametrize("name", list(CASES))
def test_against_torch(name):
    torch = pytest.importorskip("torch")
    ts = torch.optim.lr_scheduler
    make_torch = {
        "lambda": lambda o: ts.LambdaLR(o, lambda e: 0.9 ** e + 0.1 * e),
        "step": lambda o: ts.StepLR(o, step_size=3, gamma=0.5),
        "cosine": lambda o: ts.CosineAnnealingLR(o, T_max=7, eta_min=0.01),
        "linear": lambda o: ts.LinearLR(o, start_factor=0.25, total_iters=4),
        "sequential": lambda o: ts.SequentialLR(
            o, [ts.LinearLR(o, start_factor=0.25, total_iters=4),
                ts.StepLR(o, step_size=3, gamma=0.5)], milestones=[5]),
    }[name]
    params = [torch.zeros(1, requires_grad=True) for _ in range(2)]
    groups = [{"params": [p], "lr": lr} for p, lr in zip(params, (0.5, 2.0), strict=True)]
    opt = torch.optim.SGD(groups, lr=1.0)
    sched = make_torch(opt)
    want = [sched.get_last_lr()]
    for _ in range(STEPS):
        opt.step()
        sched.step()
        want.append(sched.get_last_lr())
    np.testing.assert_allclose(_sequence(CASES[name][0]), np.array(want), rtol=1e-12,
                               atol=1e-14)
