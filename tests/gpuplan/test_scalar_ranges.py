"""Declared per-call scalar ranges (gpuplan.spec.Scalar kind/lo/hi), checked on every call
before anything is written: a NaN or inf learning rate, betas outside [0, 1), a negative
seed are rejected by the optimizer and dropout plans, naming op, scalar, range and value."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.dropout import plans as dropout
from gpuplan.ops.optimizer import adamw, sgd
from gpuplan.spec import Scalar
from gpuplan.testing import assert_rejected, on

NAN, INF = math.nan, math.inf


def test_scalar_check_and_its_words():
    lr = Scalar("lr", kind="real", lo=0.0)
    beta = Scalar("beta1", 0.9, "real", lo=0.0, hi=1.0, hi_open=True)
    seed = Scalar("seed", kind="int", lo=0, hi=2**64, hi_open=True)
    for s, good in ((lr, (0.0, 3, np.float32(1e-3))), (beta, (0.0, 0.999)),
                    (seed, (0, 2**64 - 1, np.int64(5)))):
        for v in good:
            s.check("op", v)
    cases = [(lr, NAN, "a finite number in [0.0, inf)"), (lr, INF, "inf"), (lr, -1.0, "-1.0"),
             (lr, "0.1", "'0.1'"), (lr, True, "True"), (beta, 1.0, "[0.0, 1.0)"),
             (beta, -0.1, "-0.1"), (seed, -1, "an integer in [0, 2**64)"),
             (seed, 2**64, str(2**64)), (seed, 1.0, "1.0"), (seed, False, "False")]
    for s, bad, words in cases:
        with pytest.raises(gp.InvalidProblem, match=rf"op: argument '{s.name}'") as err:
            s.check("op", bad)
        assert words in str(err.value), (s, bad, str(err.value))
    assert Scalar("step", kind="int", lo=1).expected() == "an integer >= 1"
    assert Scalar("d", kind="real").expected() == "a finite number"
    with pytest.raises(ValueError, match="kind"):
        Scalar("x", kind="float")


def test_the_optimizer_and_dropout_families_declare_their_ranges():
    kinds = {s.name: (s.kind, s.lo, s.hi) for s in adamw.HYPER}
    assert kinds == {"lr": ("real", 0.0, None), "step": ("int", 1, None),
                     "beta1": ("real", 0.0, 1.0), "beta2": ("real", 0.0, 1.0),
                     "eps": ("real", 0.0, None), "weight_decay": ("real", 0.0, None)}
    sgd_kinds = {s.name: s.kind for s in sgd.SPEC.scalars}
    assert sgd_kinds["lr"] == sgd_kinds["momentum"] == sgd_kinds["weight_decay"] == "real"
    assert {s.name: (s.kind, s.lo, s.hi) for s in dropout.FORWARD.scalars} == {
        "seed": ("int", 0, 2**64), "offset": ("int", 0, 2**64)}


def _stream(device):
    return gp.Stream.host() if device == "cpu" else gp.Stream.current()


@pytest.mark.parametrize("lr", [NAN, INF, -1.0])
def test_adamw_plans_reject_a_bad_lr_with_nothing_written(device, lr):
    s = _stream(device)
    n = 6
    p, g, m, v = (on(device, np.full(n, x, np.float32)) for x in (1.0, 0.5, 0.1, 0.01))
    plan = gp.AdamWPlan.select(s, gp.AdamWDescriptor(n, np.float32, np.float32, None))
    one = gp.AdamWArgs(param=p, grad=g, exp_avg=m, exp_avg_sq=v, param_lowp=None, lr=lr,
                       step=1)
    assert_rejected(lambda: plan.run(s, gp.Workspace.none(), one), gp.InvalidProblem,
                    [p, m, v], "adamw_step", "'lr'", "finite number")
    multi = gp.AdamWMultiTensorPlan.select(s, gp.AdamWMultiTensorDescriptor((n,)))
    ws = gp.Workspace.allocate(s, multi.workspace_size())
    args = gp.AdamWMultiTensorArgs(params=[p], grads=[g], exp_avgs=[m], exp_avg_sqs=[v],
                                   lr=lr, step=1)
    assert_rejected(lambda: multi.run(s, ws, args), gp.InvalidProblem, [p, m, v],
                    "adamw_multi_tensor_step", "'lr'")


@pytest.mark.parametrize("name,bad", [("lr", NAN), ("lr", INF), ("momentum", NAN),
                                      ("weight_decay", -INF), ("dampening", NAN)])
def test_sgd_plan_rejects_non_finite_hyperparameters_with_nothing_written(device, name, bad):
    s = _stream(device)
    p, g, buf = (on(device, np.full(5, x, np.float32)) for x in (1.0, 0.5, 0.1))
    plan = gp.SGDPlan.select(s, gp.SGDDescriptor(5))
    args = dict(param=p, grad=g, momentum_buf=buf, param_lowp=None, lr=0.1, momentum=0.9)
    args[name] = bad
    assert_rejected(lambda: plan.run(s, None, gp.SGDArgs(**args)), gp.InvalidProblem,
                    [p, buf], "sgd", f"'{name}'")


@pytest.mark.parametrize("name,bad", [("seed", -1), ("seed", 2**64), ("offset", -3),
                                      ("seed", 1.5)])
def test_dropout_rejects_a_seed_or_offset_out_of_range(device, name, bad):
    x = on(device, np.ones(8, np.float32))
    y = on(device, np.full(8, 7.0, np.float32))
    s = _stream(device)
    plan = gp.DropoutPlan.select(s, gp.DropoutDescriptor(8, 0.5))
    args = dict(x=x, y=y, seed=3, offset=0) | {name: bad}
    assert_rejected(lambda: plan.run(s, gp.Workspace.none(), gp.DropoutArgs(**args)),
                    gp.InvalidProblem, [y], "dropout", f"'{name}'", "[0, 2**64)")
