"""Issue 13's conformance list: every PyTorch name it asks for, each run once against NumPy.

One row per name: the call a PyTorch user would type, and what NumPy (float64) says the
result is. Deeper tests (gradcheck, devices, bad input) live beside each op's own tests;
this file proves the list is complete and that each name does what its torch namesake does.
"""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd import nn, optim
from autograd.nn import functional as F

RNG = np.random.default_rng(13)
A = RNG.standard_normal((3, 4))
B = RNG.standard_normal((3, 4))
SQ = RNG.standard_normal((4, 4))
POS = np.abs(A) + 0.5
IDX = np.array([[0, 2, 1, 3], [3, 3, 0, 1], [1, 0, 2, 2]])


def t(a, **kw):
    return ag.tensor(np.asarray(a), **kw)


def np_of(x):
    if isinstance(x, ag.Tensor):
        return x.numpy()
    return np.asarray(x)


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _scatter_add(base, index, src):
    out = base.copy()
    for i in range(index.shape[0]):
        for j in range(index.shape[1]):
            out[i, index[i, j]] += src[i, j]
    return out


# (name, torch-style call, NumPy expectation)
TENSOR_ROWS = [
    ("sum(dim, keepdim)", lambda: t(A).sum(dim=1, keepdim=True), A.sum(1, keepdims=True)),
    ("mean(dim)", lambda: t(A).mean(dim=0), A.mean(0)),
    ("max(dim).values", lambda: t(A).max(dim=1).values, A.max(1)),
    ("max(dim).indices", lambda: t(A).max(dim=1).indices, A.argmax(1)),
    ("min(dim) unpacks", lambda: t(A).min(dim=0)[0], A.min(0)),
    ("argmax", lambda: t(A).argmax(dim=1), A.argmax(1)),
    ("argmin", lambda: t(A).argmin(), A.argmin()),
    ("topk.values", lambda: t(A).topk(2, dim=1).values, -np.sort(-A, axis=1)[:, :2]),
    ("var", lambda: t(A).var(dim=1), A.var(1, ddof=1)),
    ("std", lambda: t(A).std(dim=0, keepdim=True), A.std(0, ddof=1, keepdims=True)),
    ("prod", lambda: t(A).prod(dim=1), A.prod(1)),
    ("__pow__", lambda: t(POS) ** 1.5, POS ** 1.5),
    ("__rpow__", lambda: 2.0 ** t(A), 2.0 ** A),
    ("__lt__", lambda: t(A) < t(B), A < B),
    ("__le__", lambda: t(A) <= 0.0, A <= 0.0),
    ("__gt__", lambda: t(A) > t(B), A > B),
    ("__ge__", lambda: t(A) >= t(B), A >= B),
    ("__eq__", lambda: t(A) == t(A), np.ones_like(A, dtype=bool)),
    ("__ne__", lambda: t(A) != t(B), A != B),
    ("__neg__", lambda: -t(A), -A),
    ("abs", lambda: t(A).abs(), np.abs(A)),
    ("contiguous", lambda: t(A).T.contiguous(), A.T),
    ("squeeze", lambda: t(A[None]).squeeze(0), A),
    ("unsqueeze", lambda: t(A).unsqueeze(1), A[:, None]),
    ("flatten", lambda: t(A[None]).flatten(1), A.reshape(1, -1)),
    ("expand", lambda: t(A[:1]).expand(3, -1), np.broadcast_to(A[:1], (3, 4))),
    ("repeat", lambda: t(A).repeat(2, 1), np.tile(A, (2, 1))),
    ("masked_fill", lambda: t(A).masked_fill(t(A > 0), 0.5), np.where(A > 0, 0.5, A)),
    ("where", lambda: t(A).where(t(A > 0), t(B)), np.where(A > 0, A, B)),
    ("autograd.where", lambda: ag.where(t(A > 0), t(A), t(B)), np.where(A > 0, A, B)),
    ("gather", lambda: t(A).gather(1, t(IDX)), np.take_along_axis(A, IDX, 1)),
    ("scatter_add", lambda: t(A).scatter_add(1, t(IDX), t(B)), _scatter_add(A, IDX, B)),
    ("index_select", lambda: t(A).index_select(1, t(np.array([3, 0]))), A[:, [3, 0]]),
    ("clamp", lambda: t(A).clamp(-0.5, 0.5), np.clip(A, -0.5, 0.5)),
    ("log", lambda: t(POS).log(), np.log(POS)),
    ("sqrt", lambda: t(POS).sqrt(), np.sqrt(POS)),
    ("rsqrt", lambda: t(POS).rsqrt(), 1 / np.sqrt(POS)),
    ("sigmoid", lambda: t(A).sigmoid(), 1 / (1 + np.exp(-A))),
    ("silu", lambda: t(A).silu(), A / (1 + np.exp(-A))),
    ("tril", lambda: t(SQ).tril(), np.tril(SQ)),
    ("triu", lambda: t(SQ).triu(1), np.triu(SQ, 1)),
    ("float", lambda: t(A).double().float().dtype == np.float32, True),
    ("half", lambda: t(A).half().dtype == np.float16, True),
    ("bfloat16", lambda: t(A).bfloat16().dtype.name, "bfloat16"),
    ("matmul broadcast", lambda: t(RNG.standard_normal((1, 7, 3)) * 0 + 1)
     @ t(np.ones((3, 3, 5))), np.full((3, 7, 5), 3.0)),
    ("arange", lambda: ag.arange(0, 10, 3), np.arange(0, 10, 3)),
    ("zeros_like", lambda: ag.zeros_like(t(A)), np.zeros_like(A)),
    ("ones_like", lambda: ag.ones_like(t(A)), np.ones_like(A)),
    ("full_like", lambda: ag.full_like(t(A), 2.5), np.full_like(A, 2.5)),
    ("eye", lambda: ag.eye(3, 4), np.eye(3, 4)),
    ("__array__", lambda: np.asarray(t(A)), A),
    ("from_dlpack", lambda: ag.from_dlpack(A), A),
]


@pytest.mark.parametrize("name,call,expected", TENSOR_ROWS, ids=[r[0] for r in TENSOR_ROWS])
def test_tensor_name(name, call, expected):
    got = call()
    if isinstance(expected, (bool, str)):
        assert got == expected
        return
    got = np_of(got)
    assert got.shape == np.shape(expected), name
    if np.asarray(expected).dtype == bool:
        assert got.dtype == bool, name
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=2e-6, atol=2e-6,
                                   err_msg=name)


def test_random_factories_shapes_and_ranges():
    ag.manual_seed(0)
    assert ag.rand(2, 3).shape == (2, 3)
    r = ag.rand(1000).numpy()
    assert 0.0 <= r.min() and r.max() < 1.0
    assert ag.randn(4, 5).shape == (4, 5)
    i = ag.randint(3, 7, (500,)).numpy()
    assert i.dtype == np.int64 and i.min() == 3 and i.max() == 6


def test_setitem_and_inplace_methods():
    x = t(A)
    x[0, 1:3] = 7.0
    want = A.copy()
    want[0, 1:3] = 7.0
    np.testing.assert_allclose(x.numpy(), want, rtol=1e-6)
    y = t(A)
    y.add_(t(B)).mul_(2.0)
    np.testing.assert_allclose(y.numpy(), (A + B) * 2, rtol=1e-6)
    y.copy_(t(B))
    np.testing.assert_allclose(y.numpy(), B, rtol=1e-6)
    y.fill_(3.0)
    assert np.all(y.numpy() == 3.0)
    y.zero_()
    assert np.all(y.numpy() == 0.0)


def test_interop_protocols():
    x = t(A)
    assert x.__dlpack_device__()[0] == 1  # kDLCPU
    assert np.from_dlpack(x).shape == A.shape
    assert not hasattr(x, "__cuda_array_interface__")  # host tensors do not claim a device


def test_nn_modules():
    ag.manual_seed(0)
    d = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Identity()})
    assert set(d.keys()) == {"a", "b"} and len(list(d.parameters())) == 2
    pl = nn.ParameterList([nn.Parameter(ag.zeros(2)), nn.Parameter(ag.ones(3))])
    assert len(list(pl.parameters())) == 2
    x = t(A)
    np.testing.assert_allclose(nn.SiLU()(x).numpy(), A / (1 + np.exp(-A)), rtol=1e-6)
    np.testing.assert_allclose(nn.Tanh()(x).numpy(), np.tanh(A), rtol=1e-6)
    np.testing.assert_allclose(nn.Sigmoid()(x).numpy(), 1 / (1 + np.exp(-A)), rtol=1e-6)
    np.testing.assert_allclose(nn.Identity()(x).numpy(), A)
    target = np.array([1, 0, 3])
    ce = nn.CrossEntropyLoss()(x, t(target)).item()
    want = -np.log(_softmax(A)[np.arange(3), target]).mean()
    assert abs(ce - want) < 1e-5
    assert abs(nn.MSELoss()(x, t(B)).item() - ((A - B) ** 2).mean()) < 1e-5
    mha = nn.MultiheadAttention(4, 2, batch_first=True)
    q = t(A[None].astype(np.float32))
    out, _ = mha(q, q, q)
    assert out.shape == (1, 3, 4)


def test_nn_init_and_module_methods():
    ag.manual_seed(0)
    lin = nn.Linear(64, 32)
    nn.init.zeros_(lin.bias)
    assert np.all(lin.bias.numpy() == 0)
    nn.init.ones_(lin.bias)
    assert np.all(lin.bias.numpy() == 1)
    nn.init.normal_(lin.weight, mean=0.0, std=0.02)
    assert abs(lin.weight.numpy().std() - 0.02) < 0.004
    nn.init.xavier_uniform_(lin.weight)
    assert np.abs(lin.weight.numpy()).max() <= np.sqrt(6 / (64 + 32)) + 1e-7
    nn.init.kaiming_uniform_(lin.weight)
    nn.init.trunc_normal_(lin.weight, std=1.0, a=-2.0, b=2.0)
    assert np.abs(lin.weight.numpy()).max() <= 2.0
    seen = []
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    seq.apply(lambda m: seen.append(type(m).__name__))
    assert "Linear" in seen and "Sequential" in seen
    assert [n for n, _ in seq.named_modules()][0] == ""
    m = nn.Module()
    m.register_buffer("running", ag.zeros(3))
    assert "running" in m.state_dict()


def test_functional_names():
    x = t(A)
    np.testing.assert_allclose(F.pad(x, (1, 2)).numpy(), np.pad(A, ((0, 0), (1, 2))))
    np.testing.assert_allclose(F.silu(x).numpy(), A / (1 + np.exp(-A)), rtol=1e-6)
    np.testing.assert_allclose(F.sigmoid(x).numpy(), 1 / (1 + np.exp(-A)), rtol=1e-6)
    oh = F.one_hot(t(np.array([0, 2, 1])), num_classes=3).numpy()
    np.testing.assert_array_equal(oh, np.eye(3, dtype=np.int64)[[0, 2, 1]])
    assert abs(F.mse_loss(x, t(B), reduction="sum").item() - ((A - B) ** 2).sum()) < 1e-4
    logp = np.log(_softmax(A))
    target = np.array([1, 0, 3])
    nll = F.nll_loss(t(logp), t(target)).item()
    assert abs(nll + logp[np.arange(3), target].mean()) < 1e-5
    q = t(RNG.standard_normal((1, 2, 5, 4)))
    mask = np.tril(np.ones((5, 5), dtype=bool))
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=t(mask), dropout_p=0.0).numpy()
    qq = q.numpy().astype(np.float64)
    s = qq @ qq.swapaxes(-1, -2) / 2.0
    want = _softmax(np.where(mask, s, -np.inf)) @ qq
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_optim_names():
    w = nn.Parameter(t(np.ones(3)))
    opt = optim.Adam([w], lr=0.1)
    w.grad = t(np.array([1.0, -1.0, 0.5]))
    opt.step()
    np.testing.assert_allclose(w.numpy(), 1 - 0.1 * np.sign([1.0, -1.0, 0.5]), rtol=1e-5)
    sched = optim.lr_scheduler
    for make in (lambda o: sched.LambdaLR(o, lambda s: 0.5 ** s),
                 lambda o: sched.StepLR(o, step_size=2, gamma=0.1),
                 lambda o: sched.CosineAnnealingLR(o, T_max=10),
                 lambda o: sched.LinearLR(o, start_factor=0.5, total_iters=4)):
        o = optim.Adam([nn.Parameter(t(np.ones(2)))], lr=1.0)
        first = make(o)
        o.step()
        first.step()
        second = make(optim.Adam([nn.Parameter(t(np.ones(2)))], lr=1.0))
        second.load_state_dict(first.state_dict())
        assert second.get_last_lr() == first.get_last_lr()
    o = optim.Adam([nn.Parameter(t(np.ones(2)))], lr=1.0)
    seq = sched.SequentialLR(o, [sched.LinearLR(o, start_factor=0.5, total_iters=2),
                                 sched.StepLR(o, step_size=1, gamma=0.5)], milestones=[2])
    lrs = []
    for _ in range(4):
        o.step()
        seq.step()
        lrs.append(seq.get_last_lr()[0])
    assert lrs[-1] < lrs[1]


def test_modes_and_io(tmp_path):
    with ag.inference_mode():
        y = t(A, requires_grad=True) * 2
    assert not y.requires_grad
    path = tmp_path / "w.safetensors"
    ag.save({"a": t(A)}, str(path))
    np.testing.assert_allclose(ag.load(str(path))["a"].numpy(), A)
    lin = nn.Linear(3, 3, bias=False)
    torch_layout = SQ[:3, :3]  # [out, in], as torch stores it
    lin.load_state_dict({"weight": t(torch_layout)}, layout="torch")
    np.testing.assert_allclose(lin.weight.numpy(), torch_layout.T.astype(np.float32))
