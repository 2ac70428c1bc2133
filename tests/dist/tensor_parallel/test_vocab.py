"""VocabParallelEmbedding and vocab_parallel_cross_entropy against dense single-process runs."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import dist
import gpuplan as gp
from autograd import nn
from dist.tensor_parallel import vocab_range
from gpuplan.testing import random

F64 = np.float64


def close(actual, expected, rtol=1e-10):
    a = actual.numpy() if isinstance(actual, ag.Tensor) else gp.to_host(actual)
    np.testing.assert_allclose(a, expected, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("vocab,size", [(10, 1), (10, 4), (7, 2), (3, 4), (9, 3)])
def test_vocab_range_is_a_balanced_partition(vocab, size):
    blocks = [vocab_range(vocab, r, size) for r in range(size)]
    assert blocks[0][0] == 0 and blocks[-1][1] == vocab
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:], strict=False))
    widths = [b - a for a, b in blocks]
    assert max(widths) - min(widths) <= 1 and widths == sorted(widths, reverse=True)


@pytest.mark.parametrize("vocab", [11, 8])
@pytest.mark.parametrize("padding_idx", [None, 5, -1])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_embedding_matches_dense(tp_config, vocab, padding_idx, index_dtype):
    dense = nn.Embedding(vocab, 3, padding_idx=padding_idx, dtype=F64, seed=2)
    emb = dist.VocabParallelEmbedding(vocab, 3, padding_idx=padding_idx, config=tp_config,
                                      dtype=F64, seed=2)
    start, end = vocab_range(vocab, tp_config.rank, tp_config.size)
    assert (emb.vocab_start, emb.vocab_end) == (start, end)
    close(emb.weight, dense.weight.numpy()[start:end], rtol=0)
    # Indices outside [0, vocab) give zero rows and no gradient, as in the dense layer.
    idx = np.array([[0, 5, vocab - 1, 3, -1], [5, 2, 2, vocab - 1, vocab]], index_dtype)
    r = random((2, 5, 3), F64, seed=3)
    y = emb(idx)
    close(y, dense(idx).numpy())
    (y * ag.tensor(r)).sum().backward()
    (dense(idx) * ag.tensor(r)).sum().backward()
    close(emb.weight.grad, dense.weight.grad.numpy()[start:end])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("vocab", [12, 7])
@pytest.mark.parametrize("ignore_index", [-100, -1, 2])  # 2: a real class, ignored
def test_cross_entropy_matches_dense(tp_config, reduction, vocab, ignore_index):
    start, end = vocab_range(vocab, tp_config.rank, tp_config.size)
    logits = random((6, vocab), F64, seed=4, low=-3, high=3)
    target = np.array([0, vocab - 1, 3, ignore_index, 6, 2], np.int64)
    full, part = ag.tensor(logits, requires_grad=True), ag.tensor(
        logits[:, start:end], requires_grad=True)
    ref = nn.functional.cross_entropy(full, target, ignore_index=ignore_index,
                                      reduction=reduction)
    got = dist.vocab_parallel_cross_entropy(part, target, tp_config, ignore_index=ignore_index,
                                            reduction=reduction)
    close(got, ref.numpy())
    g = random(ref.shape, F64, seed=5) if reduction == "none" else None
    ref.backward(g)
    got.backward(g)
    close(part.grad, full.grad.numpy()[:, start:end])


def test_cross_entropy_half_logits_accumulate_in_f32(tp_config):
    vocab = 4 * tp_config.size
    start, end = vocab_range(vocab, tp_config.rank, tp_config.size)
    logits = random((5, vocab), gp.bfloat16, seed=6, low=-4, high=4)
    target = np.arange(5) % vocab
    part = ag.tensor(logits[:, start:end], requires_grad=True)
    loss = dist.vocab_parallel_cross_entropy(part, target, tp_config)
    assert loss.dtype == np.float32
    x = logits.astype(F64)
    lse = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)
    np.testing.assert_allclose(loss.item(), np.mean(lse - x[np.arange(5), target]), rtol=1e-5)
    loss.backward()
    assert part.grad.dtype == gp.bfloat16


def test_cross_entropy_rejects_bad_inputs(tp_config):
    part = ag.tensor(np.zeros((3, 2)), requires_grad=True)
    with pytest.raises(gp.InvalidProblem, match="argument 'reduction'.*'avg'"):
        dist.vocab_parallel_cross_entropy(part, np.zeros(3, np.int64), tp_config, reduction="avg")
    with pytest.raises(gp.InvalidProblem, match=r"argument 'target'.*integer \[3\]"):
        dist.vocab_parallel_cross_entropy(part, np.zeros(4, np.int64), tp_config)
    with pytest.raises(gp.InvalidProblem, match=r"argument 'logits'.*\[N, V_t\]"):
        dist.vocab_parallel_cross_entropy(ag.tensor(np.zeros(3)), np.zeros(3, np.int64),
                                          tp_config)


@pytest.mark.mpi
def test_cross_entropy_rejects_blocks_that_are_not_vocab_ranges(world):
    width = 3 if world.rank == 0 else 1  # rank 0 too wide for any balanced split
    part = ag.tensor(np.zeros((2, width)))
    with pytest.raises(gp.InvalidProblem, match="vocab blocks"):
        dist.vocab_parallel_cross_entropy(part, np.zeros(2, np.int64), world)
