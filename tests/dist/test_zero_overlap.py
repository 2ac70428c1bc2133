"""ZeRO-1's gradient reduce-scatter overlapped with backward (dist.zero_overlap): the same
norms and weights as the blocking reduce_gradients, bit for bit, at dp=2, dp=2 x tp=2 and
dp=2 x pp=2 (f64 and bf16), and the first reduce-scatter starts inside the last backward."""

from __future__ import annotations

import numpy as np
import pytest

import dist
import gpuplan as gp
from autograd import nn
from dist import trace


def _bits(params) -> list[bytes]:
    return [gp.to_host(p.data).tobytes() for p in params]


def _mesh(world, other: str):
    split = {other: world.size // 2} if other else {}
    return dist.ProcessMesh(dp=2, pp=split.get("pp", 1), tp=split.get("tp", 1), world=world)


def _train(world, other: str, dtype, overlap: bool, steps: int = 3):
    from dist.models import ParallelGPT

    cfg = nn.GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8, seed=3,
                       dtype=dtype)
    mesh = _mesh(world, other)
    model = ParallelGPT(cfg, mesh, sequence_parallel=mesh.tp.size > 1, num_micro_batches=2)
    model.reduce_data_parallel = False
    groups = [{"params": [p for p in model.parameters() if p.ndim >= 2], "weight_decay": 0.1},
              {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0}]
    opt = dist.ZeroRedundancyOptimizer(groups, comm=mesh.dp, lr=1e-2)
    if overlap:
        # Small rounds: several per group, some started by the backward, some by
        # reduce_gradients (those holding the replicated copies).
        opt.overlap_with(model, bucket_bytes=256)
    norms, started = [], []
    for step in range(steps):
        idx = np.random.default_rng([5, step]).integers(0, cfg.vocab_size, (8, 9))
        rows = slice(4 * mesh.dp_rank, 4 * mesh.dp_rank + 4)
        model.train_step(idx[rows, :-1], idx[rows, 1:])
        if overlap:
            started.append(opt._overlap.started_rounds())
        opt.reduce_gradients(bucket_bytes=256)
        norms.append(opt.clip_grad_norm_(0.1, model))
        opt.step()
        opt.zero_grad()
    return norms, _bits(model.parameters()), started


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.float64, gp.bfloat16])
@pytest.mark.parametrize("other", ["", "tp", "pp"])
def test_overlapped_reduce_scatter_equals_the_blocking_one(world, other, dtype):
    if world.size not in (2, 4) or (world.size == 2 and other) or (world.size == 4
                                                                   and not other):
        pytest.skip("dp=2 at 2 ranks; dp=2 x tp=2 or dp=2 x pp=2 at 4")
    norms, bits, _ = _train(world, other, dtype, overlap=False)
    norms_o, bits_o, started = _train(world, other, dtype, overlap=True)
    assert min(norms) > 0.1  # clipped: the norm reads the slices
    assert norms_o == norms
    assert bits_o == bits
    assert min(started) >= 1  # the backward started rounds itself


@pytest.mark.mpi
def test_first_reduce_scatter_starts_inside_the_last_backward(world):
    if world.size != 2:
        pytest.skip("dp=2 at 2 ranks")
    trace.start(world)
    try:
        _train(world, "", np.float64, overlap=True, steps=1)
    finally:
        events = trace.stop()
    last = max((e for e in events if e["name"] == "backward"),
               key=lambda e: e["args"]["micro_batch"])
    assert last["args"]["micro_batch"] == 1
    scatters = sorted((e for e in events if e["name"] == "reduce_scatter"),
                      key=lambda e: e["ts"])
    assert scatters and scatters[0]["args"].get("nonblocking")
    assert last["ts"] < scatters[0]["ts"] < last["ts"] + last["dur"]


def test_one_rank_has_nothing_to_overlap_and_bucket_bytes_is_checked():
    p = nn.Parameter(gp.asarray(np.ones(4)))
    opt = dist.ZeroRedundancyOptimizer([p], comm=None, lr=1e-2)
    assert opt.overlap_gradients() is None
    with pytest.raises(ValueError, match="overlap_gradients: argument 'bucket_bytes'"):
        opt.overlap_gradients(bucket_bytes=0)


@pytest.mark.mpi
def test_reduce_gradients_refuses_other_rounds_than_the_started_ones(world):
    """While rounds started in backward are pending, reduce_gradients with another
    bucket_bytes is a one-line error; with the overlap's own it finishes them."""
    if world.size != 2:
        pytest.skip("dp=2 at 2 ranks")
    params = [nn.Parameter(gp.asarray(np.arange(6.0) + i)) for i in range(3)]
    opt = dist.ZeroRedundancyOptimizer(params, comm=world, lr=1e-2)
    overlap = opt.overlap_gradients(bucket_bytes=32)
    overlap.arm()
    (sum((q * float(world.rank + 1)).sum() for q in params)).backward()
    assert overlap.started_rounds() == len(overlap.rounds)  # no late parameter
    with pytest.raises(ValueError, match="reduce_gradients: argument 'bucket_bytes'"):
        opt.reduce_gradients(bucket_bytes=64)
    opt.reduce_gradients(bucket_bytes=32)
    assert not overlap.pending
    [grads] = opt._grads  # one group: the mean of 1 and 2 on every element
    np.testing.assert_array_equal(gp.to_host(grads), np.full(9, 1.5))
