"""CUDA graph capture (gpuplan.graphs) on the device: a captured training step replayed N
times equals N eager steps bit for bit (losses, norms, weights, step counts, a changing
learning rate), what cannot be captured raises GraphCaptureError and leaves the stream
usable. Runs on the emulated device in CI, on CuPy with a GPU."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from autograd import nn, optim
from gpuplan.graphs import GraphCaptureError

pytestmark = pytest.mark.gpu


def _fresh_schedules(device):
    if device == "emulated":  # the same thread interleavings as the other run's
        from gpuplan.emulator import reset_schedules

        reset_schedules()


def _build(device, foreach):
    model = nn.Sequential(nn.Linear(8, 16, seed=1), nn.GELU(), nn.LayerNorm(16),
                          nn.Linear(16, 5, seed=2))
    model.to(device=device)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = optim.AdamW([{"params": decay, "weight_decay": 0.1},
                       {"params": rest, "weight_decay": 0.0}], lr=3e-2, foreach=foreach)
    sched = optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + s))
    params = list(model.parameters())

    def step(x, y):
        with ag.Tape():
            loss = nn.functional.cross_entropy(model(ag.Tensor(x)), ag.Tensor(y))
        loss.backward()
        norm = gp.functional.clip_grad_norm_([p.grad.data for p in params], 0.5)
        opt.step()
        opt.zero_grad()
        return loss.data, norm

    return model, opt, sched, step


def _batches(n):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((6, 8)).astype(np.float32),
             rng.integers(0, 5, 6).astype(np.int64)) for _ in range(n)]


@pytest.mark.parametrize("foreach", [True, False])
def test_captured_step_replays_equal_eager_steps(accelerator, foreach):
    batches = _batches(5)
    _fresh_schedules(accelerator)
    model, opt, sched, step = _build(accelerator, foreach)
    eager = []
    for x, y in batches:
        loss, norm = step(gp.to_device(x, accelerator), gp.to_device(y, accelerator))
        sched.step()
        eager.append((float(gp.to_host(loss)), float(gp.to_host(norm))))
    want = [gp.to_host(p.data) for p in model.parameters()]

    _fresh_schedules(accelerator)
    model, opt, sched, step = _build(accelerator, foreach)
    x0, y0 = (gp.to_device(a, accelerator) for a in batches[0])
    captured = gp.graphs.capture_step(step, x0, y0, warmup=1)  # warm-up: batch 0, a real step
    sched.step()
    got = [eager[0]]
    for x, y in batches[1:]:
        loss, norm = captured(x, y)  # host batches are uploaded into the static inputs
        sched.step()
        got.append((float(gp.to_host(loss)), float(gp.to_host(norm))))
    assert got == eager  # the lr fell at every step: the graph read it from device memory
    for a, b in zip(want, (gp.to_host(p.data) for p in model.parameters()), strict=True):
        np.testing.assert_array_equal(a, b)
    assert {s["step"] for s in opt.state.values()} == {len(batches)}


def test_a_sync_inside_capture_raises_and_the_stream_still_works(accelerator):
    x = gp.to_device(np.arange(6, dtype=np.float32), accelerator)
    reads = {"item()": lambda y: y.item() if y.ndim == 0 else y[0].item(),
             "float()": lambda y: float(y[1]),
             "to_host": gp.to_host,
             "synchronize": lambda y: gp.Stream.for_array(y).synchronize()}
    for what, read in reads.items():
        g = gp.graphs.CUDAGraph()
        with pytest.raises(GraphCaptureError, match="capture") as info:
            with gp.graphs.graph(g):
                y = gp.functional.unary("scale", x, alpha=2.0)
                read(y)
        if accelerator == "emulated":  # the message names the call
            assert what.rstrip("()").split("_")[0] in str(info.value), what
        assert not gp.graphs.is_capturing(g.stream or gp.graphs.side_stream())
    y = gp.functional.unary("scale", x, alpha=2.0)  # eager work runs at once again
    np.testing.assert_array_equal(gp.to_host(y), 2 * np.arange(6, dtype=np.float32))


def test_boolean_mask_indexing_inside_capture_raises(accelerator):
    """CuPy sizes a boolean mask's selection on the host (a sync): reading or assigning
    through a mask cannot be captured; a select can."""
    x = gp.to_device(np.arange(6, dtype=np.float32), accelerator)
    mask = gp.to_device(np.arange(6) % 2 == 0, accelerator)
    for what, use in {"__getitem__": lambda: x[mask],
                      "__setitem__": lambda: x.__setitem__(mask, 0.0)}.items():
        with pytest.raises(GraphCaptureError, match="capture") as info:
            with gp.graphs.graph(gp.graphs.CUDAGraph()):
                use()
        if accelerator == "emulated":  # the message names the call and the cause
            assert what in str(info.value) and "boolean-mask" in str(info.value)
    np.testing.assert_array_equal(gp.to_host(x), np.arange(6, dtype=np.float32))
    zero = gp.full((), 0.0, np.float32, accelerator)
    g = gp.graphs.CUDAGraph()
    with gp.graphs.graph(g):
        y = gp.functional.where(mask, zero, x)
    g.replay()
    np.testing.assert_array_equal(gp.to_host(y), np.where(np.arange(6) % 2 == 0, 0.0,
                                                          np.arange(6.0)))


def test_a_pageable_upload_inside_capture_raises(accelerator):
    x = gp.to_device(np.zeros(4, np.float32), accelerator)
    with pytest.raises(GraphCaptureError):
        with gp.graphs.graph(gp.graphs.CUDAGraph()):
            x.set(np.ones(4, np.float32))
    with pytest.raises(GraphCaptureError):
        with gp.graphs.graph(gp.graphs.CUDAGraph()):
            gp.asarray(np.ones(4, np.float32), device=accelerator)
    np.testing.assert_array_equal(gp.to_host(x), np.zeros(4, np.float32))


def test_state_made_during_capture_and_host_norms_are_refused(accelerator):
    model, opt, sched, step = _build(accelerator, True)
    x, y = (gp.to_device(a, accelerator) for a in _batches(1)[0])
    with pytest.raises(GraphCaptureError, match="warm-up"):  # no eager step: no moments yet
        with gp.graphs.graph(gp.graphs.CUDAGraph()):
            step(x, y)
    step(x, y)
    with ag.Tape():
        loss = nn.functional.cross_entropy(model(ag.Tensor(x)), ag.Tensor(y))
    loss.backward()
    grads = [p.grad.data for p in model.parameters()]
    with pytest.raises(GraphCaptureError, match="total_norm"):
        with gp.graphs.graph(gp.graphs.CUDAGraph()):
            gp.functional.clip_grad_norm_(grads, 0.5, total_norm=3.0)


def test_sgd_step_inside_capture_is_refused(accelerator):
    """SGD's lr is a kernel argument: a captured step would replay a frozen lr."""
    w = nn.Parameter(ag.Tensor(gp.to_device(np.ones(3, np.float32), accelerator)))
    w.grad = ag.Tensor(gp.to_device(np.full(3, 0.5, np.float32), accelerator))
    opt = ag.optim.SGD([w], lr=0.1, momentum=0.9)
    opt.step()  # eager: fine
    before = gp.to_host(w.data).copy()
    with pytest.raises(GraphCaptureError, match="SGD.step"):
        with gp.graphs.graph(gp.graphs.CUDAGraph()):
            opt.step()
    np.testing.assert_array_equal(gp.to_host(w.data), before)


def test_capture_step_checks_its_inputs(accelerator):
    x = gp.to_device(np.ones(4, np.float32), accelerator)
    step = gp.graphs.capture_step(lambda a: gp.functional.unary("scale", a, alpha=3.0), x,
                                  warmup=1)
    np.testing.assert_array_equal(gp.to_host(step(np.full(4, 2.0, np.float32))), np.full(4, 6.0))
    with pytest.raises(ValueError, match=r"input 0: expected shape \(4,\) float32"):
        step(np.ones(5, np.float32))
    with pytest.raises(ValueError, match="warmup"):
        gp.graphs.capture_step(lambda a: a, x, warmup=0)
    with pytest.raises(GraphCaptureError, match="device"):
        gp.graphs.capture_step(lambda a: a, np.ones(4, np.float32))
    strided = gp.to_device(np.ones((4, 2), np.float32), accelerator)[:, 0]
    with pytest.raises(GraphCaptureError, match=r"static input 0: expected a C-contiguous"):
        gp.graphs.capture_step(lambda a: a, strided)
    # A device input is copied into the static one (on the current stream) before the replay.
    y = gp.to_device(np.full(4, 5.0, np.float32), accelerator)
    np.testing.assert_array_equal(gp.to_host(step(y)), np.full(4, 15.0))


def test_a_replay_after_an_array_it_touches_was_freed_raises(accelerator):
    if accelerator != "emulated":
        pytest.skip("a GPU would silently write freed memory: only the emulator can tell")
    x = gp.to_device(np.ones(4, np.float32), accelerator)
    out = gp.empty((4,), np.float32, device=accelerator)
    g = gp.graphs.CUDAGraph()
    with gp.graphs.graph(g):
        gp.execute(gp.UnaryPlan, gp.UnaryDescriptor("scale", 4, np.float32),
                   gp.UnaryArgs(x=x, y=out, alpha=2.0), like=x)
    g.replay()
    np.testing.assert_array_equal(gp.to_host(out), np.full(4, 2.0))
    del x  # allocated before the capture: the graph does not own it
    with pytest.raises(GraphCaptureError, match="freed"):
        g.replay()
