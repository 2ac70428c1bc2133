"""Communicator.iall_reduce: the same result as all_reduce, bit for bit (host arrays, and
device arrays through the host-staged path), several requests in flight at once, the
watchdog's list of outstanding requests, and its span in a trace."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from dist import trace, watchdog
from gpuplan.testing import f64, on, random
from tests.helpers import DTYPES

mpi = pytest.mark.mpi


def rank_data(rank: int, shape, dtype, salt: int = 0) -> np.ndarray:
    return random(shape, dtype, seed=1000 * salt + rank)


@mpi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "max", "mean"])
def test_iall_reduce_equals_all_reduce_bit_for_bit(world, device, dtype, op):
    x = on(device, rank_data(world.rank, (33, 5), dtype))
    before = f64(x)
    blocking = world.all_reduce(x, op)
    request = world.iall_reduce(x, op)
    got = request.wait()
    assert got.dtype == x.dtype and gp.device_of(got) == device and request.done
    np.testing.assert_array_equal(f64(got), f64(blocking))
    np.testing.assert_array_equal(f64(x), before)
    assert request.wait() is got  # a second wait returns the result again


@mpi
@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place_strided_out_and_several_in_flight(world, device, dtype):
    """Three requests posted before any wait, waited in reverse order: in place, into a
    strided out, and a plain one; each equals its blocking all_reduce."""
    a = on(device, rank_data(world.rank, (6, 9), dtype, salt=1))
    b = on(device, rank_data(world.rank, (6, 9), dtype, salt=2))
    c = on(device, rank_data(world.rank, (40,), dtype, salt=3))
    want = [f64(world.all_reduce(v, "mean")) for v in (a, b, c)]
    out_b = on(device, np.zeros((9, 6), dtype)).T  # not C-contiguous
    requests = [world.iall_reduce(a, "mean", out=a), world.iall_reduce(b, "mean", out=out_b),
                world.iall_reduce(c, "mean")]
    assert len(watchdog.outstanding_requests()) == 3
    got = [r.wait() for r in reversed(requests)][::-1]
    assert got[0] is a and got[1] is out_b
    assert watchdog.outstanding_requests() == []
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(f64(g), w)


@mpi
def test_trace_span_from_issue_to_wait(world):
    x = np.arange(1000, dtype=np.float32) + world.rank
    trace.start()
    try:
        request = world.iall_reduce(x)
        with trace.span("backward"):
            world.barrier()  # something else happens while the request is in flight
        request.wait()
    finally:
        events = trace.stop()
    [span] = [e for e in events if e["name"] == "all_reduce"]
    [backward] = [e for e in events if e["name"] == "backward"]
    assert span["tid"] == trace.REQUEST_TID and span["cat"] == "comm"
    assert span["args"]["bytes"] == 4000 and span["args"]["nonblocking"] is True
    assert span["ts"] <= backward["ts"]
    assert span["ts"] + span["dur"] >= backward["ts"] + backward["dur"]


def test_one_process_and_empty_arrays_complete_at_once(world):
    if world.size != 1:
        pytest.skip("one process")
    x = np.arange(5.0)
    request = world.iall_reduce(x, "mean")
    assert request.test() and watchdog.outstanding_requests() == []
    np.testing.assert_array_equal(request.wait(), x)


def test_iall_reduce_checks_its_arguments(world):
    with pytest.raises(gp.Unsupported, match="iall_reduce.*op"):
        world.iall_reduce(np.ones(3), "min")
    with pytest.raises(gp.InvalidProblem, match="iall_reduce.*out"):
        world.iall_reduce(np.ones(3), out=np.ones(4))


def test_watchdog_report_names_outstanding_requests():
    token = watchdog.watch_request("all_reduce", "world", None)
    try:
        dog = watchdog.Watchdog(5.0, rank=1, size=2, abort=lambda code: None)
        line = dog.describe("barrier", "world", None, 6.0)
        assert "1 non-blocking request outstanding (oldest: all_reduce, issued" in line
    finally:
        watchdog.unwatch_request(token)
    assert "outstanding" not in dog.describe("barrier", "world", None, 6.0)


@mpi
@pytest.mark.parametrize("shape", [(4, 3), (0, 5), ()])
@pytest.mark.parametrize("dtype", [np.float64, gp.bfloat16])
def test_irecv_array_posted_before_the_send(world, device, shape, dtype):
    """Around a ring: every rank posts its receive, the ranks meet (so no send has been
    made yet: progress() finds nothing), then each sends; wait() returns the array."""
    right, left = (world.rank + 1) % world.size, (world.rank - 1) % world.size
    request = world.irecv_array(left, tag=9)
    assert not request.progress()
    world.barrier()
    x = on(device, rank_data(world.rank, shape, dtype, salt=4))
    sent = world.isend_array(x, right, tag=9)
    got = request.wait()
    sent.wait()
    assert got.shape == shape and got.dtype == dtype and gp.device_of(got) == device
    np.testing.assert_array_equal(f64(got), f64(on(device, rank_data(left, shape, dtype, 4))))
    assert request.progress() and request.wait() is got


@mpi
def test_pipeline_posts_every_receive_before_its_first_action(world, monkeypatch):
    """Each stage posts all of a step's receives (irecv_array) before it runs anything,
    waits each where its schedule uses it, and none is left posted."""
    from autograd import nn
    from dist import PipelineParallel, PipelineStage
    from dist.pipeline import runner

    n = world.size
    stages = [lambda s=s: PipelineStage(s).add_layer(nn.Linear(4, 4, dtype=np.float64,
                                                               seed=s)) for s in range(n)]
    pipe = PipelineParallel(stages, num_micro_batches=3, comm=world)
    log = []
    real_post, real_forward = runner._MpiTransport.post, runner._StageRun._forward
    monkeypatch.setattr(runner._MpiTransport, "post",
                        lambda self, *a: (log.append("post"), real_post(self, *a))[1])
    monkeypatch.setattr(runner._StageRun, "_forward",
                        lambda self, m: (log.append("forward"), real_forward(self, m))[1])
    x = np.ones((6, 4))
    pipe.train_step(x, np.zeros(6), lambda out, t: (out * out).sum())
    posts = 3 * ((world.rank > 0) + (world.rank < n - 1))
    assert log == ["post"] * posts + ["forward"] * 3


@mpi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_ireduce_scatter_equals_reduce_scatter_bit_for_bit(world, device, dtype, op):
    """Along axis 0 and 1, into a given out and a fresh one, two in flight at once; the
    watchdog lists them until their waits, and x is left as it was."""
    n = 3 * world.size
    x = on(device, rank_data(world.rank, (n, 2 * world.size), dtype, salt=4))
    before = f64(x)
    want0, want1 = (f64(world.reduce_scatter(x, op, axis=a)) for a in (0, 1))
    out0 = on(device, np.zeros((3, 2 * world.size), dtype))
    requests = [world.ireduce_scatter(x, op, axis=0, out=out0),
                world.ireduce_scatter(x, op, axis=1)]
    assert len(watchdog.outstanding_requests()) == (2 if world.size > 1 else 0)
    got1, got0 = requests[1].wait(), requests[0].wait()
    assert got0 is out0 and got1.dtype == x.dtype and gp.device_of(got1) == device
    assert watchdog.outstanding_requests() == []
    np.testing.assert_array_equal(f64(got0), want0)
    np.testing.assert_array_equal(f64(got1), want1)
    np.testing.assert_array_equal(f64(x), before)


@mpi
def test_ireduce_scatter_trace_span_and_bad_shape(world):
    x = np.arange(8 * world.size, dtype=np.float64) + world.rank
    trace.start()
    try:
        request = world.ireduce_scatter(x, "sum")
        request.wait()
    finally:
        events = trace.stop()
    if world.size > 1:
        [span] = [e for e in events if e["name"] == "reduce_scatter"]
        assert span["args"]["nonblocking"] and span["args"]["bytes"] == 8 * 8
    if world.size > 1:
        with pytest.raises(Exception, match="ireduce_scatter.*divisible"):
            world.ireduce_scatter(np.zeros(world.size + 1), "sum")
