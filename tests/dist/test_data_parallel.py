"""Data parallelism: bucketed gradient averaging, and DP x PP against one process."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import dist
import gpuplan as gp
from autograd import nn
from dist.data_parallel import _buckets
from gpuplan.testing import random

F64 = np.float64


def mlp(seed: int, dtype=F64) -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8, dtype=dtype, seed=seed), nn.GELU(),
                         nn.Linear(8, 3, dtype=dtype, seed=seed + 1))


def batch(n: int = 8):
    return random((n, 6), F64, seed=5), np.random.default_rng(6).integers(0, 3, n)


def full_batch_grads():
    model = mlp(1)
    x, t = batch()
    nn.functional.cross_entropy(model(ag.tensor(x)), t).backward()
    return [p.grad.numpy() for p in model.parameters()]


def test_buckets_group_by_dtype_and_size():
    params = [nn.Parameter(np.zeros(n, d)) for n, d in
              [(4, F64), (4, F64), (10, F64), (2, np.float32), (2, np.float32), (1, F64)]]
    sizes = [[p.data.size for p in b] for b in _buckets(params, bucket_bytes=64)]
    assert sizes == [[4, 4], [10], [2, 2], [1]]


def test_single_process_is_a_no_op():
    model = mlp(1)
    x, t = batch()
    nn.functional.cross_entropy(model(ag.tensor(x)), t).backward()
    before = [p.grad.numpy().copy() for p in model.parameters()]
    dp = dist.DataParallel(model, comm=None)
    dp.allreduce_gradients()
    for p, g in zip(model.parameters(), before, strict=True):
        np.testing.assert_array_equal(p.grad.numpy(), g)


@pytest.mark.mpi
@pytest.mark.parametrize("bucket_bytes", [1, 200, 1 << 20])
def test_averaged_gradients_equal_full_batch(world, bucket_bytes):
    if 8 % world.size:
        pytest.skip("batch of 8 must split evenly")
    model = mlp(1) if world.rank == 0 else mlp(99)  # broadcast must make replicas equal
    dp = dist.DataParallel(model, comm=world, bucket_bytes=bucket_bytes)
    x, t = batch()
    n = 8 // world.size
    mine = slice(world.rank * n, (world.rank + 1) * n)
    nn.functional.cross_entropy(dp(ag.tensor(x[mine])), t[mine]).backward()
    dp.allreduce_gradients()
    for p, g in zip(model.parameters(), full_batch_grads(), strict=True):
        np.testing.assert_allclose(p.grad.numpy(), g, rtol=1e-10, atol=1e-13)


@pytest.mark.mpi
def test_missing_grads_and_half_precision(world):
    a = nn.Parameter(np.full(3, world.rank + 1.0, np.float32).astype(gp.bfloat16))
    b = nn.Parameter(np.zeros(2))
    c = nn.Parameter(np.zeros(2))
    a.grad = ag.tensor(np.full(3, world.rank + 1.0).astype(gp.bfloat16))
    if world.rank == 0:
        b.grad = ag.tensor(np.full(2, 4.0))
    dist.allreduce_gradients([a, b, c], world)
    mean = (world.size + 1) / 2
    np.testing.assert_allclose(a.grad.numpy().astype(F64), mean, rtol=1e-2)
    assert a.grad.dtype == gp.bfloat16
    np.testing.assert_allclose(b.grad.numpy(), 4.0 / world.size)  # zero elsewhere
    assert c.grad is None  # no rank had one
    dist.allreduce_gradients([b], world, average=False)
    np.testing.assert_allclose(b.grad.numpy(), 4.0)


@pytest.mark.mpi
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_data_parallel_pipeline_on_a_2x2_mesh(world, schedule):
    if world.size != 4:
        pytest.skip("needs 4 ranks (dp=2 x pp=2)")
    mesh = dist.ProcessMesh(dp=2, pp=2, tp=1, world=world)
    widths = [6, 8, 3]

    def stage(s):
        st = dist.PipelineStage(s).add_layer(nn.Linear(widths[s], widths[s + 1], dtype=F64,
                                                       seed=1 + s))
        return st.add_layer(nn.GELU()) if s == 0 else st

    pipe = dist.PipelineParallel([lambda s=s: stage(s) for s in range(2)],
                                 num_micro_batches=2, schedule=schedule, comm=mesh.pp)
    x, t = batch()
    half = slice(4 * mesh.dp_rank, 4 * mesh.dp_rank + 4)
    loss = pipe.train_step(x[half], t[half], nn.functional.cross_entropy)
    dist.allreduce_gradients(pipe.parameters(), mesh.dp)
    global_loss = mesh.dp.all_reduce(np.array([loss]), "mean")[0]
    ref = mlp(1)
    ref_loss = nn.functional.cross_entropy(ref(ag.tensor(x)), t)
    ref_loss.backward()
    np.testing.assert_allclose(global_loss, ref_loss.item(), rtol=1e-10)
    ref_stage = ref[0] if mesh.pp_rank == 0 else ref[2]
    for p, q in zip(pipe.stage(mesh.pp_rank).parameters(), ref_stage.parameters(), strict=True):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-10, atol=1e-13)


@pytest.mark.mpi
def test_broadcast_of_a_saved_parameter_fails_backward_on_every_rank(world):
    """The broadcast overwrites parameters in place: a backward through an op that saved
    one before it must raise like any in-place write (it computed with other weights),
    on every rank alike, not return a gradient of the replaced weights."""
    model = mlp(1) if world.rank == 0 else mlp(99)
    x, t = batch()
    loss = nn.functional.cross_entropy(model(ag.tensor(x)), t)  # saves the weights
    dist.DataParallel(model, comm=world)
    with pytest.raises(RuntimeError, match="dist.broadcast_parameters"):
        loss.backward()
    # After the broadcast, a fresh forward/backward is fine.
    nn.functional.cross_entropy(model(ag.tensor(x)), t).backward()


@pytest.mark.mpi
def test_allreduce_of_a_saved_gradient_fails_backward(world):
    """Gradients are averaged in place: an op that saved a .grad array before the
    all-reduce cannot be differentiated afterwards."""
    w = nn.Parameter(np.full(3, 1.0))
    w.grad = ag.tensor(np.full(3, world.rank + 1.0))
    h = ag.tensor(np.full(3, 2.0), requires_grad=True)
    y = (w.grad * h).sum()  # saves w.grad's array for h's gradient
    dist.allreduce_gradients([w], world)
    np.testing.assert_allclose(w.grad.numpy(), (world.size + 1) / 2)
    with pytest.raises(RuntimeError, match="dist.allreduce_gradients"):
        y.backward()
