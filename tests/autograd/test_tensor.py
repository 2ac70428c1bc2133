"""Tensor basics and the data-movement Functions (reshape, transpose, index, cat/split...)."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from gpuplan.dtypes import bfloat16
from tests.helpers import gradcheck_on


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape)


def test_tensor_creation(device):
    src = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = ag.tensor(src, device=device)
    assert (t.shape, t.ndim, t.dtype, t.device) == ((2, 3), 2, np.float32, device)
    assert t.is_leaf and not t.requires_grad and t.grad is None
    src[0, 0] = 99  # tensor() copies
    assert t.numpy()[0, 0] == 0
    assert ag.tensor([1.0, 2.0]).dtype == np.float32
    assert ag.tensor(np.ones(2), dtype=bfloat16, device=device).dtype == bfloat16
    assert ag.tensor(3.5).item() == 3.5


def test_factories(device):
    assert ag.zeros(2, 3, device=device).numpy().tolist() == [[0.0] * 3] * 2
    assert ag.ones((2,), dtype=np.float64, device=device).numpy().tolist() == [1.0, 1.0]
    assert ag.full((1, 2), 4.0, device=device).numpy().tolist() == [[4.0, 4.0]]
    a, b = ag.randn(3, 4, seed=5, device=device), ag.randn(3, 4, seed=5)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    ag.manual_seed(11)
    c = ag.randn(4)
    ag.manual_seed(11)
    np.testing.assert_array_equal(c.numpy(), ag.randn(4).numpy())


def test_detach_zero_and_requires_grad(device):
    x = ag.tensor(np.ones(3), requires_grad=True, device=device)
    d = x.detach()
    assert not d.requires_grad and d.data is x.data
    d.zero_()
    assert x.numpy().tolist() == [0.0, 0.0, 0.0]
    assert ag.tensor(np.ones(1)).requires_grad_().requires_grad
    with pytest.raises(ValueError, match="one-element"):
        x.item()


def test_reshape_and_view(device):
    x = ag.tensor(_rand(2, 3, 4), requires_grad=True, device=device)
    assert x.reshape(6, 4).shape == (6, 4) and x.view((4, -1)).shape == (4, 6)
    gradcheck_on(device, lambda t: t.reshape(4, 6)[1:3], _rand(2, 3, 4))


def test_transpose_permute(device):
    x = ag.tensor(_rand(2, 3, 4), device=device)
    np.testing.assert_array_equal(x.transpose(0, 2).numpy(), x.numpy().transpose(2, 1, 0))
    np.testing.assert_array_equal(x.permute(1, 2, 0).numpy(), x.numpy().transpose(1, 2, 0))
    np.testing.assert_array_equal(x.transpose().numpy(), x.numpy().T)
    assert x.transpose(1, 2).data.flags.c_contiguous
    gradcheck_on(device, lambda t: t.permute(2, 0, 1), _rand(2, 3, 4))
    gradcheck_on(device, lambda t: t.T, _rand(3, 5))
    with pytest.raises(ValueError, match="permutation"):
        x.permute(0, 0, 1)


def test_getitem_basic_and_advanced(device):
    gradcheck_on(device, lambda t: t[1:, ::2], _rand(3, 5))
    gradcheck_on(device, lambda t: t[..., 1], _rand(2, 3, 4))
    idx = np.array([0, 2, 0, 0])  # duplicates accumulate (scatter-add)
    gradcheck_on(device, lambda t: t[idx], _rand(3, 2))
    x = ag.tensor(np.arange(4.0), requires_grad=True, device=device)
    x[[1, 1, 3]].backward(np.array([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 3.0, 0.0, 3.0])


def test_cat_split_chunk_stack(device):
    a, b = _rand(2, 3, seed=1), _rand(2, 1, seed=2)
    x = ag.cat([ag.tensor(a, device=device), ag.tensor(b, device=device)], dim=1)
    np.testing.assert_array_equal(x.numpy(), np.concatenate([a, b], 1))
    gradcheck_on(device, lambda p, q: ag.cat([p, q], dim=-1), a, b)
    gradcheck_on(device, lambda p, q: ag.stack([p, q], dim=1), a, _rand(2, 3, seed=3))
    parts = ag.split(ag.tensor(_rand(5, 2), device=device), 2)  # PyTorch: pieces of 2
    assert [p.shape for p in parts] == [(2, 2), (2, 2), (1, 2)]
    assert [p.shape for p in ag.split(ag.tensor(_rand(5, 2)), [1, 4])] == [(1, 2), (4, 2)]
    assert [p.shape for p in ag.chunk(ag.tensor(_rand(2, 7)), 3, dim=1)] == [(2, 3)] * 2 + [(2, 1)]
    gradcheck_on(device, lambda t: ag.split(t, 3, dim=-1), _rand(2, 6))
    gradcheck_on(device, lambda t: ag.split(t, [1, 3], dim=1), _rand(2, 4))
    gradcheck_on(device, lambda t: ag.chunk(t, 2)[1], _rand(4, 2))
    with pytest.raises(ValueError, match="sum to 5"):
        ag.split(ag.tensor(_rand(5, 2)), [1, 2])
    with pytest.raises(ValueError, match="must be positive"):
        ag.split(ag.tensor(_rand(5, 2)), 0)


def test_empty_extents(device):
    x = ag.tensor(np.zeros((0, 3)), requires_grad=True, device=device)
    y = x.reshape(3, 0).T
    y.backward(np.zeros((0, 3)))
    assert x.grad.shape == (0, 3)
    parts = ag.split(ag.tensor(np.zeros((0, 2))), 2)
    assert [p.shape for p in parts] == [(0, 2)]


def test_to_dtype_is_differentiable(device):
    x = ag.tensor(np.array([1.0, 2.5, -3.0]), requires_grad=True, device=device)
    y = x.to(dtype=np.float32)
    assert y.dtype == np.float32 and y.requires_grad and x.to(dtype=np.float64) is x
    (y * 2.0).backward(np.ones(3, np.float32))
    assert x.grad.dtype == np.float64
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0, 2.0])
    z = ag.tensor(np.array([0.1, 1 / 3]), requires_grad=True, device=device)
    z.float().backward(np.array([0.1, 1 / 3], np.float32))  # the grad is cast back to f64
    np.testing.assert_array_equal(z.grad.numpy(), np.array([0.1, 1 / 3], np.float32))


def test_broadcast_to_and_top_level_reductions(device):
    gradcheck_on(device, lambda t: t.broadcast_to((2, 3, 4)), _rand(3, 1))
    # torch.max(t, 0) is (values, indices)
    gradcheck_on(device, lambda t: ag.sum(t, 0) + ag.mean(t, 0) + ag.max(t, 0).values,
                 _rand(3, 2))


def test_numpy_operand_on_the_left(device):
    x = ag.tensor(np.array([1.0, 2.0]), requires_grad=True, device=device)
    y = np.array([3.0, 4.0]) * x - np.array([1.0, 1.0])
    assert isinstance(y, ag.Tensor)
    np.testing.assert_array_equal(y.numpy(), [2.0, 7.0])


@pytest.mark.gpu
def test_device_round_trip_carries_gradient(accelerator):
    x = ag.tensor(np.array([1.0, -2.0]), requires_grad=True)
    y = x.to(device="cuda")
    assert y.device == accelerator and y.requires_grad
    z = (y * 3.0).cpu()
    assert z.device == "cpu"
    z.backward(np.ones(2))
    assert x.grad.device == "cpu"
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


def test_advanced_index_forms(device):
    x = _rand(4, 3)
    gradcheck_on(device, lambda t: t[np.array([[3, -1], [0, 3]])], x)     # rows, negative
    gradcheck_on(device, lambda t: t[np.array([0, 2, 0]), np.array([1, 1, 1])], x)
    gradcheck_on(device, lambda t: t[:, [2, 0, 2]], x)
    gradcheck_on(device, lambda t: t[x > 0], x)                             # bool mask
    idx = ag.tensor(np.array([1, 1]), device=device)
    t = ag.tensor(x, requires_grad=True, device=device)
    t[idx].backward(np.ones((2, 3)))
    np.testing.assert_array_equal(t.grad.numpy(), np.outer([0, 2, 0, 0], np.ones(3)))


@pytest.mark.gpu
def test_cpu_and_cuda_agree_on_a_small_network():
    from autograd.nn import functional as F

    rng = np.random.default_rng(0)
    arrays = [rng.uniform(-1, 1, s).astype(np.float32) for s in ((6, 8), (8, 8), (8,), (8,))]
    target = rng.integers(0, 8, 6)
    grads = {}
    for device in ("cpu", "cuda"):
        x, w, g, b = [ag.tensor(a, requires_grad=True, device=device) for a in arrays]
        h = F.layer_norm(F.gelu(F.linear(x, w, b)), 8, g, b)
        qkv = h.reshape(1, 1, 6, 8)
        h = F.scaled_dot_product_attention(qkv, qkv, qkv, is_causal=True).reshape(6, 8)
        F.cross_entropy(h, target).backward()
        grads[device] = [t.grad.numpy() for t in (x, w, g, b)]
    for c, d in zip(grads["cpu"], grads["cuda"], strict=True):
        np.testing.assert_allclose(d, c, rtol=1e-4, atol=1e-5)
