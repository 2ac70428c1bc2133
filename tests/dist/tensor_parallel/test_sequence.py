"""Sequence-shard layers (dist.tensor_parallel.sequence) against the whole tensor's ops: each
rank's chunk, computed alone, is that rank's slice of the one-process result."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd import nn
from autograd.nn import functional as F
from dist.tensor_parallel.sequence import (
    SequenceParallelDropout,
    SequenceShardEmbedding,
    sequence_chunk,
)
from gpuplan.errors import InvalidProblem


class _Group:
    """Only .size and .rank: the sequence-shard layers never communicate."""

    def __init__(self, size: int, rank: int) -> None:
        self.size, self.rank = size, rank


@pytest.mark.parametrize("shape", [(2, 8, 5), (3, 4, 6)])  # 5: chunks off Philox's 4-groups
@pytest.mark.parametrize("size", [2, 4])
def test_dropout_of_a_chunk_is_the_slice_of_the_whole_mask(shape, size):
    x = np.random.default_rng(0).normal(size=shape)
    dy = np.random.default_rng(1).normal(size=shape)
    ag.random.manual_seed(3)
    whole = ag.tensor(x, requires_grad=True)
    y = F.dropout(whole, 0.4)
    (y * ag.tensor(dy)).sum().backward()
    after = ag.random.default_generator.get_state()
    n = shape[1] // size
    for rank in range(size):
        ag.random.manual_seed(3)
        part = ag.tensor(x[:, rank * n:(rank + 1) * n], requires_grad=True)
        got = SequenceParallelDropout(0.4, _Group(size, rank))(part)
        (got * ag.tensor(dy[:, rank * n:(rank + 1) * n])).sum().backward()
        np.testing.assert_array_equal(got.numpy(), y.numpy()[:, rank * n:(rank + 1) * n])
        np.testing.assert_array_equal(part.grad.numpy(),
                                      whole.grad.numpy()[:, rank * n:(rank + 1) * n])
        assert ag.random.default_generator.get_state() == after  # drew the whole count
    assert 0 < np.count_nonzero(y.numpy() == 0) < y.numel()  # dropout acted


def test_dropout_is_the_identity_in_eval_and_rejects_bad_p():
    layer = SequenceParallelDropout(0.5, _Group(2, 1)).eval()
    x = ag.tensor(np.ones((1, 2, 3)))
    assert layer(x) is x
    with pytest.raises(ValueError, match="SequenceParallelDropout: p"):
        SequenceParallelDropout(1.0, None)


def test_embedding_looks_up_the_chunk_and_its_gradients_sum_to_the_whole():
    dense = nn.Embedding(8, 3, dtype=np.float64, seed=0)
    ids = np.arange(8)
    dense(ids).sum().backward()
    total = np.zeros_like(dense.weight.grad.numpy())
    for rank in range(2):
        weight = nn.Parameter(dense.weight.numpy().copy())
        layer = SequenceShardEmbedding(weight, _Group(2, rank))
        out = layer(ids)
        np.testing.assert_array_equal(out.numpy(), dense.weight.numpy()[4 * rank:4 * rank + 4])
        out.sum().backward()
        total += weight.grad.numpy()
    np.testing.assert_array_equal(total, dense.weight.grad.numpy())


def test_a_length_the_group_does_not_divide_is_refused():
    with pytest.raises(InvalidProblem, match=r"op.*idx.*divisible by the tensor-parallel size 4"
                                             r".*7"):
        sequence_chunk(7, _Group(4, 0), "op", "idx")
    assert sequence_chunk(8, _Group(4, 3), "op") == (6, 8)
    with pytest.raises(InvalidProblem, match="SequenceShardEmbedding.*ids"):
        SequenceShardEmbedding(nn.Parameter(np.zeros((8, 2))), _Group(2, 0))(np.arange(5))


@pytest.mark.mpi
@pytest.mark.parametrize("gelu", [False, True])
def test_column_parallel_linear_keeps_only_its_input_shard(world, gelu):
    """Sequence parallel: the layer's tape node keeps this rank's [B, T/p, C] shard, never
    the gathered [B, T, C] input (backward gathers it again), and its gradients are the
    dense layer's (the rest of the check is the models' equivalence tests)."""
    import dist

    cfg = dist.TensorParallelConfig(comm=world, reduce_scatter_output=True, sequence_axis=1)
    dense = nn.Linear(6, 4 * world.size, dtype=np.float64, seed=2)
    layer = dist.ColumnParallelLinear.from_dense(dense, config=cfg)
    x = np.random.default_rng(0).normal(size=(2, 2 * world.size, 6))
    n = x.shape[1] // world.size
    part = ag.tensor(x[:, world.rank * n:(world.rank + 1) * n], requires_grad=True)
    with ag.Tape() as tape:
        y = layer.forward_gelu(part) if gelu else layer(part)
        (node,) = [nd for nd in tape.nodes if nd.ctx.saved]
        shapes = [tuple(a.shape) for a in node.ctx.saved if a is not None]
        assert any(a is part.data for a in node.ctx.saved)
        assert (2, x.shape[1], 6) not in shapes
        total = y.sum()
    tape.backward(total)
    whole = ag.tensor(x, requires_grad=True)
    out = F.gelu(dense(whole)) if gelu else dense(whole)
    cols = slice(world.rank * 4, (world.rank + 1) * 4)
    out.sum().backward()  # every rank's columns: dX_t sums them (the reduce-scatter)
    np.testing.assert_allclose(part.grad.numpy(),
                               whole.grad.numpy()[:, world.rank * n:(world.rank + 1) * n],
                               rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(layer.weight.grad.numpy(), dense.weight.grad.numpy()[:, cols],
                               rtol=1e-12, atol=1e-14)
