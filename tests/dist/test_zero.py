"""dist.ZeroRedundancyOptimizer (ZeRO-1): the parameters and the optimizer state are the same
bits as the replicated optimizer's after several steps (param groups, an lr change, f64, f32
and bf16 with f32 masters), each rank holds 1/dp of the state, and the consolidated state dict
is the replicated one: it resumes with or without ZeRO, at another data-parallel size."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import dist
import gpuplan as gp
from autograd import nn, optim

STEPS = 5


def _params(dtype, device: str = "cpu", seed: int = 0) -> list[nn.Parameter]:
    rng = np.random.default_rng(seed)
    shapes = [(7, 5), (5,), (3, 4, 2), (1,), (11,)]
    return [nn.Parameter(gp.asarray(rng.standard_normal(s).astype(dtype), device=device))
            for s in shapes]


def _groups(params):
    return [{"params": params[:3], "weight_decay": 0.1},
            {"params": params[3:], "weight_decay": 0.0}]


def _grads(params, step: int) -> None:
    """The same (already averaged) gradients on every rank, different per step."""
    rng = np.random.default_rng(100 + step)
    for i, p in enumerate(params):
        if step == 2 and i == 3:
            p.grad = None  # a parameter without a gradient this step
            continue
        g = rng.standard_normal(p.shape).astype(p.dtype)
        p.grad = ag.tensor(gp.asarray(g, device=p.device))


def _run(opt, params, steps: int = STEPS, start: int = 0) -> None:
    for step in range(start, start + steps):
        _grads(params, step)
        if step == 3:
            for group in opt.param_groups:
                group["lr"] *= 0.5  # as a scheduler does
        opt.step()


def _bits(params) -> list[bytes]:
    return [gp.to_host(p.data).tobytes() for p in params]


def _state_bits(sd) -> dict:
    return {(i, k): (np.asarray(v).tobytes() if hasattr(v, "shape") else v)
            for i, s in sd["state"].items() for k, v in s.items()}


@pytest.mark.parametrize("dtype", [np.float64, np.float32, gp.bfloat16])
def test_one_process_equals_the_replicated_optimizer(device, dtype):
    ref, mine = _params(dtype, device), _params(dtype, device)
    plain = optim.AdamW(_groups(ref), lr=1e-2, weight_decay=0.05)
    zero = dist.ZeroRedundancyOptimizer(_groups(mine), optimizer_class=optim.AdamW,
                                        comm=None, lr=1e-2, weight_decay=0.05)
    _run(plain, ref)
    _run(zero, mine)
    assert _bits(mine) == _bits(ref)
    assert _state_bits(zero.consolidated_state_dict()) == _state_bits(plain.state_dict())


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.float64, np.float32, gp.bfloat16])
def test_sharded_state_equals_the_replicated_optimizer(world, dtype):
    ref, mine = _params(dtype), _params(dtype)
    plain = optim.AdamW(_groups(ref), lr=1e-2)
    zero = dist.ZeroRedundancyOptimizer(_groups(mine), optimizer_class=optim.AdamW,
                                        comm=world, lr=1e-2)
    _run(plain, ref)
    _run(zero, mine)
    assert _bits(mine) == _bits(ref)
    # Each rank holds its slice of every group: about 1/dp of the replicated state.
    replicated = sum(v.nbytes for s in plain.state.values() for v in s.values()
                     if hasattr(v, "nbytes"))
    if dtype != gp.bfloat16:  # the replicated f32/f64 optimizer keeps no weights of its own
        replicated += sum(p.data.nbytes for p in ref)
    numel = sum(p.data.size for p in ref)
    pad = 2 * world.size * np.dtype(zero._layouts[0].work).itemsize * 3  # slices round up
    assert zero.state_bytes() <= replicated / world.size + pad, (zero.state_bytes(),
                                                                 replicated, numel)
    assert _state_bits(zero.consolidated_state_dict()) == _state_bits(plain.state_dict())


@pytest.mark.mpi
def test_a_consolidated_checkpoint_resumes_with_and_without_zero(world):
    """Save after 3 steps with ZeRO; resume in a replicated optimizer, in ZeRO over the whole
    world and in ZeRO over one process: all equal the uninterrupted replicated run."""
    dtype = gp.bfloat16
    ref = _params(dtype)
    plain = optim.AdamW(_groups(ref), lr=1e-2)
    _run(plain, ref, steps=6)

    first = _params(dtype)
    zero = dist.ZeroRedundancyOptimizer(_groups(first), comm=world, lr=1e-2)
    _run(zero, first, steps=3)
    saved = zero.consolidated_state_dict()
    weights = [gp.to_host(p.data).copy() for p in first]

    for make in (lambda g: optim.AdamW(g, lr=1e-2),
                 lambda g: dist.ZeroRedundancyOptimizer(g, comm=world, lr=1e-2),
                 lambda g: dist.ZeroRedundancyOptimizer(g, comm=None, lr=1e-2)):
        params = _params(dtype, seed=7)  # other weights: the load must replace them
        for p, w in zip(params, weights, strict=True):
            p.data[...] = w
        opt = make(_groups(params))
        opt.load_state_dict(saved)
        _run(opt, params, steps=3, start=3)
        assert _bits(params) == _bits(ref), type(opt).__name__


@pytest.mark.mpi
def test_a_sharded_state_dict_loads_only_into_its_own_rank(world):
    """A rank's own shard resumes exactly (the model's weights come from its checkpoint);
    another size refuses it with one line."""
    params = _params(gp.bfloat16)
    zero = dist.ZeroRedundancyOptimizer(_groups(params), comm=world, lr=1e-2)
    _run(zero, params, steps=2)
    sd = zero.state_dict()
    resumed = _params(gp.bfloat16, seed=3)
    for p, q in zip(resumed, params, strict=True):
        p.data[...] = q.data
    again = dist.ZeroRedundancyOptimizer(_groups(resumed), comm=world, lr=1e-2)
    again.load_state_dict(sd)
    _run(zero, params, steps=2, start=2)
    _run(again, resumed, steps=2, start=2)
    assert _bits(resumed) == _bits(params)
    one = dist.ZeroRedundancyOptimizer(_groups(_params(gp.bfloat16)), comm=None, lr=1e-2)
    with pytest.raises(ValueError, match=f"a shard of rank {world.rank} of {world.size}, "
                                         f"expected rank 0 of 1"):
        one.load_state_dict(sd)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="empty parameter list"):
        dist.ZeroRedundancyOptimizer([], comm=None)
    with pytest.raises(TypeError, match="argument 'optimizer_class': expected an optimizer "
                                        "class such as optim.AdamW, given AdamW"):
        dist.ZeroRedundancyOptimizer(_params(np.float32), optimizer_class=optim.AdamW(
            _params(np.float32)), comm=None)
    mixed = [nn.Parameter(np.zeros(3, np.float32)), nn.Parameter(np.zeros(3))]
    with pytest.raises(ValueError, match="several dtypes .*float32, float64.*one dtype per "
                                         "group"):
        dist.ZeroRedundancyOptimizer(mixed, comm=None)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        dist.ZeroRedundancyOptimizer(_params(np.float32), comm=None, lr=-1.0)


def test_parameters_whose_arrays_are_replaced_are_followed():
    """f32 pieces are views of the parameters (no copy of the weights); a parameter given a
    new array (Module.to, a user's assignment) is followed at the next step."""
    ref, mine = _params(np.float32), _params(np.float32)
    plain = optim.AdamW(_groups(ref), lr=1e-2)
    zero = dist.ZeroRedundancyOptimizer(_groups(mine), comm=None, lr=1e-2)
    _run(plain, ref, steps=2)
    _run(zero, mine, steps=2)
    for p in ref + mine:
        p.data = p.data.copy()
    _run(plain, ref, steps=2, start=2)
    _run(zero, mine, steps=2, start=2)
    assert _bits(mine) == _bits(ref)
    assert zero.state_bytes() == sum(2 * p.data.nbytes for p in mine)  # moments only
