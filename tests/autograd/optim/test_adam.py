"""optim.Adam (L2 weight decay on the gradient) against a float64 NumPy reference over several
steps, on every device and with/without foreach; relations to AdamW; torch when importable."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from autograd import optim
from autograd.nn import Parameter

SHAPES = [(7,), (5, 3)]


def _adam_reference(p, grads, lr, betas, eps, wd):
    """torch.optim.Adam's documented update, float64, one gradient per step."""
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        g = g + wd * p
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        p = p - lr * (m / (1 - betas[0] ** t)) / (np.sqrt(v / (1 - betas[1] ** t)) + eps)
    return p


def _run(opt_cls, device, dtype, steps=4, **kw):
    rng = np.random.default_rng(0)
    start = [rng.standard_normal(s) for s in SHAPES]
    grads = [[rng.standard_normal(s) for s in SHAPES] for _ in range(steps)]
    params = [Parameter(gp.to_device(a.astype(dtype), device)) for a in start]
    opt = opt_cls(params, **kw)
    for step in grads:
        for p, g in zip(params, step, strict=True):
            p.grad = ag.tensor(gp.to_device(g.astype(dtype), device))
        opt.step()
    return start, grads, params, opt


@pytest.mark.parametrize("wd", [0.0, 0.3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("foreach", [True, False])
def test_adam_matches_reference(device, wd, dtype, foreach):
    kw = dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=wd)
    start, grads, params, _ = _run(optim.Adam, device, dtype, foreach=foreach, **kw)
    tol = 1e-12 if dtype == np.float64 else 2e-5
    for i, p in enumerate(params):
        want = _adam_reference(start[i].astype(dtype).astype(np.float64),
                               [g[i].astype(dtype).astype(np.float64) for g in grads],
                               kw["lr"], kw["betas"], kw["eps"], wd)
        np.testing.assert_allclose(gp.to_host(p.data).astype(np.float64), want, rtol=tol,
                                   atol=tol)


def test_adam_without_decay_is_adamw_without_decay_bit_for_bit():
    _, _, a, _ = _run(optim.Adam, "cpu", np.float32, lr=0.01)
    _, _, b, _ = _run(optim.AdamW, "cpu", np.float32, lr=0.01, weight_decay=0.0)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.numpy(), y.numpy())


def test_adam_defaults_state_dict_and_refusals():
    opt = optim.Adam([Parameter(ag.zeros(2))])
    g = opt.param_groups[0]
    assert (g["lr"], g["betas"], g["eps"], g["weight_decay"]) == (1e-3, (0.9, 0.999), 1e-8, 0.0)
    _, grads, params, opt = _run(optim.Adam, "cpu", np.float64, lr=0.1, weight_decay=0.1)
    clone = [Parameter(ag.tensor(p.numpy())) for p in params]
    other = optim.Adam(clone, lr=0.1, weight_decay=0.1)
    other.load_state_dict(opt.state_dict())
    for p, c, g in zip(params, clone, grads[0], strict=True):
        p.grad, c.grad = ag.tensor(g), ag.tensor(g)
    opt.step()
    other.step()
    for p, c in zip(params, clone, strict=True):
        np.testing.assert_array_equal(p.numpy(), c.numpy())
    with pytest.raises(ValueError, match="amsgrad"):
        optim.Adam([Parameter(ag.zeros(2))], amsgrad=True)
    with pytest.raises(ValueError, match="Invalid learning rate.*Adam: argument 'lr'"):
        optim.Adam([Parameter(ag.zeros(2))], lr=-1.0)


def test_adam_bf16_parameters_use_master_weights():
    start, grads, params, opt = _run(optim.Adam, "cpu", gp.dtypes.bfloat16, lr=0.05,
                                     weight_decay=0.2)
    master = [opt.state[id(p)]["master"] for p in params]
    for i, m in enumerate(master):
        want = _adam_reference(start[i].astype(gp.dtypes.bfloat16).astype(np.float64),
                               [g[i].astype(gp.dtypes.bfloat16).astype(np.float64)
                                for g in grads], 0.05, (0.9, 0.999), 1e-8, 0.2)
        np.testing.assert_allclose(m, want, rtol=2e-5, atol=2e-5)
        np.testing.assert_array_equal(params[i].numpy(), m.astype(gp.dtypes.bfloat16))


def test_against_torch():
    torch = pytest.importorskip("torch")
    start, grads, params, _ = _run(optim.Adam, "cpu", np.float64, lr=0.05, weight_decay=0.3)
    tp = [torch.tensor(a, requires_grad=True) for a in start]
    opt = torch.optim.Adam(tp, lr=0.05, weight_decay=0.3)
    for step in grads:
        for p, g in zip(tp, step, strict=True):
            p.grad = torch.tensor(g)
        opt.step()
    for p, t in zip(params, tp, strict=True):
        np.testing.assert_allclose(p.numpy(), t.detach().numpy(), rtol=1e-12, atol=1e-14)
