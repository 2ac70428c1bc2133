"""Host worker threads (gpuplan.host_pool) and the host SKUs split over them: every result is
bit-identical for any thread count."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import gpuplan as gp
from gpuplan import host, host_jit, host_pool
from gpuplan.execute import CONCURRENT_WORK
from gpuplan.ops.attention import host as attention_host
from gpuplan.ops.gemm import host as gemm_host
from gpuplan.testing import random

F = gp.functional


@pytest.fixture
def threads(monkeypatch):
    """threads(n): the host ops use n threads from now on (this test only); blocks and the
    grain are made small, so that the shapes below are split into many blocks and parts."""
    monkeypatch.setattr(host_pool, "BLOCK", 2048)
    monkeypatch.setattr(host_pool, "BIG_BLOCK", 8192)
    monkeypatch.setattr(host_pool, "GRAIN", 4096)
    monkeypatch.setattr(host_pool, "KERNEL_GRAIN", 1024)
    monkeypatch.setattr(attention_host, "HOST_CHUNK_SCORES", 4096)
    monkeypatch.setattr(attention_host, "HOST_GRAIN_SCORES", 4096)

    def use(n: int) -> None:
        monkeypatch.setattr(host, "thread_budget", lambda: n)
    return use


def test_split_covers_the_range_in_aligned_parts():
    assert host_pool.split(10, 3) == [0, 3, 6, 10]
    assert host_pool.split(100, 2, align=32) == [0, 64, 100]
    assert host_pool.split(5, 4, align=32) == [0, 5]  # one unit: one part
    assert host_pool.split(0, 2) == [0, 0]


def test_parallel_for_runs_every_part_once_on_several_threads(threads):
    threads(3)
    seen, names = [], set()

    def fn(lo, hi):
        seen.append((lo, hi))
        names.add(threading.get_ident())

    host_pool.parallel_for(90, fn, grain=10)
    assert sorted(seen) == [(0, 30), (30, 60), (60, 90)]
    assert len(names) == 3
    seen.clear()
    host_pool.parallel_for(15, fn, grain=10)  # too short for two parts
    assert seen == [(0, 15)]


def test_parallel_for_reraises_and_stays_usable(threads):
    threads(2)

    def fail_second(lo, hi):
        if lo:
            raise KeyError(lo)

    with pytest.raises(KeyError):
        host_pool.parallel_for(10, fail_second)
    out = np.zeros(10)
    host_pool.parallel_for(10, lambda lo, hi: out.__setitem__(slice(lo, hi), 1))
    assert (out == 1).all()


def test_nested_calls_run_on_the_caller_and_workers_share_the_error_state(threads):
    threads(2)
    inner, states = [], []

    def outer(lo, hi):
        states.append(np.geterr()["over"])
        host_pool.parallel_for(4, lambda a, b: inner.append((a, b)))

    with np.errstate(over="raise"):
        host_pool.parallel_for(2, outer)
    assert sorted(inner) == [(0, 4), (0, 4)]  # each outer part ran the inner loop whole
    assert states == ["raise", "raise"]


def test_for_blocks_split_only_big_ops_and_fixed_blocks_stay_fixed(threads):
    threads(2)
    seen = []
    host_pool.for_blocks(4000, lambda lo, hi: seen.append((lo, hi)))  # < 2 grains: one thread
    assert seen == [(lo, min(lo + 2048, 4000)) for lo in range(0, 4000, 2048)]
    seen.clear()
    host_pool.for_blocks(100, lambda lo, hi: seen.append((lo, hi)), row=100, group=3)
    # Split (2 parts of >= 40 rows): BIG_BLOCK rows rounded down to whole groups of 3.
    assert sorted(seen) == [(0, 81), (81, 100)]


def test_for_blocks_depend_on_the_shape_only(threads):
    got = {}
    for n in (1, 2, 3):
        threads(n)
        seen = []
        host_pool.for_blocks(30_000, lambda lo, hi, s=seen: s.append((lo, hi)), row=100,
                             rows_per_block=64)
        got[n] = sorted(seen)
    assert got[1] == got[2] == got[3]
    assert got[1][0] == (0, 64) and got[1][-1] == (29_952, 30_000)


def test_thread_budget_follows_set_blas_threads(monkeypatch):
    monkeypatch.setattr(host, "_budget", None)
    assert host.thread_budget() >= 1
    monkeypatch.setattr(host, "blas_threads", lambda: None)  # no BLAS pool to size
    assert host.set_blas_threads(3) is False  # the budget follows even so
    assert host.thread_budget() == 3


def _host_ops(dtype):
    """Every split host op on shapes that span several blocks and threads: name -> call."""
    x = random((300_001,), dtype, low=-6, high=6)
    dy = random((300_001,), dtype, seed=1)
    rows = random((1500, 96), dtype, seed=2)
    drows = random((1500, 96), dtype, seed=3)
    w, b = random((96,), dtype, seed=4), random((96,), dtype, seed=5)
    _, mean, rstd = F.layer_norm(rows, w, b)
    scores = random((24, 128, 128), dtype, seed=6, low=-4, high=4)
    probs = F.softmax(scores, scale=0.3, causal=True)
    logits = random((3000, 77), dtype, seed=7, low=-5, high=5)
    target = np.random.default_rng(8).integers(0, 77, 3000)
    target[::7] = -100
    _, lse = F.cross_entropy(logits, target)
    q, do = random((24, 64, 32), dtype, seed=9), random((24, 64, 32), dtype, seed=10)
    k, v = random((24, 80, 32), dtype, seed=11), random((24, 80, 32), dtype, seed=12)
    o, att_lse = F.attention(q, k, v, scale=0.2, causal=True)
    a, bmat = random((700, 40), dtype, seed=13), random((40, 96), dtype, seed=14)
    return {
        "attention": lambda: F.attention(q, k, v, scale=0.2, causal=True),
        "attention_backward": lambda: F.attention_backward(q, k, v, o, att_lse, do, scale=0.2,
                                                           causal=True),
        "gemm_bias_gelu": lambda: F.matmul(a, bmat, bias=w, epilogue="gelu", save_preact=True),
        "gelu": lambda: F.unary("gelu", x),
        "gelu_backward": lambda: F.unary_backward("gelu", x, dy),
        "silu": lambda: F.unary("silu", x),
        "layer_norm": lambda: F.layer_norm(rows, w, b),
        "layer_norm_backward": lambda: F.layer_norm_backward(drows, rows, w, mean, rstd),
        "rms_norm_backward": lambda: F.rms_norm_backward(drows, rows, w, rstd),
        "softmax": lambda: F.softmax(scores, scale=0.3, causal=True),
        "softmax_backward": lambda: F.softmax_backward(probs, scores, scale=0.3, causal=True),
        "cross_entropy": lambda: F.cross_entropy(logits, target, label_smoothing=0.1),
        "cross_entropy_backward": lambda: F.cross_entropy_backward(
            logits, target, lse, np.float32(0.5), label_smoothing=0.1),
    }


def test_blas_runs_on_one_thread_inside_a_split_op_and_is_restored_after(threads):
    threads(2)
    pools = host._blas_pools()
    if not pools:
        pytest.skip("threadpoolctl finds no BLAS")
    before = [p.get_num_threads() for p in pools]
    seen = []
    host_pool.parallel_for(20, lambda lo, hi: seen.append(pools[0].get_num_threads()), grain=10)
    assert seen == [1, 1]
    assert [p.get_num_threads() for p in pools] == before


def _gemm_cases(dtype):
    """GEMMs that split by rows, by columns, by batch entries and by rows of a batch, with
    the real GEMM_GRAIN: parts stay above OpenBLAS's small-matrix kernel (1M multiply-adds
    on AVX-512), whose different summation order would change bits with the split."""
    r = lambda shape, seed: random(shape, dtype, seed=seed)  # noqa: E731
    return {
        "rows": lambda: F.matmul(r((1500, 64), 20), r((64, 96), 21)),
        "rows_trans": lambda: F.matmul(r((64, 1500), 22), r((96, 64), 23), trans_a=True,
                                       trans_b=True),
        "cols": lambda: F.matmul(r((40, 64), 24), r((64, 3000), 25)),
        "batch": lambda: F.matmul(r((8, 100, 64), 26), r((8, 64, 120), 27)),
        "batch_rows": lambda: F.matmul(r((2, 1200, 64), 28), r((64, 50), 29), alpha=0.5),
        "bias": lambda: F.matmul(r((700, 64), 30), r((64, 200), 31), bias=r((200,), 32)),
    }


@pytest.mark.parametrize("dtype", [np.float32, gp.bfloat16, np.float64])
def test_split_gemms_are_bit_identical_for_any_thread_count_and_equal_numpy(threads, dtype):
    cases = _gemm_cases(dtype)
    results = {}
    for n in (1, 2, 3):
        threads(n)
        results[n] = {name: _bits(op()) for name, op in cases.items()}
    for name in cases:
        assert results[1][name] == results[2][name] == results[3][name], name
    if dtype != gp.bfloat16:  # f32/f64: the same bits as one NumPy matmul
        threads(2)
        a, b = random((1500, 64), dtype, seed=20), random((64, 96), dtype, seed=21)
        assert _bits(F.matmul(a, b)) == _bits(np.matmul(a, b))


def test_split_gemm_really_splits(threads, monkeypatch):
    threads(2)
    calls = []
    real = np.matmul

    def spy(a, b, out=None):
        calls.append(out.shape)
        return real(a, b, out=out)

    monkeypatch.setattr(gemm_host.np, "matmul", spy)
    gemm_host.matmul(np.ones((1500, 64), np.float32), np.ones((64, 96), np.float32),
                     np.empty((1500, 96), np.float32))
    assert sorted(calls) == [(732, 96), (768, 96)]  # rows split at a multiple of 64


def _bits(out):
    outs = out if isinstance(out, tuple) else (out,)
    return [np.asarray(o).tobytes() for o in outs if o is not None]


@pytest.mark.parametrize("dtype", [np.float32, gp.bfloat16, np.float64])
def test_host_ops_are_bit_identical_for_any_thread_count(threads, dtype):
    ops = _host_ops(dtype)
    results = {}
    for n in (1, 2, 3):
        threads(n)
        results[n] = {name: _bits(op()) for name, op in ops.items()}
    for name in ops:
        assert results[1][name] == results[2][name] == results[3][name], name


def test_adamw_multi_tensor_is_bit_identical_for_any_thread_count(threads):
    sizes = (70_000, 5, 0, 100_003, 128)
    results = []
    for n in (1, 2, 3):
        threads(n)
        rng = np.random.default_rng(0)  # the same start for every thread count
        params = [rng.standard_normal(k).astype(np.float32) for k in sizes]
        grads = [rng.standard_normal(k).astype(np.float32) for k in sizes]
        m = [np.zeros(k, np.float32) for k in sizes]
        v = [np.zeros(k, np.float32) for k in sizes]
        desc = gp.AdamWMultiTensorDescriptor(sizes, np.float32)
        plan = gp.AdamWMultiTensorPlan.select(gp.Stream.host(), desc)
        for step in (1, 2):
            plan.run(gp.Stream.host(), None, gp.AdamWMultiTensorArgs(
                params, grads, m, v, lr=1e-2, step=step, beta1=0.9, beta2=0.95, eps=1e-8,
                weight_decay=0.1))
        results.append(b"".join(a.tobytes() for a in params + m + v))
    assert results[0] == results[1] == results[2]


@pytest.mark.parametrize("polls", [0, 50, None, "no_settle", "numpy"],
                         ids=["sleep", "short_spin", "spin", "no_settle", "no_kernels"])
def test_hand_offs_lose_no_wake_up_whether_threads_poll_or_sleep(threads, monkeypatch, polls):
    """Many back-to-back split calls, with parts of uneven length, so that workers and the
    caller meet each other polling, falling asleep and waking: every part runs once, and an
    error still comes back."""
    if polls == "numpy":  # no compiled wait_until: the threads only sleep
        monkeypatch.setattr(host_jit, "kernels", lambda: None)
    elif polls == "no_settle":
        monkeypatch.setattr(host_pool, "SETTLE_POLLS", 0)
    elif polls is not None:
        monkeypatch.setattr(host_pool, "SPIN_POLLS", polls)
    threads(3)
    rng = np.random.default_rng(0)
    counts = np.zeros(3000, np.int64)

    def fn(lo, hi):
        counts[lo:hi] += 1
        if rng.random() < 0.3:
            time.sleep(rng.random() * 2e-4)

    for k in range(1000):
        host_pool.parallel_for(3, lambda lo, hi, k=k: fn(3 * k + lo, 3 * k + hi))
    assert (counts == 1).all()

    def fail(lo, hi):
        if lo == 2:
            raise KeyError(lo)
    with pytest.raises(KeyError):
        host_pool.parallel_for(3, fail)
    host_pool.parallel_for(3, fn)  # still usable


def test_concurrently_gives_whole_calls_to_the_threads_and_the_same_results(threads):
    seen = []

    def call(k):
        def run():
            seen.append(threading.get_ident())
            return F.matmul(np.full((300, 64), k, np.float32), np.ones((64, 96), np.float32))
        return run

    threads(2)
    out = gp.concurrently(np.zeros(1), call(1), None, call(2))
    assert out[1] is None and len(set(seen)) == 2
    np.testing.assert_array_equal(out[0], np.full((300, 96), 64.0))
    np.testing.assert_array_equal(out[2], np.full((300, 96), 128.0))
    seen.clear()
    threads(3)  # more threads than calls: in order, each call splitting itself
    gp.concurrently(np.zeros(1), call(1), call(2))
    assert set(seen) == {threading.get_ident()}
    seen.clear()
    threads(2)  # calls too small to hand off: in order on the caller, the same results
    small = gp.concurrently(np.zeros(1), call(1), call(2), work=300 * 64 * 96)
    assert set(seen) == {threading.get_ident()}
    np.testing.assert_array_equal(small[1], out[2])
    seen.clear()
    gp.concurrently(np.zeros(1), call(1), call(2), work=CONCURRENT_WORK)
    assert len(set(seen)) == 2

    def boom():
        raise KeyError("boom")
    threads(2)
    with pytest.raises(KeyError):
        gp.concurrently(np.zeros(1), call(1), boom)


def test_wait_until_answers_alike_with_and_without_settle_polls():
    """The compiled poll: True when flags[index] equals the value within `polls` (then it
    spins `settle` more polls, a timing matter not checked here), False when it does not;
    the settle count never changes the answer."""
    k = host_jit.kernels()
    if k is None or k.wait_until is None:
        pytest.skip("no compiled wait_until here (numba or sched_yield missing)")
    for settle in (0, 5):
        flags = np.array([3, 7, settle], np.int64)  # the settle count is read from flags[2]
        assert k.wait_until(flags, 1, 7, 10, 2) is True
        assert k.wait_until(flags, 0, 4, 10, 2) is False
        assert k.wait_until(flags, 0, 3, 0, 2) is True  # no poll left: read once more
