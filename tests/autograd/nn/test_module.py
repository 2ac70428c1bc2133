"""Module tree: registration, names, state_dict round trips, modes, to(), apply, containers."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from autograd import nn
from gpuplan.dtypes import bfloat16, float32, float64


class Inner(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 4, seed=seed)
        self.norm = nn.LayerNorm(4)
        self.register_buffer("scale", np.full((4,), 2.0, np.float32))

    def forward(self, x):
        return self.norm(self.lin(x)) * ag.tensor(self.scale)


class Outer(nn.Module):
    def __init__(self, seed: int = 0, dtype=float32) -> None:
        super().__init__()
        self.first = Inner(seed)
        self.act = nn.ReLU()
        self.second = nn.Linear(4, 2, bias=False, dtype=dtype, seed=seed + 1)
        self.gain = nn.Parameter(np.ones((2,), dtype))

    def forward(self, x):
        return self.second(self.act(self.first(x))) * self.gain


# A module's own parameters come before its children's (pre-order, as in PyTorch).
NAMES = ["gain", "first.lin.weight", "first.lin.bias", "first.norm.weight", "first.norm.bias",
         "second.weight"]


def test_named_parameters_follow_registration_order():
    m = Outer()
    assert [n for n, _ in m.named_parameters()] == NAMES
    assert [tuple(p.shape) for p in m.parameters()] == [(2,), (3, 4), (4,), (4,), (4,), (4, 2)]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in m.parameters())
    assert m.num_parameters() == 12 + 4 + 4 + 4 + 8 + 2
    assert [n for n, _ in m.named_modules()] == ["", "first", "first.lin", "first.norm",
                                                 "act", "second"]
    assert [n for n, _ in m.named_parameters(recurse=False)] == ["gain"]
    assert m.second.bias is None
    assert [n for n, _ in m.named_buffers()] == ["first.scale"]


def test_shared_parameter_listed_once():
    m = Outer()
    m.tied = m.second.weight  # the first name met in traversal order is kept
    assert [n for n, _ in m.named_parameters()] == ["gain", "tied"] + NAMES[1:-1]
    shared = nn.Sequential(m.first, m.first)
    assert len(list(shared.parameters())) == 4


def test_reassignment_replaces_registration():
    m = Outer()
    m.first = nn.Linear(3, 4, dtype=float32)  # a replaced module keeps its place
    m.gain = nn.Parameter(np.zeros((2,), float32))
    assert [n for n, _ in m.named_parameters()] == ["gain", "first.weight", "first.bias",
                                                    "second.weight"]
    m.gain = None
    assert "gain" not in dict(m.named_parameters())
    m.second = nn.Identity()
    assert "second.weight" not in dict(m.named_parameters())
    del m.first
    assert [n for n, _ in m.named_parameters()] == []
    assert not hasattr(m, "first")


def test_setattr_before_init_is_an_error():
    class Bad(nn.Module):
        def __init__(self):
            self.x = 1

    with pytest.raises(AttributeError, match="Module.__init__"):
        Bad()


@pytest.mark.parametrize("dtype", [float32, float64, bfloat16], ids=["f32", "f64", "bf16"])
def test_state_dict_round_trip_is_exact(device, dtype):
    a = Outer(seed=1, dtype=dtype).to(device)
    b = Outer(seed=2, dtype=dtype).to(device)
    assert not np.array_equal(gp.to_host(a.second.weight.data), gp.to_host(b.second.weight.data))
    state = a.state_dict()
    assert list(state) == NAMES + ["first.scale"]
    assert all(isinstance(v, np.ndarray) for v in state.values())
    assert state["second.weight"].dtype == dtype
    result = b.load_state_dict(state)
    assert result.missing_keys == [] and result.unexpected_keys == []
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert q.device == device, name
        np.testing.assert_array_equal(gp.to_host(p.data), gp.to_host(q.data), err_msg=name)
        assert gp.to_host(q.data).dtype == gp.to_host(p.data).dtype
    # state_dict holds copies: later changes to the model do not leak into it, nor back.
    state["gain"][...] = 7.0
    assert float(gp.to_host(a.gain.data)[0]) == 1.0
    a.gain.data[...] = 5.0
    assert float(a.state_dict()["gain"][0]) == 5.0 and float(state["gain"][0]) == 7.0


def test_load_state_dict_keeps_parameter_objects_and_casts():
    m = Outer()
    weight = m.second.weight
    state = {k: v.astype(np.float64) for k, v in Outer(seed=5).state_dict().items()}
    m.load_state_dict(state)
    assert m.second.weight is weight and weight.data.dtype == float32
    np.testing.assert_array_equal(weight.data, state["second.weight"].astype(np.float32))


def test_load_state_dict_errors():
    m = Outer()
    state = m.state_dict()
    missing = dict(state)
    del missing["gain"]
    with pytest.raises(KeyError, match="missing keys \\['gain'\\]"):
        m.load_state_dict(missing)
    extra = dict(state, bogus=np.zeros(2))
    with pytest.raises(KeyError, match="unexpected keys \\['bogus'\\]"):
        m.load_state_dict(extra)
    res = m.load_state_dict(extra, strict=False)
    assert res.unexpected_keys == ["bogus"] and res.missing_keys == []
    res = m.load_state_dict(missing, strict=False)
    assert res.missing_keys == ["gain"]
    bad = dict(state, gain=np.zeros((3,), np.float32))
    before = m.gain.data.copy()
    with pytest.raises(ValueError, match="'gain': expected shape \\(2,\\), given \\(3,\\)"):
        m.load_state_dict(bad)
    np.testing.assert_array_equal(m.gain.data, before)


def test_train_eval_propagate():
    m = Outer()
    assert all(x.training for x in m.modules())
    assert m.eval() is m
    assert not any(x.training for x in m.modules())
    m.first.train()
    assert m.first.lin.training and not m.training
    m.train()
    assert all(x.training for x in m.modules())


def test_to_dtype_casts_in_place_and_keeps_identity():
    m = Outer()
    params = list(m.parameters())
    expect = [p.data.astype(np.float64) for p in params]
    m.second.weight.grad = ag.tensor(np.ones((4, 2), np.float32))
    assert m.to(dtype=np.float64) is m
    for p, q, e in zip(params, m.parameters(), expect, strict=True):
        assert p is q and p.data.dtype == float64
        np.testing.assert_array_equal(p.data, e)
    assert m.second.weight.grad.data.dtype == float64
    assert m.first.scale.dtype == float64
    m.to(dtype=bfloat16)
    assert all(p.data.dtype == bfloat16 for p in m.parameters())
    with pytest.raises(ValueError, match="float dtype"):
        m.to(dtype=np.int32)


@pytest.mark.gpu
def test_to_device_and_back(accelerator):
    m = Outer()
    before = m.state_dict()
    m.to("cuda")  # the emulated device under GPUPLAN_DEVICE=emulated
    assert all(p.device == accelerator and gp.device_of(p.data) == accelerator
               for p in m.parameters())
    assert gp.device_of(m.first.scale) == accelerator
    x = ag.tensor(np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32),
                  device="cuda")
    y = m(x)
    assert y.device == accelerator
    m.to("cpu")
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


def test_zero_grad_and_apply():
    m = Outer()
    x = ag.tensor(np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32))
    m(x).sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad(set_to_none=False)
    assert all(float(np.abs(p.grad.data).max()) == 0.0 for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())
    visited = []
    assert m.apply(lambda mod: visited.append(type(mod).__name__)) is m
    assert visited == ["Linear", "LayerNorm", "Inner", "ReLU", "Linear", "Outer"]


def test_sequential():
    rng = np.random.default_rng(3)
    seq = nn.Sequential(nn.Linear(3, 5, seed=0), nn.ReLU(), nn.Linear(5, 2, seed=1))
    assert len(seq) == 3 and isinstance(seq[1], nn.ReLU) and seq[-1] is seq[2]
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias", "2.weight",
                                                      "2.bias"]
    x = rng.standard_normal((4, 3)).astype(np.float32)
    w0, b0 = seq[0].weight.data, seq[0].bias.data
    w2, b2 = seq[2].weight.data, seq[2].bias.data
    expect = np.maximum(x @ w0 + b0, 0) @ w2 + b2
    np.testing.assert_allclose(seq(ag.tensor(x)).data, expect, rtol=1e-5, atol=1e-6)
    seq.append(nn.Identity())
    assert len(seq) == 4 and list(seq)[3].__class__ is nn.Identity
    assert "Linear(in_features=3, out_features=5, bias=True)" in repr(seq)


def test_module_list():
    ml = nn.ModuleList([nn.Linear(2, 2, seed=i) for i in range(3)])
    assert len(ml) == 3 and [n for n, _ in ml.named_parameters()][-1] == "2.bias"
    with pytest.raises(NotImplementedError):
        ml(None)


def test_parameter_wraps_tensor_and_array():
    t = ag.tensor(np.arange(3.0))
    p = nn.Parameter(t)
    assert p.requires_grad and p.is_leaf and np.array_equal(p.data, t.data)
    frozen = nn.Parameter(np.zeros(2), requires_grad=False)
    assert not frozen.requires_grad
    assert "Parameter(shape=(3,)" in repr(p)
