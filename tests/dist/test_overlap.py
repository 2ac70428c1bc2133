"""Gradient reduction overlapped with backward (OverlappedGradReducer, ParallelGPT's default):
losses and weights after a few AdamW steps equal, bit for bit, those of the blocking
reduction, and the single-process model's to float64 rounding; in a trace the first bucket's
all-reduce starts inside the last backward."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import dist
import gpuplan as gp
from autograd import nn, optim
from dist import trace
from dist.data_parallel import OverlappedGradReducer
from dist.models import ParallelGPT, ParallelLlama
from tests.dist.models.helpers import LAYOUTS, check_against_dense, rows_of

F64 = np.float64
CFG = dict(vocab_size=37, block_size=8, n_layer=4, n_head=4, n_embd=16, dtype=F64, seed=5)
LLAMA = dict(CFG, ffn_hidden=24, n_kv_head=2)
BATCH, STEPS, BUCKET = 8, 3, 2048  # small buckets: several per stage


def batches():
    rng = np.random.default_rng(11)
    return [(rng.integers(0, 37, (BATCH, 8)), rng.integers(0, 37, (BATCH, 8)))
            for _ in range(STEPS)]


def train(model, mesh, dp, overlap: bool, steps: int = STEPS):
    """`steps` AdamW steps on `batches`; (losses, {name: weights}, buckets started in the
    last step's backward)."""
    model.overlap_grad_reduce = overlap
    model.grad_bucket_bytes = BUCKET
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    losses, started = [], 0
    for x, y in batches()[:steps]:
        if mesh is not None:
            x, y = rows_of(x, mesh.dp_rank, dp), rows_of(y, mesh.dp_rank, dp)
        reducer = model.grad_reducer()
        if reducer is not None:
            # Count the buckets the backward started (finish starts the others).
            real_finish = reducer.finish

            def finish(reducer=reducer, real_finish=real_finish):
                nonlocal started
                started = reducer.started_buckets()
                real_finish()
            reducer.finish = finish
        losses.append(model.train_step(x, y))
        if reducer is not None:
            del reducer.finish
        dist.clip_grad_norm_(model, 0.5)
        opt.step()
        opt.zero_grad()
    weights = {n: gp.to_host(p.data).copy() for n, p in model.named_parameters()}
    return losses, weights, started


def dense_run(llama: bool = False):
    model = nn.Llama(nn.LlamaConfig(**LLAMA)) if llama else nn.GPT(nn.GPTConfig(**CFG))
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for x, y in batches():
        loss = model.loss(x, y)
        loss.backward()
        optim.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.item()))
    return model, losses


CASES = [("dp", {}), ("dp2xpp2", {}), ("dp2xtp2", {}),
         ("dp2xtp2", {"sequence_parallel": True}), ("dp", {"dtype": gp.bfloat16}),
         ("dp", {"llama": True}), ("dp2xpp2", {"llama": True})]


@pytest.mark.mpi
@pytest.mark.parametrize("layout,options", CASES,
                         ids=["dp", "dp2xpp2", "dp2xtp2", "dp2xtp2-sp", "dp-bf16", "dp-llama",
                              "dp2xpp2-llama"])
def test_overlap_equals_blocking_and_one_process(world, layout, options):
    dp, pp, tp = LAYOUTS[layout](world.size)
    if dp * pp * tp != world.size or dp != 2:
        pytest.skip(f"{layout} with dp=2 needs {2 * pp * tp} ranks")
    mesh = dist.ProcessMesh(dp=dp, pp=pp, tp=tp, world=world)
    options = dict(options)
    llama = options.pop("llama", False)
    cls, cfg = ((ParallelLlama, nn.LlamaConfig(**LLAMA)) if llama
                else (ParallelGPT, nn.GPTConfig(**CFG)))
    runs = {}
    for overlap in (True, False):
        model = cls(cfg, mesh, num_micro_batches=2, **options)
        runs[overlap] = train(model, mesh, dp, overlap)
    (l_on, w_on, started), (l_off, w_off, _) = runs[True], runs[False]
    assert started >= 2  # the backward started buckets itself
    assert l_on == l_off
    for name in w_on:
        assert np.array_equal(w_on[name], w_off[name]), name
    if "dtype" in options:
        return
    dense, losses = dense_run(llama)
    np.testing.assert_allclose(l_on, losses, rtol=1e-12)
    check_against_dense(model, dense, what="value", rtol=1e-9, atol=1e-12)


@pytest.mark.mpi
@pytest.mark.gpu
def test_overlap_on_the_device_takes_the_staged_path(world, accelerator):
    """Device gradients (the emulated device: host-staged MPI) reduce alike on and off.
    To rounding only: the emulated device's kernels are not bit-reproducible from run to
    run (two blocking runs differ in the last bits); test_nonblocking checks the staged
    reduction itself bit for bit."""
    if world.size != 2:
        pytest.skip("dp=2")
    mesh = dist.ProcessMesh(dp=2, pp=1, tp=1, world=world)
    cfg = nn.GPTConfig(**{**CFG, "n_layer": 2})  # the emulated device is slow
    runs = [train(ParallelGPT(cfg, mesh, num_micro_batches=2, device=accelerator), mesh, 2,
                  overlap, steps=1)
            for overlap in (True, False)]
    assert runs[0][2] >= 2
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-12)
    for name in runs[0][1]:
        np.testing.assert_allclose(runs[0][1][name], runs[1][1][name], rtol=1e-9,
                                   atol=1e-12, err_msg=name)


@pytest.mark.mpi
def test_first_bucket_reduction_starts_before_the_last_backward_ends(world):
    if world.size != 2:
        pytest.skip("dp=2")
    mesh = dist.ProcessMesh(dp=2, pp=1, tp=1, world=world)
    model = ParallelGPT(nn.GPTConfig(**CFG), mesh, num_micro_batches=2)
    model.grad_bucket_bytes = BUCKET
    x, y = batches()[0]
    trace.start(world)
    try:
        model.train_step(rows_of(x, mesh.dp_rank, 2), rows_of(y, mesh.dp_rank, 2))
    finally:
        events = trace.stop()
    last_backward = max((e for e in events if e["name"] == "backward"),
                        key=lambda e: e["args"]["micro_batch"])
    assert last_backward["args"]["micro_batch"] == 1
    buckets = sorted((e for e in events if e["name"] == "all_reduce"
                      and e["args"].get("nonblocking")), key=lambda e: e["ts"])
    assert len(buckets) >= 2 and all(e["tid"] == trace.REQUEST_TID for e in buckets)
    assert buckets[0]["ts"] < last_backward["ts"] + last_backward["dur"]
    assert buckets[0]["ts"] > last_backward["ts"]  # armed for the last micro-batch only


@pytest.mark.mpi
def test_allreduce_gradients_finishes_a_pending_reducer(world):
    """A user's own loop: arm before the backward, then dist.allreduce_gradients waits for
    what the backward started and reduces the rest; the same as the blocking call."""
    model = nn.Sequential(nn.Linear(6, 8, dtype=F64, seed=1), nn.GELU(),
                          nn.Linear(8, 3, dtype=F64, seed=2))
    extra = nn.Parameter(np.arange(4.0) + world.rank)  # not in the reducer
    x = np.random.default_rng(world.rank).standard_normal((4, 6))
    reducer = OverlappedGradReducer(model.parameters(), world, bucket_bytes=100)
    grads = {}
    for overlap in (True, False):
        for p in [*model.parameters(), extra]:
            p.grad = None
        if overlap:
            reducer.arm()
        (model(ag.tensor(x)).sum() + (extra * 2.0).sum()).backward()
        assert reducer.started_buckets() == (len(reducer.buckets) if overlap else 0)
        dist.allreduce_gradients([*model.parameters(), extra], world)
        assert not reducer.pending
        grads[overlap] = [p.grad.numpy().copy() for p in [*model.parameters(), extra]]
    for a, b in zip(grads[True], grads[False], strict=True):
        assert np.array_equal(a, b)
    np.testing.assert_array_equal(grads[True][-1], np.full(4, 2.0))
    reducer.remove()
    with pytest.raises(RuntimeError, match="OverlappedGradReducer.arm"):
        r = OverlappedGradReducer(model.parameters(), world)
        r.arm()
        model(ag.tensor(x)).sum().backward()
        r.armed = False  # as if a step forgot to finish: the next arm refuses
        r.arm()
    r.finish()
    r.remove()


def test_no_reducer_without_data_parallelism():
    model = ParallelGPT(nn.GPTConfig(**CFG), num_micro_batches=2)
    assert model.overlap_grad_reduce and model.grad_reducer() is None


def test_reverse_buckets_with_a_small_first_one(world):
    """Buckets follow backward's order (last parameter first); the first is capped at
    first_bucket_bytes so the first reduction starts early."""
    params = [nn.Parameter(np.zeros(n)) for n in (4, 4, 2, 2, 1, 3)]  # float64: 8 B each
    reducer = OverlappedGradReducer(params, world, bucket_bytes=64, first_bucket_bytes=24)
    try:
        assert [[p.data.size for p in b] for b in reducer.buckets] == [[3], [1, 2, 2], [4, 4]]
    finally:
        reducer.remove()
