"""nn.MultiheadAttention against a NumPy reference (batch_first both ways, masks, weights),
gradcheck, torch-layout loading, torch itself when importable; bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd import nn

E, H = 8, 2
RNG = np.random.default_rng(21)


def _mha(**kw):
    m = nn.MultiheadAttention(E, H, dtype=np.float64, seed=4, **kw)
    with ag.no_grad():  # non-zero biases so that the reference checks them
        nn.init.normal_(m.in_proj_bias, generator=np.random.default_rng(1))
        nn.init.normal_(m.out_proj.bias, generator=np.random.default_rng(2))
    return m


def _ref(m, q, k, v, add=None):
    """NumPy MHA over batch-first [N, L, E] inputs: (output, head-averaged weights)."""
    w, b = m.in_proj_weight.numpy(), m.in_proj_bias.numpy()
    proj = [x @ w[:, i * E:(i + 1) * E] + b[i * E:(i + 1) * E] for i, x in enumerate((q, k, v))]
    n, lq = q.shape[0], q.shape[1]
    qh, kh, vh = (p.reshape(n, -1, H, E // H).transpose(0, 2, 1, 3) for p in proj)
    s = qh @ kh.swapaxes(-1, -2) / np.sqrt(E // H) + (0 if add is None else add)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = (p @ vh).transpose(0, 2, 1, 3).reshape(n, lq, E)
    return o @ m.out_proj.weight.numpy() + m.out_proj.bias.numpy(), p.mean(1)


def test_self_and_cross_attention_batch_first():
    m = _mha(batch_first=True)
    x, kv = RNG.standard_normal((2, 5, E)), RNG.standard_normal((2, 7, E))
    out, w = m(ag.tensor(x), ag.tensor(x), ag.tensor(x))
    want_o, want_w = _ref(m, x, x, x)
    np.testing.assert_allclose(out.numpy(), want_o, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w.numpy(), want_w, rtol=1e-12, atol=1e-12)
    out, w = m(ag.tensor(x), ag.tensor(kv), ag.tensor(kv), need_weights=False)
    assert w is None
    np.testing.assert_allclose(out.numpy(), _ref(m, x, kv, kv)[0], rtol=1e-12, atol=1e-12)


def test_sequence_first_masks_and_per_head_weights():
    m = _mha()  # batch_first=False: [L, N, E]
    x = RNG.standard_normal((5, 2, E))
    blocked = np.triu(np.ones((5, 5), bool), 1)  # torch MHA: True = not attended
    pad = np.array([[False] * 4 + [True], [False] * 5])
    out, w = m(ag.tensor(x), ag.tensor(x), ag.tensor(x), attn_mask=blocked,
               key_padding_mask=pad, average_attn_weights=False)
    add = np.where(blocked[None, None] | pad[:, None, None, :], -np.inf, 0.0)
    xb = x.transpose(1, 0, 2)
    want_o, _ = _ref(m, xb, xb, xb, add)
    np.testing.assert_allclose(out.numpy(), want_o.transpose(1, 0, 2), rtol=1e-12, atol=1e-12)
    assert w.shape == (2, H, 5, 5) and np.all(w.numpy()[..., 4][0] == 0)
    float_mask = RNG.standard_normal((5, 5))
    out, _ = m(ag.tensor(x), ag.tensor(x), ag.tensor(x), attn_mask=float_mask,
               key_padding_mask=pad)
    add = float_mask + np.where(pad[:, None, None, :], -np.inf, 0.0)
    np.testing.assert_allclose(out.numpy(), _ref(m, xb, xb, xb, add)[0].transpose(1, 0, 2),
                               rtol=1e-12, atol=1e-12)
    causal, _ = m(ag.tensor(x), ag.tensor(x), ag.tensor(x), is_causal=True, need_weights=False)
    masked, _ = m(ag.tensor(x), ag.tensor(x), ag.tensor(x), attn_mask=blocked)
    np.testing.assert_allclose(causal.numpy(), masked.numpy(), rtol=1e-12, atol=1e-12)


def test_unbatched_and_dropout_only_in_training():
    m = _mha(dropout=0.5)
    x = ag.tensor(RNG.standard_normal((4, E)))
    m.eval()
    out, w = m(x, x, x)
    assert out.shape == (4, E) and w.shape == (4, 4)
    np.testing.assert_allclose(out.numpy(), _ref(m, *(x.numpy()[None],) * 3)[0][0], rtol=1e-12)
    m.train()
    assert not np.allclose(m(x, x, x)[0].numpy(), out.numpy())


def test_gradcheck():
    m = _mha(batch_first=True)
    x = RNG.standard_normal((1, 3, E))
    mask = np.array([[False, True, False]] * 3)

    def fn(q, kv):
        return m(q, kv, kv, attn_mask=mask)[0]

    assert ag.gradcheck(fn, [ag.tensor(x, requires_grad=True),
                             ag.tensor(x[:, ::-1].copy(), requires_grad=True)])
    out = m(ag.tensor(x), ag.tensor(x), ag.tensor(x))[0]
    out.sum().backward()
    assert all(p.grad is not None for p in m.parameters())


def test_state_dict_keys_and_torch_layout():
    m = _mha()
    assert list(m.state_dict()) == ["in_proj_weight", "in_proj_bias", "out_proj.weight",
                                    "out_proj.bias"]
    torch_sd = m.state_dict(layout="torch")
    assert torch_sd["in_proj_weight"].shape == (3 * E, E)
    other = nn.MultiheadAttention(E, H, dtype=np.float64, seed=9)
    other.load_state_dict(torch_sd, layout="torch")
    for (name, a), b in zip(m.state_dict().items(), other.state_dict().values(), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("kwargs,match", [
    (dict(embed_dim=6, num_heads=4), "multiple of num_heads"),
    (dict(kdim=3), "not supported"),
    (dict(dropout=1.0), "dropout"),
])
def test_bad_arguments(kwargs, match):
    args = dict(embed_dim=E, num_heads=H) | kwargs
    with pytest.raises(ValueError, match=match):
        nn.MultiheadAttention(**args)


def test_against_torch():
    torch = pytest.importorskip("torch")
    m = _mha(batch_first=True)
    t = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64)
    t.load_state_dict({k: torch.tensor(v) for k, v in m.state_dict(layout="torch").items()})
    x = RNG.standard_normal((2, 5, E))
    pad = np.array([[False] * 4 + [True], [False] * 5])
    want_o, want_w = t(*(torch.tensor(x),) * 3, key_padding_mask=torch.tensor(pad))
    out, w = m(*(ag.tensor(x),) * 3, key_padding_mask=pad)
    np.testing.assert_allclose(out.numpy(), want_o.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w.numpy(), want_w.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_host_bool_masks_follow_the_inputs_to_the_device():
    """NumPy bool masks (torch's convention) with device inputs: moved to the inputs'
    device, both alone and combined, giving the host module's result."""
    host = _mha()
    dev = _mha().to("emulated")
    x = RNG.standard_normal((5, 2, E))
    blocked = np.triu(np.ones((5, 5), bool), 1)
    pad = np.array([[False] * 4 + [True], [False] * 5])
    for kw in (dict(attn_mask=blocked), dict(key_padding_mask=pad),
               dict(attn_mask=blocked, key_padding_mask=pad)):
        want, _ = host(ag.tensor(x), ag.tensor(x), ag.tensor(x), **kw)
        xd = ag.tensor(x).to("emulated")
        got, _ = dev(xd, xd, xd, **kw)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12,
                                   err_msg=str(list(kw)))
