"""ModuleDict, ParameterList, activation and loss modules, register_buffer (persistent, moved
by to), named_modules/apply, state_dict round trips, load_state_dict(layout="torch"), and
nn.init's formulas and statistics with a fixed seed."""

from __future__ import annotations

import math

import numpy as np
import pytest

import autograd as ag
from autograd import nn
from autograd.nn import functional as F

RNG = np.random.default_rng(8)
X = RNG.standard_normal((3, 4))


def test_module_dict_and_parameter_list():
    d = nn.ModuleDict({"a": nn.Linear(4, 2, seed=0), "b": nn.ReLU()})
    d["c"] = nn.Linear(2, 2, seed=1)
    assert list(d) == ["a", "b", "c"] and "b" in d and len(d) == 3
    assert [n for n, _ in d.named_parameters()] == ["a.weight", "a.bias", "c.weight", "c.bias"]
    assert isinstance(d.pop("b"), nn.ReLU) and list(d.keys()) == ["a", "c"]
    with pytest.raises(KeyError, match="without '.'"):
        d["x.y"] = nn.ReLU()
    with pytest.raises(TypeError, match="must be a Module"):
        d["z"] = 3
    pl = nn.ParameterList([ag.zeros(2), nn.Parameter(ag.ones(3))])
    pl.append(np.full((2, 2), 5.0, np.float32))
    assert all(isinstance(p, nn.Parameter) for p in pl) and len(pl) == 3
    assert [n for n, _ in pl.named_parameters()] == ["0", "1", "2"]
    assert pl[-1].shape == (2, 2)
    with pytest.raises(IndexError):
        pl[3]


def test_activation_and_loss_modules():
    x = ag.tensor(X)
    np.testing.assert_allclose(nn.SiLU()(x).numpy(), X / (1 + np.exp(-X)), rtol=1e-12)
    np.testing.assert_allclose(nn.Sigmoid()(x).numpy(), 1 / (1 + np.exp(-X)), rtol=1e-12)
    np.testing.assert_allclose(nn.Tanh()(x).numpy(), np.tanh(X), rtol=1e-12)
    assert nn.Identity(3, unused=True)(x) is x
    t = np.array([1, -100, 3])
    ce = nn.CrossEntropyLoss(reduction="sum", label_smoothing=0.1)(x, t)
    assert ce.item() == pytest.approx(F.cross_entropy(x, t, reduction="sum",
                                                      label_smoothing=0.1).item())
    w = np.array([1.0, 2.0, 3.0, 4.0])
    assert nn.CrossEntropyLoss(weight=w)(x, t).item() == pytest.approx(
        F.nll_loss(F.log_softmax(x, dim=1), t, weight=w).item())
    assert nn.NLLLoss(ignore_index=3)(x, np.array([0, 1, 3])).item() == pytest.approx(
        -(X[0, 0] + X[1, 1]) / 2)
    y = RNG.standard_normal((3, 4))
    assert nn.MSELoss(reduction="sum")(x, ag.tensor(y)).item() == pytest.approx(
        ((X - y) ** 2).sum())
    for cls in (nn.CrossEntropyLoss, nn.NLLLoss, nn.MSELoss):
        with pytest.raises(ValueError, match="reduction"):
            cls(reduction="avg")


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3, seed=0)
        self.emb = nn.Embedding(5, 3, seed=1)
        self.register_buffer("running", ag.tensor(np.arange(3.0)))
        self.register_buffer("scratch", np.zeros(2), persistent=False)
        self.register_buffer("absent", None)


def test_buffers_persistent_and_moved():
    net = _Net()
    assert [n for n, _ in net.named_buffers()] == ["running", "scratch"]
    sd = net.state_dict()
    assert list(sd) == ["lin.weight", "lin.bias", "emb.weight", "running"]
    running = net.running
    net.to(dtype=np.float64)
    assert net.running is running and net.running.dtype == np.float64
    assert net.scratch.dtype == np.float64 and net.lin.weight.dtype == np.float64
    net.load_state_dict({**sd, "running": np.array([7.0, 8.0, 9.0])})
    np.testing.assert_array_equal(net.running.numpy(), [7.0, 8.0, 9.0])
    with pytest.raises(KeyError, match="already exists"):
        net.register_buffer("lin", ag.zeros(1))
    with pytest.raises(TypeError, match="Tensor, an array or None"):
        net.register_buffer("bad", [1, 2])


def test_named_modules_and_apply_order():
    seq = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Tanh()))
    assert [n for n, _ in seq.named_modules()] == ["", "0", "1", "1.0", "1.1"]
    seen = []
    seq.apply(lambda m: seen.append(type(m).__name__))
    assert seen == ["Linear", "ReLU", "Tanh", "Sequential", "Sequential"]


def test_state_dict_round_trip_native_and_torch():
    a, b = _Net(), _Net()
    with ag.no_grad():
        nn.init.normal_(b.lin.weight, generator=np.random.default_rng(0))
    b.load_state_dict(a.state_dict())
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        np.testing.assert_array_equal(x, y, err_msg=k)
    torch_sd = a.state_dict(layout="torch")
    np.testing.assert_array_equal(torch_sd["lin.weight"], a.lin.weight.numpy().T)
    np.testing.assert_array_equal(torch_sd["emb.weight"], a.emb.weight.numpy())
    c = _Net()
    c.load_state_dict(torch_sd, layout="torch")
    np.testing.assert_array_equal(c.lin.weight.numpy(), a.lin.weight.numpy())


def test_load_square_torch_weight_is_transposed():
    lin = nn.Linear(3, 3, bias=False, dtype=np.float64)
    w_torch = RNG.standard_normal((3, 3))  # [out, in]
    lin.load_state_dict({"weight": ag.tensor(w_torch)}, layout="torch")
    np.testing.assert_array_equal(lin.weight.numpy(), w_torch.T)
    x = RNG.standard_normal((2, 3))
    np.testing.assert_allclose(lin(ag.tensor(x)).numpy(), x @ w_torch.T, rtol=1e-12)
    lin.load_state_dict({"weight": w_torch})  # native: taken as [in, out]
    np.testing.assert_array_equal(lin.weight.numpy(), w_torch)


def test_layout_refusals():
    lin = nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"PyTorch's \[out, in\] shape \(2, 3\), given \(3, 2\)"):
        lin.load_state_dict(lin.state_dict(), layout="torch")
    with pytest.raises(ValueError, match="layout must be"):
        lin.load_state_dict(lin.state_dict(), layout="jax")

    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(ag.zeros(2, 2))

    with pytest.raises(ValueError, match="cannot tell how Custom"):
        Custom().load_state_dict({"w": np.zeros((2, 2))}, layout="torch")
    Custom().load_state_dict({"w": np.ones((2, 2))})  # the native layout still loads


def test_init_formulas_and_statistics():
    ag.manual_seed(0)
    lin = nn.Linear(300, 200, dtype=np.float64)
    nn.init.zeros_(lin.bias)
    assert np.all(lin.bias.numpy() == 0)
    nn.init.ones_(lin.bias)
    nn.init.constant_(lin.bias, 0.5)
    assert np.all(lin.bias.numpy() == 0.5)
    w = lambda: lin.weight.numpy()  # noqa: E731
    nn.init.normal_(lin.weight, mean=1.0, std=0.02)
    assert abs(w().mean() - 1.0) < 1e-3 and abs(w().std() - 0.02) < 1e-3
    nn.init.xavier_uniform_(lin.weight, gain=2.0)
    bound = 2.0 * math.sqrt(6 / 500)
    assert np.abs(w()).max() <= bound and np.abs(w()).max() > 0.99 * bound
    assert abs(w().std() - bound / math.sqrt(3)) < 0.01 * bound
    nn.init.kaiming_uniform_(lin.weight, a=math.sqrt(5))  # torch's Linear init: fan_in = 300
    bound = math.sqrt(3) * math.sqrt(2 / 6) / math.sqrt(300)
    assert np.abs(w()).max() <= bound and np.abs(w()).max() > 0.99 * bound
    nn.init.kaiming_uniform_(lin.weight, mode="fan_out", nonlinearity="relu")
    bound = math.sqrt(3) * math.sqrt(2) / math.sqrt(200)
    assert np.abs(w()).max() <= bound and np.abs(w()).max() > 0.99 * bound
    nn.init.trunc_normal_(lin.weight, mean=0.1, std=1.0, a=-1.0, b=0.5)
    assert w().min() >= -1.0 and w().max() <= 0.5
    # mean of N(0.1, 1) truncated to [-1, 0.5]: mu + s (phi(al) - phi(be)) / (Phi(be) - Phi(al))
    al, be = -1.1, 0.4
    phi = lambda z: math.exp(-z * z / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    cdf = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))  # noqa: E731
    assert abs(w().mean() - (0.1 + (phi(al) - phi(be)) / (cdf(be) - cdf(al)))) < 0.01
    nn.init.trunc_normal_(lin.weight, mean=0.0, std=1.0, a=3.0, b=3.5)  # inverse-CDF branch
    assert w().min() >= 3.0 and w().max() <= 3.5
    assert nn.init.calculate_gain("tanh") == 5 / 3
    assert nn.init.calculate_gain("leaky_relu", 0.2) == math.sqrt(2 / 1.04)


def test_init_is_seeded_and_recorded_as_write():
    def draw():
        ag.manual_seed(42)
        t = nn.Parameter(ag.zeros(4, 5))
        nn.init.xavier_normal_(t)
        return t

    np.testing.assert_array_equal(draw().numpy(), draw().numpy())
    p = nn.Parameter(ag.tensor(np.ones(3)))
    y = (p * p).sum()
    nn.init.uniform_(p, -1, 1)
    with pytest.raises(RuntimeError, match="nn.init.uniform_"):
        y.backward()
    with pytest.raises(ValueError, match="2 or more dims"):
        nn.init.xavier_uniform_(p)
    with pytest.raises(ValueError, match="mode must be"):
        nn.init.kaiming_normal_(nn.Parameter(ag.zeros(2, 2)), mode="fan")
