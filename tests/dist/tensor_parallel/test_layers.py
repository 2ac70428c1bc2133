"""TP linear layers and mappings against the single-process dense model (float64, 1e-10)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import autograd as ag
import dist
import gpuplan as gp
from autograd import nn
from gpuplan.testing import random

F64 = np.float64
RTOL = 1e-10


def close(actual, expected, rtol=RTOL):
    a = actual.numpy() if isinstance(actual, ag.Tensor) else gp.to_host(actual)
    np.testing.assert_allclose(a, expected, rtol=rtol, atol=rtol)


def leaf(a):
    return ag.tensor(a, requires_grad=True)


def cols(a, cfg):
    """Rank's block of the last axis."""
    w = a.shape[-1] // cfg.size
    return a[..., cfg.rank * w:(cfg.rank + 1) * w]


def rows(a, cfg):
    w = a.shape[0] // cfg.size
    return a[cfg.rank * w:(cfg.rank + 1) * w]


@pytest.mark.parametrize("gather_output", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_column_parallel_matches_dense(tp_config, gather_output, bias):
    cfg, p = tp_config, tp_config.size
    dense = nn.Linear(5, 4 * p, bias=bias, dtype=F64, seed=3)
    col = dist.ColumnParallelLinear(5, 4 * p, bias=bias, gather_output=gather_output,
                                    config=cfg, dtype=F64, seed=3)
    assert (col.rank, col.world_size, col.comm) == (cfg.rank, p, cfg.comm)
    close(col.weight, cols(dense.weight.numpy(), cfg), rtol=0)
    x = random((3, 2, 5), F64, seed=1)
    r = random((3, 2, 4 * p), F64, seed=2)  # loss = sum(Y * r): dY = r
    xd, xt = leaf(x), leaf(x)
    (dense(xd) * ag.tensor(r)).sum().backward()
    y = col(xt)
    if gather_output:
        close(y, dense(ag.tensor(x)).numpy())
        (y * ag.tensor(r)).sum().backward()
    else:
        close(y, cols(dense(ag.tensor(x)).numpy(), cfg))
        (y * ag.tensor(cols(r, cfg))).sum().backward()
    close(xt.grad, xd.grad.numpy())  # all-reduced in backward (copy_to) or local (gather)
    close(col.weight.grad, cols(dense.weight.grad.numpy(), cfg))
    if bias:
        close(col.bias.grad, cols(dense.bias.grad.numpy(), cfg))


@pytest.mark.parametrize("input_is_parallel", [True, False])
def test_row_parallel_matches_dense(tp_config, input_is_parallel):
    cfg, p = tp_config, tp_config.size
    dense = nn.Linear(3 * p, 6, dtype=F64, seed=4)
    row = dist.RowParallelLinear(3 * p, 6, input_is_parallel=input_is_parallel, config=cfg,
                                 dtype=F64, seed=4)
    close(row.weight, rows(dense.weight.numpy(), cfg), rtol=0)
    close(row.bias, dense.bias.numpy(), rtol=0)
    x = random((7, 3 * p), F64, seed=5)
    r = random((7, 6), F64, seed=6)
    xd = leaf(x)
    (dense(xd) * ag.tensor(r)).sum().backward()
    xt = leaf(cols(x, cfg) if input_is_parallel else x)
    y = row(xt)
    close(y, dense(ag.tensor(x)).numpy())
    (y * ag.tensor(r)).sum().backward()
    close(xt.grad, cols(xd.grad.numpy(), cfg) if input_is_parallel else xd.grad.numpy())
    close(row.weight.grad, rows(dense.weight.grad.numpy(), cfg))
    close(row.bias.grad, dense.bias.grad.numpy())


def test_row_parallel_partial_output_sums_to_dense(tp_config, world):
    cfg = dataclasses.replace(tp_config, reduce_output=False)
    p = cfg.size
    dense = nn.Linear(2 * p, 3, dtype=F64, seed=7)
    row = dist.RowParallelLinear(2 * p, 3, config=cfg, dtype=F64, seed=7)
    x = random((4, 2 * p), F64, seed=8)
    partial = row(ag.tensor(cols(x, cfg))).data
    total = partial if cfg.comm is None else cfg.comm.all_reduce(partial)
    close(total, dense(ag.tensor(x)).numpy())


def test_megatron_mlp_and_sequence_parallel_match_dense(tp_config):
    """Column(gelu) -> Row, plain and sequence-parallel (rows sharded in and out)."""
    p = tp_config.size
    d1 = nn.Linear(6, 4 * p, dtype=F64, seed=10)
    d2 = nn.Linear(4 * p, 6, dtype=F64, seed=11)
    x = random((2 * p, 6), F64, seed=12)
    r = random((2 * p, 6), F64, seed=13)
    xd = leaf(x)
    yd = d2(nn.functional.gelu(d1(xd)))
    (yd * ag.tensor(r)).sum().backward()
    for seq in (False, True):
        cfg = dataclasses.replace(tp_config, reduce_scatter_output=seq)
        c1 = dist.ColumnParallelLinear.from_dense(d1, config=cfg)
        c2 = dist.RowParallelLinear.from_dense(d2, config=cfg)
        xt = leaf(rows(x, cfg) if seq else x)
        y = c2(nn.functional.gelu(c1(xt)))
        close(y, rows(yd.numpy(), cfg) if seq else yd.numpy())
        (y * ag.tensor(rows(r, cfg) if seq else r)).sum().backward()
        close(xt.grad, rows(xd.grad.numpy(), cfg) if seq else xd.grad.numpy())
        close(c1.weight.grad, cols(d1.weight.grad.numpy(), cfg))
        close(c1.bias.grad, cols(d1.bias.grad.numpy(), cfg))
        close(c2.weight.grad, rows(d2.weight.grad.numpy(), cfg))
        close(c2.bias.grad, d2.bias.grad.numpy())  # all-reduced when sequence parallel


def test_from_dense_equals_seeded_constructor_and_keeps_dtype(tp_config):
    p = tp_config.size
    dense = nn.Linear(4, 2 * p, dtype=gp.bfloat16, seed=21)
    a = dist.ColumnParallelLinear.from_dense(dense, config=tp_config, gather_output=True)
    b = dist.ColumnParallelLinear(4, 2 * p, gather_output=True, config=tp_config,
                                  dtype=gp.bfloat16, seed=21)
    assert a.weight.dtype == gp.bfloat16 and a.gather_output
    np.testing.assert_array_equal(a.weight.numpy(), b.weight.numpy())
    np.testing.assert_array_equal(a.bias.numpy(), b.bias.numpy())
    x = ag.tensor(random((3, 4), gp.bfloat16, seed=1))
    ref = dense(x).numpy().astype(F64)
    np.testing.assert_allclose(a(x).numpy().astype(F64), ref, rtol=2e-2, atol=2e-2)


def test_unseeded_layers_are_shards_of_one_dense_layer(tp_config):
    p = tp_config.size
    col = dist.ColumnParallelLinear(3, 2 * p, config=tp_config)
    full = col.weight.data if p == 1 else tp_config.comm.all_gather(col.weight.data, axis=1)
    every = [full] if p == 1 else tp_config.comm.all_gather_object(full)
    for other in every:
        np.testing.assert_array_equal(other, full)
    assert not np.array_equal(full, dist.ColumnParallelLinear(3, 2 * p).weight.numpy())


@pytest.mark.mpi
def test_indivisible_features_are_rejected(world):
    cfg = dist.TensorParallelConfig(comm=world)
    with pytest.raises(gp.InvalidProblem, match=r"ColumnParallelLinear: argument "
                                                r"'out_features'.*divisible.*given"):
        dist.ColumnParallelLinear(4, world.size + 1, config=cfg, seed=0)
    with pytest.raises(gp.InvalidProblem, match=r"RowParallelLinear: argument 'in_features'"):
        dist.RowParallelLinear(world.size + 1, 4, config=cfg, seed=0)


@pytest.mark.parametrize("axis", [0, -1])
def test_scatter_gather_mappings_are_conjugate(tp_config, axis):
    p = tp_config.size
    x = random((2 * p, 3 * p), F64, seed=30)
    xt = leaf(x)
    part = dist.scatter_to_tensor_parallel_region(xt, tp_config.comm, axis=axis)
    expected = rows(x, tp_config) if axis == 0 else cols(x, tp_config)
    close(part, expected, rtol=0)
    back = dist.gather_from_tensor_parallel_region(part * 2.0, tp_config.comm, axis=axis)
    close(back, 2 * x, rtol=0)
    back.sum().backward()
    # gather's backward keeps own chunk, scatter's all-gathers: every element gets 2.
    close(xt.grad, np.full_like(x, 2.0), rtol=0)
