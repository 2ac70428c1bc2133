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


# -- gradients reduce-scattered into the slices ----------------------------------------------

MAX_NORM = 1.0


def _local_grads(params, step: int, rank: int) -> None:
    """Each rank's own gradients, before any average: different per rank and step; at step 2
    the fourth parameter has one on rank 0 only, at step 1 the last has none anywhere."""
    rng = np.random.default_rng([200 + step, rank])
    for i, p in enumerate(params):
        g = rng.standard_normal(p.shape).astype(p.dtype)
        if (step == 2 and i == 3 and rank != 0) or (step == 1 and i == 4):
            p.grad = None
        else:
            p.grad = ag.tensor(gp.asarray(g, device=p.device))


def _replicated_and_zero(comm, dtype, rank: int, steps: int = STEPS, device: str = "cpu"):
    """(replicated weights, ZeRO weights, replicated norms, ZeRO norms, the two
    optimizers): all-reduce + clip + AdamW against reduce-scatter + clip + ZeRO's step."""
    ref, mine = _params(dtype, device), _params(dtype, device)
    plain = optim.AdamW(_groups(ref), lr=1e-2)
    zero = dist.ZeroRedundancyOptimizer(_groups(mine), comm=comm, lr=1e-2)
    want, got = [], []
    for step in range(steps):
        _local_grads(ref, step, rank)
        _local_grads(mine, step, rank)
        dist.allreduce_gradients(ref, comm)
        want.append(optim.clip_grad_norm_(ref, MAX_NORM))
        # a few elements per round on even steps: the reduce-scatter goes in many rounds
        zero.reduce_gradients(**({"bucket_bytes": 64} if step % 2 == 0 else {}))
        got.append(zero.clip_grad_norm_(MAX_NORM))
        plain.step()
        zero.step()
        plain.zero_grad()
        zero.zero_grad()
    return ref, mine, want, got, plain, zero


def test_one_process_reduce_and_clip_equal_the_replicated_optimizer(device):
    ref, mine, want, got, plain, zero = _replicated_and_zero(None, np.float32, 0,
                                                             device=device)
    assert got == want and min(want) > MAX_NORM  # the clipping acted at every step
    assert _bits(mine) == _bits(ref)
    assert _state_bits(zero.consolidated_state_dict()) == _state_bits(plain.state_dict())


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.float64, np.float32, gp.bfloat16])
def test_reduce_scattered_gradients_step_as_the_all_reduced_ones(world, dtype):
    """At dp=2 the reduce-scatter sums the same two values as the all-reduce, and the norm
    from the slices is the replicated one: weights, norms and state the same bits. At dp=4
    the collectives may sum in another order: equal to rounding."""
    ref, mine, want, got, plain, zero = _replicated_and_zero(world, dtype, world.rank)
    assert min(want) > MAX_NORM  # the clipping acted at every step
    if world.size == 2:
        assert got == want
        assert _bits(mine) == _bits(ref)
        assert _state_bits(zero.consolidated_state_dict()) == _state_bits(plain.state_dict())
        return
    rtol = {np.float64: 1e-12, np.float32: 1e-5}.get(dtype, 2e-2)
    np.testing.assert_allclose(got, want, rtol=rtol)
    for p, q in zip(mine, ref, strict=True):
        np.testing.assert_allclose(gp.to_host(p.data).astype(np.float64),
                                   gp.to_host(q.data).astype(np.float64), rtol=rtol,
                                   atol=rtol)


@pytest.mark.mpi
@pytest.mark.parametrize("other", ["tp", "pp"])
def test_a_parallel_model_reduce_scattered_and_clipped_equals_the_replicated_run(world, other):
    """dist.ParallelGPT at dp=2 (and at 4 ranks dp=2 x tp=2 with sequence parallelism, whose
    norm weights' gradients are summed over tp before the dp reduction, or dp=2 x pp=2, whose
    tied embedding copies are summed over the two end stages first): with
    reduce_data_parallel off, reduce_gradients + clip_grad_norm_(max, model) + ZeRO's step give
    the norms and weights of train_step + dist.clip_grad_norm_ + AdamW, bit for bit."""
    from dist.models import ParallelGPT

    if world.size not in (2, 4) or (world.size == 2 and other == "pp"):
        pytest.skip("needs 2 or 4 ranks (dp=2 x pp=2: 4)")
    cfg = nn.GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8, seed=3,
                       dtype=np.float64)
    split = {other: world.size // 2}
    mesh = dist.ProcessMesh(dp=2, pp=split.get("pp", 1), tp=split.get("tp", 1), world=world)
    runs = []
    for use_zero in (False, True):
        model = ParallelGPT(cfg, mesh, sequence_parallel=mesh.tp.size > 1,
                            num_micro_batches=2)
        groups = [{"params": [p for p in model.parameters() if p.ndim >= 2],
                   "weight_decay": 0.1},
                  {"params": [p for p in model.parameters() if p.ndim < 2],
                   "weight_decay": 0.0}]
        if use_zero:
            model.reduce_data_parallel = False
            opt = dist.ZeroRedundancyOptimizer(groups, comm=mesh.dp, lr=1e-2)
        else:
            opt = optim.AdamW(groups, lr=1e-2)
        norms = []
        for step in range(3):
            idx = np.random.default_rng([5, step]).integers(0, cfg.vocab_size, (8, 9))
            rows = slice(4 * mesh.dp_rank, 4 * mesh.dp_rank + 4)
            model.train_step(idx[rows, :-1], idx[rows, 1:])
            if use_zero:
                opt.reduce_gradients()
                norms.append(opt.clip_grad_norm_(0.1, model))
            else:
                norms.append(dist.clip_grad_norm_(model, 0.1))
            opt.step()
            opt.zero_grad()
        runs.append((norms, _bits(model.parameters())))
    assert min(runs[0][0]) > 0.1  # clipped at every step
    assert runs[1] == runs[0]


@pytest.mark.mpi
def test_optimizer_state_bytes_per_rank_are_a_dp_th(world):
    """The bytes of optimizer state a rank holds (moments, f32 masters of bf16 weights): at
    most 0.55x the replicated optimizer's at dp=2, 0.3x at dp=4 (an exact count)."""
    bound = {2: 0.55, 4: 0.3}.get(world.size)
    if bound is None:
        pytest.skip("needs 2 or 4 ranks")
    for dtype in (np.float32, gp.bfloat16):
        ref, mine = _params(dtype), _params(dtype)
        plain = optim.AdamW(_groups(ref), lr=1e-2)
        zero = dist.ZeroRedundancyOptimizer(_groups(mine), comm=world, lr=1e-2)
        _run(plain, ref, steps=1)
        _run(zero, mine, steps=1)
        replicated = sum(v.nbytes for s in plain.state.values() for v in s.values()
                         if hasattr(v, "nbytes"))
        most = world.all_reduce(np.array([zero.state_bytes()]), "max")[0]
        assert most <= bound * replicated, (dtype, most, replicated)


def test_the_reduced_slices_are_needed_and_bucket_bytes_checked():
    zero = dist.ZeroRedundancyOptimizer(_params(np.float32), comm=None, lr=1e-2)
    with pytest.raises(RuntimeError, match=r"ZeroRedundancyOptimizer.grad_norm: expected the "
                                           r"gradients reduced into the slices first"):
        zero.grad_norm()
    with pytest.raises(ValueError, match="reduce_gradients: argument 'bucket_bytes': "
                                         "expected an int >= 1, given 0"):
        zero.reduce_gradients(bucket_bytes=0)
    _grads(zero.param_groups[0]["params"], 0)
    zero.reduce_gradients()
    zero.zero_grad()  # drops the slices too
    with pytest.raises(RuntimeError, match="clip_grads_with_norm_: expected"):
        zero.clip_grads_with_norm_(1.0, 2.0)


@pytest.mark.mpi
def test_device_slices_reduce_and_clip_to_rounding(world, device):
    """On a device (CuPy, or the emulated device through the host-staged path) the norm is
    the slices' (not summed per parameter as on the host): equal to rounding."""
    ref, mine, want, got, _, _ = _replicated_and_zero(world, np.float32, world.rank,
                                                      steps=3, device=device)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for p, q in zip(mine, ref, strict=True):
        np.testing.assert_allclose(gp.to_host(p.data), gp.to_host(q.data), rtol=1e-5,
                                   atol=1e-6)
