"""Layers: initialisation, forward against float64 NumPy, and float64 gradient checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from autograd import nn
from gpuplan.dtypes import FLOAT_DTYPES, bfloat16, float16, float32, float64
from gpuplan.ops.embedding.reference import embedding_backward_reference
from gpuplan.ops.normalization.reference import layer_norm_reference

DTYPES = [pytest.param(d, id=gp.dtypes.short_name(d)) for d in FLOAT_DTYPES]
TOL = {float64: (1e-12, 1e-12), float32: (3e-5, 3e-6), float16: (4e-3, 2e-3),
       bfloat16: (3e-2, 1.5e-2)}
_erf = np.vectorize(math.erf)


def rand(shape, dtype=float64, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def f64(a):
    return gp.to_host(a.data if isinstance(a, ag.Tensor) else a).astype(np.float64)


def assert_close(actual, expect, dtype):
    rtol, atol = TOL[gp.dtypes.as_dtype(dtype)]
    np.testing.assert_allclose(f64(actual), expect, rtol=rtol, atol=atol)


def module_gradcheck(module, x, rtol=1e-6, atol=1e-8):
    """Float64 ag.gradcheck of module(x) with respect to x and every parameter, every element.

    The module's own Parameter tensors are passed to gradcheck as inputs (the lambda ignores
    them: the module reads them itself), so gradcheck perturbs them in place and compares
    the finite differences with the gradients that backward accumulates into them."""
    x = ag.tensor(np.asarray(x, dtype=np.float64), requires_grad=True)
    params = list(module.parameters())
    assert all(p.requires_grad and p.dtype == float64 for p in params), type(module).__name__
    assert ag.gradcheck(lambda x, *params: module(x), [x, *params], rtol=rtol, atol=atol)


class _Scale(ag.Function):
    """y = x * w with a gradient for w that is off by `w_error` (0: correct)."""

    @staticmethod
    def forward(ctx, x, w, w_error):
        ctx.saved = (x, w, w_error)
        return x * w

    @staticmethod
    def backward(ctx, dy):
        x, w, w_error = ctx.saved
        return dy * w, (dy * x).sum(axis=0) * (1 + w_error)


class _ScaleModule(nn.Module):
    def __init__(self, w_error):
        super().__init__()
        self.w_error = w_error
        self.weight = nn.Parameter(rand((4,), seed=1))

    def forward(self, x):
        return _Scale.apply(x, self.weight, w_error=self.w_error)


def test_module_gradcheck_checks_the_parameters():
    """The helper perturbs the module's own parameters: a correct gradient passes (the
    numerical gradient is the non-zero one), a wrong parameter gradient fails."""
    x = rand((3, 4), seed=2)
    module_gradcheck(_ScaleModule(0.0), x)
    module = _ScaleModule(1e-4)
    before = module.weight.data.copy()
    with pytest.raises(ag.GradcheckError, match="gradient of input 1 "):
        module_gradcheck(module, x)
    np.testing.assert_array_equal(module.weight.data, before)  # restored after perturbing


# -- Linear -----------------------------------------------------------------------------------

def test_linear_init_pytorch_ranges_and_seed():
    lin = nn.Linear(50, 70, seed=3)
    assert lin.weight.shape == (50, 70) and lin.bias.shape == (70,)
    assert lin.weight.dtype == float32 and lin.weight.requires_grad
    bound = 1 / math.sqrt(50)
    for p in (lin.weight, lin.bias):
        assert float(np.abs(p.data).max()) <= bound
    assert float(lin.weight.data.max()) > 0.9 * bound
    assert float(lin.weight.data.min()) < -0.9 * bound
    assert abs(float(lin.weight.data.std()) - bound / math.sqrt(3)) < 0.01
    again = nn.Linear(50, 70, seed=3)
    np.testing.assert_array_equal(lin.weight.data, again.weight.data)
    np.testing.assert_array_equal(lin.bias.data, again.bias.data)
    assert not np.array_equal(lin.weight.data, nn.Linear(50, 70, seed=4).weight.data)
    # Same draws whatever the dtype: the f64 model rounds to the f32 one.
    lin64 = nn.Linear(50, 70, seed=3, dtype=np.float64)
    np.testing.assert_array_equal(lin64.weight.data.astype(np.float32), lin.weight.data)
    assert nn.Linear(4, 3, bias=False).bias is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead", [(5,), (2, 3), (0,), (1,)])
def test_linear_forward(device, dtype, lead):
    lin = nn.Linear(7, 9, dtype=dtype, seed=1).to(device)
    x = rand(lead + (7,), dtype)
    y = lin(ag.tensor(x, device=device))
    assert y.shape == x.shape[:-1] + (9,) and y.dtype == dtype and y.device == device
    expect = x.astype(np.float64) @ f64(lin.weight) + f64(lin.bias)
    assert_close(y, expect, dtype)


def test_linear_gradcheck():
    module_gradcheck(nn.Linear(5, 4, dtype=np.float64, seed=0), rand((3, 5)))
    module_gradcheck(nn.Linear(5, 4, bias=False, dtype=np.float64, seed=0), rand((2, 3, 5)))


# -- Embedding --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_forward_and_padding(device, dtype):
    emb = nn.Embedding(11, 6, padding_idx=2, dtype=dtype, seed=0).to(device)
    w = f64(emb.weight)
    assert np.all(w[2] == 0) and np.abs(w).max() > 0.5
    idx = np.array([[0, 2, 10], [3, 3, 1]], dtype=np.int64)
    y = emb(gp.to_device(idx, device))
    assert y.shape == (2, 3, 6) and y.dtype == dtype
    np.testing.assert_array_equal(f64(y), w[idx])


def test_embedding_backward_skips_padding():
    emb = nn.Embedding(7, 4, padding_idx=-1, dtype=np.float64, seed=0)
    assert emb.padding_idx == 6
    idx = np.array([1, 6, 1, 3], dtype=np.int32)
    dy = rand((4, 4), seed=5)
    (emb(idx) * ag.tensor(dy)).sum().backward()
    np.testing.assert_allclose(f64(emb.weight.grad),
                               embedding_backward_reference(dy, idx, 7, padding_idx=6),
                               rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="padding_idx"):
        nn.Embedding(4, 2, padding_idx=4)


def test_embedding_seed_is_deterministic():
    a, b = nn.Embedding(9, 5, seed=7), nn.Embedding(9, 5, seed=7)
    np.testing.assert_array_equal(a.weight.data, b.weight.data)
    assert abs(float(nn.Embedding(200, 50, seed=1).weight.data.std()) - 1.0) < 0.05


# -- LayerNorm / RMSNorm ----------------------------------------------------------------------

def ref_layer_norm(x, w, b, eps):
    return layer_norm_reference(x, w, b, eps)[0]


def ref_rms_norm(x, w, eps):
    return layer_norm_reference(x, w, None, eps, rms=True)[0]


def perturb_affine(module, seed=3):
    """Give weight/bias non-trivial values so that the checks exercise them."""
    for i, p in enumerate(module.parameters()):
        p.data[...] = rand(p.shape, p.dtype, seed=seed + i) * 0.5 + (1.0 if i == 0 else 0.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 33), (2, 3, 8), (0, 8)])
def test_layer_norm_forward(device, dtype, shape):
    ln = nn.LayerNorm(shape[-1], dtype=dtype)
    np.testing.assert_array_equal(f64(ln.weight), np.ones(shape[-1]))
    np.testing.assert_array_equal(f64(ln.bias), np.zeros(shape[-1]))
    perturb_affine(ln)
    ln.to(device)
    x = rand(shape, dtype, seed=1, scale=2.0) + np.asarray(0.5, dtype)
    y = ln(ag.tensor(x, device=device))
    assert y.dtype == dtype and y.shape == shape
    assert_close(y, ref_layer_norm(x.astype(np.float64), f64(ln.weight), f64(ln.bias), 1e-5),
                 dtype)


def test_layer_norm_variants():
    x = rand((3, 6), seed=2)
    ln = nn.LayerNorm((6,), eps=1e-3, bias=False, dtype=np.float64)
    assert [n for n, _ in ln.named_parameters()] == ["weight"] and ln.bias is None
    perturb_affine(ln)
    np.testing.assert_allclose(f64(ln(ag.tensor(x))), ref_layer_norm(x, f64(ln.weight), None,
                                                                     1e-3), rtol=1e-12)
    plain = nn.LayerNorm(6, elementwise_affine=False, dtype=np.float64)
    assert list(plain.parameters()) == []
    np.testing.assert_allclose(f64(plain(ag.tensor(x))), ref_layer_norm(x, None, None, 1e-5),
                               rtol=1e-12)


def test_layer_norm_gradcheck():
    ln = nn.LayerNorm(7, dtype=np.float64)
    perturb_affine(ln)
    module_gradcheck(ln, rand((4, 7), seed=4))
    ln_nb = nn.LayerNorm(5, bias=False, dtype=np.float64)
    perturb_affine(ln_nb)
    module_gradcheck(ln_nb, rand((2, 3, 5), seed=5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 31), (2, 2, 8), (0, 4)])
def test_rms_norm_forward(device, dtype, shape):
    rms = nn.RMSNorm(shape[-1], eps=1e-5, dtype=dtype)
    perturb_affine(rms)
    rms.to(device)
    x = rand(shape, dtype, seed=1)
    y = rms(ag.tensor(x, device=device))
    assert y.dtype == dtype and y.shape == shape
    assert_close(y, ref_rms_norm(x.astype(np.float64), f64(rms.weight), 1e-5), dtype)


def test_rms_norm_default_eps_and_gradcheck():
    x = rand((3, 9), seed=6)
    plain = nn.RMSNorm(9, elementwise_affine=False, dtype=np.float64)
    assert list(plain.parameters()) == [] and plain.eps is None
    y = f64(plain(ag.tensor(x)))
    # eps=None: a small default (PyTorch: finfo.eps; gpuplan: 1e-6): either is << mean(x^2).
    np.testing.assert_allclose(y, ref_rms_norm(x, None, 1e-6), rtol=1e-5)
    rms = nn.RMSNorm(6, eps=1e-5, dtype=np.float64)
    perturb_affine(rms)
    module_gradcheck(rms, rand((4, 6), seed=7))


# -- Dropout and activations ------------------------------------------------------------------

def test_dropout_modes(device):
    x = ag.tensor(np.ones((64, 64), np.float32), device=device)
    drop = nn.Dropout(0.25)
    y = f64(drop(x))
    kept = y != 0
    assert 0.2 < 1 - kept.mean() < 0.3
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
    drop.eval()
    assert drop(x) is x
    assert nn.Dropout(0.0)(x) is x
    with pytest.raises(ValueError, match="p must lie"):
        nn.Dropout(1.0)


def test_dropout_backward_uses_the_same_mask():
    x = ag.tensor(rand((16, 16), seed=1), requires_grad=True)
    y = nn.Dropout(0.5)(x)
    y.sum().backward()
    mask = f64(y) != 0
    np.testing.assert_array_equal(f64(x.grad), mask * 2.0)


def ref_gelu(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(device, dtype, approximate):
    x = rand((5, 13), dtype, seed=2, scale=2.0)
    y = nn.GELU(approximate)(ag.tensor(x, device=device))
    assert_close(y, ref_gelu(x.astype(np.float64), approximate), dtype)


def test_activation_gradchecks_and_errors():
    x = rand((4, 5), seed=3) + 0.05  # keep ReLU's kink (0) more than eps from every element
    for module in (nn.GELU(), nn.GELU("tanh"), nn.ReLU(), nn.Identity()):
        module_gradcheck(module, x)
    with pytest.raises(ValueError, match="approximate"):
        nn.GELU("fast")


def test_relu_and_identity_values(device):
    x = rand((3, 4), np.float32, seed=8)
    t = ag.tensor(x, device=device)
    np.testing.assert_array_equal(f64(nn.ReLU()(t)), np.maximum(x, 0).astype(np.float64))
    assert nn.Identity()(t) is t
