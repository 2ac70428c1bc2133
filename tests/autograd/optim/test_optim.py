"""Optimizers, gradient clipping and schedules against float64 NumPy reference formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from autograd import optim
from autograd.nn import Parameter
from gpuplan.dtypes import bfloat16, float16, float32
from gpuplan.ops.optimizer.reference import adamw_reference, sgd_reference

SHAPES = [(7,), (5, 3), (33, 17)]
RTOL_ATOL = {np.dtype(np.float32): (2e-5, 2e-6), np.dtype(np.float64): (1e-12, 1e-13)}


def make_params(device: str, dtype=float32, seed: int = 0) -> list[Parameter]:
    rng = np.random.default_rng(seed)
    return [Parameter(gp.to_device(rng.standard_normal(s).astype(dtype), device))
            for s in SHAPES]


def grads_for_step(step: int, seed: int = 100) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + step)
    return [rng.standard_normal(s) for s in SHAPES]


def set_grads(params, grads, device, dtype=float32) -> None:
    for p, g in zip(params, grads, strict=True):
        p.grad = ag.tensor(gp.to_device(g.astype(dtype), device))


def host(a) -> np.ndarray:
    return gp.to_host(a).astype(np.float64)


# -- the optimizer families' float64 references (gpuplan.testing), over several steps -----------

def ref_sgd(p, grads_per_step, lr, momentum, dampening, wd, nesterov):
    buf = None
    for t, g in enumerate(grads_per_step):
        p, buf = sgd_reference(p, g, buf, lr=lr, momentum=momentum, dampening=dampening,
                               weight_decay=wd, nesterov=nesterov, first_step=t == 0)
    return p


def ref_adamw(p, grads_per_step, lr, b1, b2, eps, wd):
    m = v = np.zeros_like(p)
    for t, g in enumerate(grads_per_step, start=1):
        p, m, v = adamw_reference(p, g, m, v, lr=lr, beta1=b1, beta2=b2, eps=eps,
                                  weight_decay=wd, step=t)
    return p


def run_steps(opt, params, device, steps, dtype=float32):
    history = []
    for t in range(steps):
        grads = [host(gp.to_device(g.astype(dtype), "cpu")) for g in grads_for_step(t)]
        history.append(grads)
        set_grads(params, grads, device, dtype)
        opt.step()
    return history


SGD_CASES = [
    dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
    dict(momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False),
    dict(momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=False),
    dict(momentum=0.8, dampening=0.0, weight_decay=0.05, nesterov=True),
]


@pytest.mark.parametrize("case", SGD_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in
                                                                  c.items()))
@pytest.mark.parametrize("dtype", [float32, np.float64], ids=["f32", "f64"])
def test_sgd_matches_reference(device, case, dtype):
    params = make_params(device, dtype=dtype)
    start = [host(p.data) for p in params]
    opt = optim.SGD(params, lr=0.1, **case)
    history = run_steps(opt, params, device, steps=5, dtype=dtype)
    rtol, atol = RTOL_ATOL[np.dtype(dtype)]
    for i, p in enumerate(params):
        expect = ref_sgd(start[i], [h[i] for h in history], 0.1, case["momentum"],
                         case["dampening"], case["weight_decay"], case["nesterov"])
        np.testing.assert_allclose(host(p.data), expect, rtol=rtol, atol=atol)


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "single"])
@pytest.mark.parametrize("dtype", [float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adamw_matches_reference(device, wd, dtype, foreach):
    params = make_params(device, dtype=dtype)
    start = [host(p.data) for p in params]
    opt = optim.AdamW(params, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd,
                      foreach=foreach)
    history = run_steps(opt, params, device, steps=6, dtype=dtype)
    rtol, atol = RTOL_ATOL[np.dtype(dtype)]
    for i, p in enumerate(params):
        expect = ref_adamw(start[i], [h[i] for h in history], 0.01, 0.9, 0.95, 1e-8, wd)
        np.testing.assert_allclose(host(p.data), expect, rtol=rtol, atol=atol)
    assert all(opt.state[id(p)]["step"] == 6 for p in params)


@pytest.mark.parametrize("dtype", [float32, bfloat16, np.float64], ids=["f32", "bf16", "f64"])
def test_adamw_multi_tensor_equals_per_tensor(device, dtype):
    """foreach=True (one multi-tensor launch) and foreach=False give the same bits."""
    runs = []
    for foreach in (True, False):
        params = make_params(device, dtype=dtype)
        opt = optim.AdamW(params, lr=0.01, weight_decay=0.1, foreach=foreach)
        run_steps(opt, params, device, steps=3, dtype=dtype)
        runs.append([gp.to_host(p.data) for p in params]
                    + [gp.to_host(opt.state[id(p)]["exp_avg_sq"]) for p in params])
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_adamw_defaults_are_pytorchs():
    opt = optim.AdamW(make_params("cpu"))
    g = opt.param_groups[0]
    assert (g["lr"], g["betas"], g["eps"], g["weight_decay"]) == (1e-3, (0.9, 0.999), 1e-8,
                                                                 1e-2)


@pytest.mark.parametrize("lowp", [bfloat16, float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_master_weights_for_half_params(device, lowp, kind):
    """A half model keeps f32 master weights in the optimizer: the master follows the f32
    reference exactly as an f32 model would, and param.data is its rounding."""
    params = make_params(device, dtype=lowp)
    start = [host(p.data) for p in params]
    if kind == "adamw":
        opt = optim.AdamW(params, lr=1e-3, weight_decay=0.1)
    else:
        opt = optim.SGD(params, lr=1e-3, momentum=0.9)
    history = run_steps(opt, params, device, steps=4, dtype=lowp)
    for i, p in enumerate(params):
        master = opt.state[id(p)]["master"]
        assert master.dtype == float32 and p.data.dtype == lowp
        grads = [h[i] for h in history]
        if kind == "adamw":
            expect = ref_adamw(start[i], grads, 1e-3, 0.9, 0.999, 1e-8, 0.1)
        else:
            expect = ref_sgd(start[i], grads, 1e-3, 0.9, 0.0, 0.0, False)
        np.testing.assert_allclose(host(master), expect, rtol=2e-5, atol=2e-6)
        np.testing.assert_array_equal(gp.to_host(p.data), gp.to_host(master).astype(lowp))
    # Updates of 1e-3 are below bf16 resolution for |p| ~ 1: without master weights most
    # entries would never move; with them the low-precision copy does change.
    moved = sum(int((host(p.data) != s).sum()) for p, s in zip(params, start, strict=True))
    assert moved > 0


def test_master_weights_only_for_half_params():
    params = make_params("cpu", dtype=float32)
    opt = optim.AdamW(params)
    set_grads(params, grads_for_step(0), "cpu")
    opt.step()
    assert all("master" not in opt.state[id(p)] for p in params)
    half = make_params("cpu", dtype=bfloat16)
    before = [p.data.copy() for p in half]
    opt = optim.AdamW(half, master_weights=False)
    set_grads(half, grads_for_step(0), "cpu", bfloat16)
    with pytest.raises(gp.Unsupported, match="bf16"):
        opt.step()
    np.testing.assert_array_equal(half[0].data, before[0])


def test_params_without_grad_are_skipped():
    params = make_params("cpu")
    before = params[1].data.copy()
    opt = optim.AdamW(params, lr=0.1)
    set_grads(params, grads_for_step(0), "cpu")
    params[1].grad = None
    opt.step()
    np.testing.assert_array_equal(params[1].data, before)
    assert id(params[1]) not in opt.state


def test_zero_grad():
    params = make_params("cpu")
    set_grads(params, grads_for_step(0), "cpu")
    opt = optim.SGD(params, lr=0.1)
    opt.zero_grad(set_to_none=False)
    assert all(float(np.abs(p.grad.data).max()) == 0.0 for p in params)
    opt.zero_grad()
    assert all(p.grad is None for p in params)


def test_param_groups_use_their_own_hyper_parameters():
    a, b = make_params("cpu")[:2]
    a0, b0 = host(a.data), host(b.data)
    opt = optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1)
    a.grad = ag.tensor(np.ones(a.shape, np.float32))
    b.grad = ag.tensor(np.ones(b.shape, np.float32))
    opt.step()
    np.testing.assert_allclose(host(a.data), a0 - 0.1, rtol=1e-6)
    np.testing.assert_allclose(host(b.data), b0 - 0.5, rtol=1e-6)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_optimizer_state_dict_round_trip(device, kind):
    def build(params):
        if kind == "adamw":
            return optim.AdamW(params, lr=0.01)
        return optim.SGD(params, lr=0.01, momentum=0.9)

    params = make_params(device)
    opt = build(params)
    run_steps(opt, params, device, steps=2)
    saved_params = [gp.to_host(p.data).copy() for p in params]
    saved = opt.state_dict()
    clone = [Parameter(gp.to_device(a.copy(), device)) for a in saved_params]
    opt2 = build(clone)
    opt2.load_state_dict(saved)
    for t in range(2, 5):
        for ps, o in ((params, opt), (clone, opt2)):
            set_grads(ps, grads_for_step(t), device)
            o.step()
    for p, q in zip(params, clone, strict=True):
        np.testing.assert_array_equal(gp.to_host(p.data), gp.to_host(q.data))
    # The saved state is a host copy, independent of later steps.
    assert saved["state"][0]["step"] == 2
    assert isinstance(next(v for v in saved["state"][0].values() if hasattr(v, "shape")),
                      np.ndarray)


def test_load_state_dict_rejects_mismatch():
    opt = optim.AdamW(make_params("cpu"))
    other = optim.AdamW(make_params("cpu")[:2])
    with pytest.raises(ValueError, match="param group has 3 parameters, given 2"):
        opt.load_state_dict(other.state_dict())


def test_constructor_errors():
    with pytest.raises(ValueError, match="lr"):
        optim.SGD(make_params("cpu"), lr=-1.0)
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD(make_params("cpu"), lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="betas"):
        optim.AdamW(make_params("cpu"), betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="empty"):
        optim.AdamW([])
    p = make_params("cpu")[0]
    with pytest.raises(ValueError, match="twice"):
        optim.AdamW([p, p])


# -- clip_grad_norm_ --------------------------------------------------------------------------

@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_grad_norm(device, max_norm):
    params = make_params(device)
    grads = grads_for_step(0)
    set_grads(params, grads, device)
    g32 = [g.astype(np.float32).astype(np.float64) for g in grads]
    expect_total = math.sqrt(sum(float((g * g).sum()) for g in g32))
    total = optim.clip_grad_norm_(params, max_norm)
    assert isinstance(total, float)
    assert total == pytest.approx(expect_total, rel=1e-6)
    coef = min(1.0, max_norm / (expect_total + 1e-6))
    for p, g in zip(params, g32, strict=True):
        np.testing.assert_allclose(host(p.grad.data), g * coef, rtol=2e-6, atol=1e-7)
    if max_norm < expect_total:
        new_total = math.sqrt(sum(float((host(p.grad.data) ** 2).sum()) for p in params))
        assert new_total == pytest.approx(max_norm, rel=1e-5)


def test_clip_grad_norm_float64_and_missing_grads():
    params = make_params("cpu", dtype=np.float64)
    params[0].grad = ag.tensor(np.full(SHAPES[0], 3.0))
    params[1].grad = ag.tensor(np.full(SHAPES[1], 4.0))
    total = optim.clip_grad_norm_(params, 1.0)
    assert total == pytest.approx(math.sqrt(9 * 7 + 16 * 15), rel=1e-12)
    assert params[2].grad is None
    assert optim.clip_grad_norm_([make_params("cpu")[0]], 1.0) == 0.0


# -- cosine schedule --------------------------------------------------------------------------

def test_cosine_lr_values():
    f = optim.cosine_lr
    assert f(0, 1.0, 10, 110) == pytest.approx(0.1)
    assert f(4, 1.0, 10, 110) == pytest.approx(0.5)
    assert f(9, 1.0, 10, 110) == pytest.approx(1.0)
    assert f(10, 1.0, 10, 110) == pytest.approx(1.0)
    assert f(60, 1.0, 10, 110, min_lr=0.1) == pytest.approx(0.55)
    assert f(35, 2.0, 10, 110) == pytest.approx(2.0 * 0.5 * (1 + math.cos(math.pi * 0.25)))
    assert f(110, 1.0, 10, 110, min_lr=0.1) == pytest.approx(0.1)
    assert f(500, 1.0, 10, 110, min_lr=0.1) == pytest.approx(0.1)
    assert f(0, 1.0, 0, 10) == pytest.approx(1.0)
    assert f(7, 1.0, 5, 5, min_lr=0.2) == pytest.approx(1.0)
    lrs = [f(s, 1.0, 10, 110) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs[:-1], lrs[1:], strict=True))
    with pytest.raises(ValueError):
        f(-1, 1.0, 10, 110)
    with pytest.raises(ValueError):
        f(0, 1.0, 20, 10)


def test_cosine_scheduler_drives_the_optimizer():
    params = make_params("cpu")
    opt = optim.AdamW([{"params": params[:1]}, {"params": params[1:], "lr": 0.5}], lr=1.0)
    sched = optim.CosineWithWarmup(opt, warmup_steps=4, total_steps=20, min_lr=0.01)
    seen = []
    for step in range(25):
        assert sched.get_lr() == pytest.approx(
            [optim.cosine_lr(step, 1.0, 4, 20, 0.01), optim.cosine_lr(step, 0.5, 4, 20, 0.01)])
        seen.append(opt.param_groups[0]["lr"])
        assert sched.get_last_lr() == [opt.param_groups[0]["lr"], opt.param_groups[1]["lr"]]
        sched.step()
    assert seen[0] == pytest.approx(0.25) and seen[4] == pytest.approx(1.0)
    assert seen[-1] == pytest.approx(0.01)
    state = sched.state_dict()
    fresh = make_params("cpu")
    opt2 = optim.AdamW([{"params": fresh[:1]}, {"params": fresh[1:]}], lr=123.0)
    sched2 = optim.CosineWithWarmup(opt2, warmup_steps=1, total_steps=2)
    sched2.load_state_dict(state)
    assert sched2.last_step == 25 and sched2.base_lrs == [1.0, 0.5]
    assert opt2.param_groups[1]["lr"] == pytest.approx(0.01)
    sched2.step()
    assert sched2.get_lr() == pytest.approx([0.01, 0.01])
    with pytest.raises(ValueError, match="base_lrs"):
        optim.CosineWithWarmup(optim.AdamW(make_params("cpu")), 1, 2).load_state_dict(state)
