"""scaled_dot_product_attention with attn_mask (bool: True = attend; float: added; broadcast)
and dropout_p, against NumPy; gradchecks (the float mask gets a gradient); torch when
importable; bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd.nn import functional as F
from tests.helpers import gradcheck_on

RNG = np.random.default_rng(5)
Q, K, V = (RNG.standard_normal((2, 3, 4, 8)), RNG.standard_normal((2, 3, 6, 8)),
           RNG.standard_normal((2, 3, 6, 5)))
BOOL = RNG.uniform(size=(4, 6)) > 0.3
BOOL[:, 0] = True  # every query keeps a key
FLOAT = RNG.standard_normal((3, 1, 6))


def _ref(q, k, v, add, scale=None):
    s = q @ k.swapaxes(-1, -2) * (scale or 1 / np.sqrt(q.shape[-1])) + add
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("mask,add", [(BOOL, np.where(BOOL, 0.0, -np.inf)), (FLOAT, FLOAT),
                                      (BOOL[None, None], np.where(BOOL, 0.0, -np.inf))])
def test_masks_match_numpy(device, mask, add):
    q, k, v = (ag.tensor(a, device=device) for a in (Q, K, V))
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=ag.tensor(mask, device=device))
    np.testing.assert_allclose(got.numpy(), _ref(Q, K, V, add), rtol=1e-12, atol=1e-12)
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    np.testing.assert_allclose(got.numpy(), _ref(Q, K, V, add, 0.3), rtol=1e-12, atol=1e-12)


def test_bool_mask_equals_is_causal():
    q = ag.tensor(Q[:, :, :4])
    k, v = ag.tensor(K[:, :, :4]), ag.tensor(V[:, :, :4])
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True).numpy()
    masked = F.scaled_dot_product_attention(q, k, v, attn_mask=np.tril(np.ones((4, 4), bool)))
    np.testing.assert_allclose(masked.numpy(), causal, rtol=1e-12, atol=1e-12)


def test_gradcheck_with_float_mask_gets_mask_gradient(device):
    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    q, k, v = Q[:1, :2, :2, :4], K[:1, :2, :3, :4], V[:1, :2, :3, :3]  # small: emulated
    gradcheck_on(device, fn, q, k, v, FLOAT[:2, :, :3])
    gradcheck_on(device, lambda q, k, v: fn(q, k, v, BOOL[:2, :3]), q, k, v)


def test_dropout_uses_the_dropout_plan_on_probabilities(device):
    q, k, v = (ag.tensor(a, device=device) for a in (Q, K, V))
    ag.manual_seed(11)
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=BOOL, dropout_p=0.4).numpy()
    ag.manual_seed(11)
    scores = (q @ k.transpose(-2, -1)) * (1 / np.sqrt(8)) + ag.tensor(
        np.where(BOOL, 0.0, -np.inf), device=device)
    want = F.dropout(F.softmax(scores), 0.4) @ v
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)
    assert not np.allclose(got, _ref(Q, K, V, np.where(BOOL, 0.0, -np.inf)))

    def fn(q, k, v):  # the same mask on every evaluation
        ag.manual_seed(3)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)

    gradcheck_on(device, fn, Q[:1, :1], K[:1, :1, :4], V[:1, :1, :4])


@pytest.mark.parametrize("kwargs,match", [
    (dict(attn_mask=BOOL, is_causal=True), "not both"),
    (dict(attn_mask=np.ones((5, 6), bool)), "broadcast"),
    (dict(attn_mask=np.ones((4, 6), np.int64)), "bool or float"),
    (dict(dropout_p=1.5), "dropout_p"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        F.scaled_dot_product_attention(ag.tensor(Q), ag.tensor(K), ag.tensor(V), **kwargs)


def test_against_torch():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.tensor(a) for a in (Q, K, V))
    for mask in (BOOL, FLOAT):
        want = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=torch.tensor(mask)).numpy()
        got = F.scaled_dot_product_attention(ag.tensor(Q), ag.tensor(K), ag.tensor(V),
                                             attn_mask=mask).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_fully_masked_rows_give_zeros(device):
    mask = BOOL.copy()
    mask[2] = False  # query 2 may attend to no key
    q, k, v = (ag.tensor(a, device=device, requires_grad=True) for a in (Q, K, V))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = out.numpy()
    assert np.all(got[..., 2, :] == 0)
    keep = np.delete(np.arange(4), 2)
    np.testing.assert_allclose(got[..., keep, :], _ref(Q, K, V, np.where(BOOL, 0.0, -np.inf))[
        ..., keep, :], rtol=1e-12, atol=1e-12)
    out.sum().backward()
    assert np.all(np.isfinite(q.grad.numpy())) and np.all(q.grad.numpy()[..., 2, :] == 0)
    add = np.where(mask, 0.0, -np.inf)
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=add).numpy()
    assert np.all(got[..., 2, :] == 0) and np.all(np.isfinite(got))


@pytest.mark.gpu
def test_bool_mask_with_dead_rows_captures_in_a_graph(accelerator):
    """The bool mask's fill and the dead-row fix-up are selects, not mask indexing (which
    syncs with the host on a GPU): a step with them captures and replays the eager values."""
    import gpuplan as gp

    dead = BOOL.copy()
    dead[2] = False  # a query that sees no key: its output row is 0
    mask = ag.tensor(gp.asarray(dead, device=accelerator))

    def step(q, k, v):
        with ag.no_grad():
            t = [ag.tensor(a) for a in (q, k, v)]
            return F.scaled_dot_product_attention(*t, attn_mask=mask).data

    inputs = [gp.asarray(a.astype(np.float32), device=accelerator) for a in (Q, K, V)]
    eager = gp.to_host(step(*inputs))
    captured = gp.graphs.capture_step(step, *inputs, warmup=1)
    replayed = gp.to_host(captured(*inputs))
    np.testing.assert_array_equal(replayed, eager)
    assert not replayed[:, :, 2].any()
