"""Context parallelism's layout and ring attention against dense causal attention computed
in one process (float64), over the whole world as the cp group (mpiexec -n 2 and -n 4)."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import dist
import gpuplan as gp
from autograd.functions.attention import scaled_dot_product_attention
from autograd.gradcheck import gradcheck
from dist.context_parallel import (
    chunk_indices,
    gather_sequence,
    local_positions,
    ring_attention,
    take_local,
)
from gpuplan.errors import InvalidProblem

TOL = dict(rtol=1e-11, atol=1e-13)


def test_layout_pairs_each_chunk_with_its_mirror():
    assert [chunk_indices(4, r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert local_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert local_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    every = np.sort(np.concatenate([local_positions(24, 3, r) for r in range(3)]))
    assert every.tolist() == list(range(24))
    with pytest.raises(InvalidProblem, match=r"local_positions.*'n'.*divisible by 2 \* cp = 6"):
        local_positions(10, 3, 0)


def test_one_rank_is_plain_causal_attention():
    rng = np.random.default_rng(0)
    q, k, v = (ag.tensor(rng.standard_normal((1, 2, 6, 4)), requires_grad=True)
               for _ in range(3))
    got = ring_attention(q, k, v, None)
    want = scaled_dot_product_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(got.numpy(), want.numpy(), **TOL)
    assert gradcheck(lambda a, b, c: ring_attention(a, b, c, None), [q, k, v])


def qkv(heads: int, kv_heads: int, length: int, seed: int = 1, dim: int = 4):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((2, heads, length, dim)),
            rng.standard_normal((2, kv_heads, length, dim)),
            rng.standard_normal((2, kv_heads, length, dim)))


@pytest.mark.mpi
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 2), (4, 1)])
def test_ring_attention_equals_dense_causal_attention(world, device, heads, kv_heads):
    """On the host and (under GPUPLAN_DEVICE=emulated, or on a GPU) on the device."""
    n = world.size
    length = 4 * n  # chunks of 2 tokens
    q, k, v = qkv(heads, kv_heads, length)
    dout = np.random.default_rng(9).standard_normal(q.shape)
    # Dense, in this process: output and gradients of <out, dout>.
    dense = [ag.tensor(a, requires_grad=True, device=device) for a in (q, k, v)]
    out = scaled_dot_product_attention(*dense, is_causal=True, enable_gqa=kv_heads != heads)
    (out * ag.tensor(dout, device=device)).sum().backward()
    # Ring: this rank's slices.
    local = [ag.tensor(take_local(a, world, axis=2), requires_grad=True, device=device)
             for a in (q, k, v)]
    got = ring_attention(*local, world)
    assert got.device == device
    np.testing.assert_allclose(got.numpy(), take_local(out.numpy(), world, axis=2), **TOL)
    gathered = gather_sequence(got.data, world, axis=2)
    np.testing.assert_allclose(gp.to_host(gathered), out.numpy(), **TOL)
    (got * ag.tensor(take_local(dout, world, axis=2), device=device)).sum().backward()
    for name, mine, full in zip("qkv", local, dense, strict=True):
        np.testing.assert_allclose(mine.grad.numpy(), take_local(full.grad.numpy(), world,
                                                                 axis=2), err_msg=name, **TOL)


@pytest.mark.mpi
def test_ring_attention_in_bfloat16_keeps_the_dtype_and_sums_in_float32(world):
    """bf16 q, k, v: output and gradients bf16, within bf16 rounding of the f64 ring (the
    partial results and gradient sums are float32 across the ring steps)."""
    from gpuplan.dtypes import bfloat16

    q, k, v = qkv(4, 2, 4 * world.size, seed=6)
    dout = np.random.default_rng(7).standard_normal(q.shape)
    results = {}
    for dtype in (np.float64, bfloat16):
        local = [ag.tensor(take_local(a, world, axis=2).astype(dtype), requires_grad=True)
                 for a in (q, k, v)]
        out = ring_attention(*local, world)
        (out * ag.tensor(take_local(dout, world, axis=2).astype(dtype))).sum().backward()
        results[dtype] = [out] + [t.grad for t in local]
    for want, got in zip(results[np.float64], results[bfloat16], strict=True):
        assert got.dtype == bfloat16
        np.testing.assert_allclose(got.numpy().astype(np.float64), want.numpy(), rtol=0.05,
                                   atol=0.05)


@pytest.mark.mpi
def test_ring_attention_finite_differences(world):
    """Finite differences of the ring's loss ``sum over ranks <out_r, w_r>`` against its
    backward: each global entry of q, k, v is perturbed on the rank that holds it."""
    n, rank = world.size, world.rank
    q, k, v = qkv(2, 1, 2 * n, seed=4, dim=2)
    w = np.random.default_rng(5).standard_normal(q.shape)
    positions = local_positions(2 * n, n, rank)
    w_local = take_local(w, world, axis=2)

    def loss(arrays):
        local = [take_local(a, world, axis=2) for a in arrays]
        out = ring_attention(*(ag.tensor(a) for a in local), world).numpy()
        return float(world.all_reduce(np.array([np.sum(out * w_local)]))[0])

    local = [ag.tensor(take_local(a, world, axis=2), requires_grad=True) for a in (q, k, v)]
    (ring_attention(*local, world) * ag.tensor(w_local)).sum().backward()
    eps = 1e-6
    for which, full in enumerate((q, k, v)):
        analytic = world.all_gather(local[which].grad.numpy(), axis=2)  # rank-major blocks
        order = np.concatenate([local_positions(2 * n, n, r) for r in range(n)])
        dense_grad = np.empty_like(full)
        dense_grad[:, :, order] = analytic
        for index in [(0, 0, 0, 0), (1, 0, 2 * n - 1, 1), (0, full.shape[1] - 1, n, 0)]:
            plus, minus = full.copy(), full.copy()
            plus[index] += eps
            minus[index] -= eps
            arrays_p = [plus if i == which else a for i, a in enumerate((q, k, v))]
            arrays_m = [minus if i == which else a for i, a in enumerate((q, k, v))]
            numeric = (loss(arrays_p) - loss(arrays_m)) / (2 * eps)
            assert abs(numeric - dense_grad[index]) < 1e-7, ("qkv"[which], index, positions)


@pytest.mark.mpi
def test_ring_attention_refuses_a_length_the_chunks_cannot_split(world):
    q = ag.tensor(np.zeros((1, 1, 3, 2)))
    with pytest.raises(InvalidProblem, match=r"ring_attention.*'q'.*divisible by 2 \* cp"):
        ring_attention(q, q, q, world)
    with pytest.raises(InvalidProblem, match=r"take_local.*'idx'.*divisible by 2 \* cp"):
        take_local(np.zeros((1, 2 * world.size + 1)), world)


def test_dist_exports_ring_attention():
    assert dist.ring_attention is ring_attention
