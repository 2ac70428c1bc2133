"""Dropout plans: Philox4x32-10 known answers, the documented mask mapping, keep-rate
statistics, forward/backward against float64 references, host/device bit-identity, errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.dropout import plans as dmod
from gpuplan.testing import assert_close, assert_rejected, check_plan, f64, on, random, run_plan
from tests.helpers import DTYPES

U32 = 0xFFFFFFFF


def philox_scalar(ctr: list[int], key: list[int]) -> list[int]:
    """Independent scalar Philox4x32-10 (Random123 philox4x32_R with R = 10) on Python ints."""
    c, k = list(ctr), list(key)
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & U32, (k[1] + 0xBB67AE85) & U32]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & U32, (p0 >> 32) ^ c[3] ^ k[1], p0 & U32]
    return c


def ref_mask(n: int, p: float, seed: int, offset: int) -> np.ndarray:
    """The documented mapping, element by element, with the scalar generator."""
    out = np.empty(n, dtype=bool)
    for i in range(n):
        j = (offset + i // 4) % 2**64
        word = philox_scalar([j & U32, j >> 32, 0, 0], [seed & U32, seed >> 32])[i % 4]
        out[i] = (word >> 8) * 2.0**-24 >= float(np.float32(p))  # both sides exact in f64
    return out


def ref_dropout(x: np.ndarray, mask: np.ndarray, p: float) -> np.ndarray:
    return np.where(mask, f64(x) / (1.0 - p), 0.0) if p < 1 else np.zeros(x.shape)


# Random123 known-answer vectors (kat_vectors: philox4x32 10): counter, key, expected.
KATS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((U32, U32, U32, U32), (U32, U32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("ctr,key,expected", KATS)
def test_philox_known_answers(ctr, key, expected):
    assert tuple(philox_scalar(list(ctr), list(key))) == expected
    j = np.array([ctr[0] | (ctr[1] << 32)], dtype=np.uint64)
    words = dmod.philox4x32_10(j, key, high=(ctr[2], ctr[3]))
    assert words.dtype == np.uint32 and tuple(int(w) for w in words[0]) == expected


def test_vectorized_philox_matches_scalar_on_random_counters():
    rng = np.random.default_rng(0)
    j = rng.integers(0, 2**64, size=64, dtype=np.uint64)
    key = (0x12345678, 0x9ABCDEF0)
    words = dmod.philox4x32_10(j, key)
    for jj, w in zip(j.tolist(), words, strict=True):
        assert [int(x) for x in w] == philox_scalar([jj & U32, jj >> 32, 0, 0], list(key))


@pytest.mark.parametrize("n,seed,offset", [(1, 0, 0), (37, 2**64 - 1, 0), (29, 7, 2**64 - 3),
                                           (64, 0xDEADBEEFCAFEF00D, 12345)])
def test_host_mask_follows_documented_mapping(n, seed, offset):
    for p in (0.0, 0.3, 0.5, 1.0):
        np.testing.assert_array_equal(dmod.keep_mask_host(n, p, seed, offset),
                                      ref_mask(n, p, seed, offset))


def test_keep_rate_statistics():
    n = 1 << 20
    for p in (0.1, 0.5, 0.9):
        mask = gp.functional.dropout_mask((n,), p, seed=2024)
        sigma = np.sqrt(p * (1 - p) / n)
        assert abs(mask.mean() - (1 - p)) < 5 * sigma, (p, mask.mean())
        for lane in range(4):  # every word of a Philox output is used, none biased
            assert abs(mask[lane::4].mean() - (1 - p)) < 5 * 2 * sigma
        # neighbouring elements independent: P(keep_i and keep_{i+1}) = (1-p)^2
        both = (mask[:-1] & mask[1:]).mean()
        assert abs(both - (1 - p) ** 2) < 5 * np.sqrt((1 - p) ** 2 / n) + 1e-4
    y = gp.functional.dropout(np.ones(n, np.float32), 0.3, seed=5)
    assert abs(y.astype(np.float64).mean() - 1.0) < 0.01  # inverted dropout keeps E[y] = x


def test_mask_reproducible_and_offset_shifts_counters():
    a = gp.functional.dropout_mask((1000,), 0.5, seed=11)
    np.testing.assert_array_equal(a, gp.functional.dropout_mask((1000,), 0.5, seed=11))
    assert (a != gp.functional.dropout_mask((1000,), 0.5, seed=12)).mean() > 0.3
    # offset counts Philox counters, 4 elements each
    b = gp.functional.dropout_mask((1000 - 4 * 17,), 0.5, seed=11, offset=17)
    np.testing.assert_array_equal(b, a[4 * 17:])
    assert dmod.philox_counters(1000) == 250 and dmod.philox_counters(1001) == 251


SIZES = [1, 3, 4, 5, 1001, 65539]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_forward_and_backward_match_reference(device, dtype, n, p):
    seed, offset = 1234567890123, 99
    mask = dmod.keep_mask_host(n, p, seed, offset)
    if n <= 1001:
        np.testing.assert_array_equal(mask, ref_mask(n, p, seed, offset))
    x = random((n,), dtype, seed=1)
    y = on(device, np.full((n,), 7, dtype))
    plan = run_plan(gp.DropoutPlan, gp.DropoutDescriptor(n, p, dtype),
                    gp.DropoutArgs(on(device, x), y, seed, offset), device)
    assert_close(y, ref_dropout(x, mask, p), dtype)
    assert plan.precision_guarantee().deterministic and plan.precision_guarantee().bit_stable
    dy = random((n,), dtype, seed=2)
    dx = on(device, np.full((n,), 7, dtype))
    run_plan(gp.DropoutBackwardPlan, gp.DropoutDescriptor(n, p, dtype),
             gp.DropoutBackwardArgs(on(device, dy), dx, seed, offset), device)
    assert_close(dx, ref_dropout(dy, mask, p), dtype)
    if device == "cuda":  # same bits as the host implementation
        host = gp.functional.dropout(x, p, seed, offset)
        np.testing.assert_array_equal(gp.to_host(y).view(np.uint8), host.view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_p_zero_copies_and_p_one_zeroes(device, dtype):
    x = on(device, random((4, 33), dtype, seed=3))
    y0 = gp.functional.dropout(x, 0.0, seed=1)
    np.testing.assert_array_equal(gp.to_host(y0).view(np.uint8), gp.to_host(x).view(np.uint8))
    y1 = gp.functional.dropout(x, 1.0, seed=1)
    assert y1.shape == x.shape and not np.any(f64(y1))
    assert not gp.to_host(gp.functional.dropout_mask((9,), 1.0, 3, device=device)).any()
    assert gp.to_host(gp.functional.dropout_mask((9,), 0.0, 3, device=device)).all()


def test_backward_consistency_with_forward(device):
    x = on(device, random((3, 5, 7), np.float32, seed=4, low=0.5, high=1.0))  # no zeros
    y = gp.functional.dropout(x, 0.4, seed=77, offset=5)
    mask = gp.functional.dropout_mask((3, 5, 7), 0.4, seed=77, offset=5, device=device)
    assert y.shape == (3, 5, 7) and mask.dtype == np.bool_
    np.testing.assert_array_equal(gp.to_host(y) != 0, gp.to_host(mask))
    dy = on(device, random((3, 5, 7), np.float32, seed=6))
    dx = gp.functional.dropout_backward(dy, 0.4, seed=77, offset=5)
    scale = np.float32(1 / 0.6)
    np.testing.assert_array_equal(gp.to_host(dx),
                                  np.where(gp.to_host(mask), gp.to_host(dy) * scale, 0))
    # the vector-Jacobian product: <dy, d(dropout)/dx . v> == <dropout_backward(dy), v>
    v = random((3, 5, 7), np.float64, seed=8)
    jv = gp.functional.dropout(on(device, v), 0.4, seed=77, offset=5)
    np.testing.assert_allclose(np.sum(f64(dy) * f64(jv)), np.sum(f64(dx) * v), rtol=1e-6)


@pytest.mark.parametrize("n", [0])
def test_empty(device, n):
    x = on(device, np.zeros((n,), np.float32))
    y = on(device, np.zeros((n,), np.float32))
    run_plan(gp.DropoutPlan, gp.DropoutDescriptor(n, 0.5), gp.DropoutArgs(x, y, 1), device)
    assert gp.functional.dropout(on(device, np.zeros((0, 5), gp.bfloat16)), 0.5, 1).shape == (0, 5)
    assert gp.functional.dropout_mask((3, 0), 0.5, 1, device=device).shape == (3, 0)


def test_descriptor_errors():
    s = gp.Stream.host()
    for p in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(gp.InvalidProblem, match="dropout: argument 'p'"):
            gp.DropoutPlan.select(s, gp.DropoutDescriptor(4, p))
    with pytest.raises(gp.InvalidProblem, match="dropout_mask: argument 'p'"):
        gp.DropoutMaskPlan.select(s, gp.DropoutMaskDescriptor(4, 2.0))
    with pytest.raises(gp.InvalidProblem, match="'n'"):
        gp.DropoutBackwardPlan.select(s, gp.DropoutBackwardDescriptor(-1, 0.5))
    with pytest.raises(gp.Unsupported, match="dtype"):
        gp.DropoutPlan.select(s, gp.DropoutDescriptor(4, 0.5, np.int32))
    with pytest.raises(gp.Unsupported, match="nvrtc requested"):
        gp.DropoutPlan.select(s, gp.DropoutDescriptor(4, 0.5),
                              gp.PlanPreference(backend=gp.BackendKind.NVRTC))


def test_argument_errors_leave_outputs_untouched(device):
    n = 12
    s = gp.Stream.host() if device == "cpu" else gp.Stream.current()
    x = on(device, random((n,), np.float32))
    y = on(device, np.full((n,), 9, np.float32))
    plan = gp.DropoutPlan.select(s, gp.DropoutDescriptor(n, 0.5, np.float32))

    def run(**kw):
        a = dict(x=x, y=y, seed=1, offset=0) | kw
        return lambda: plan.run(s, None, gp.DropoutArgs(**a))

    assert_rejected(run(x=x.astype(np.float16)), gp.Unsupported, [y], "dropout", "'x'", "f32",
                    "f16")
    assert_rejected(run(y=on(device, np.zeros((n - 1,), np.float32))), gp.BufferTooSmall, [y],
                    "'y'", "12", "11")
    assert_rejected(run(x=x.reshape(3, 4)), gp.InvalidProblem, [y], "'x'", "(12,)", "(3, 4)")
    assert_rejected(run(y=on(device, np.zeros((2 * n,), np.float32))[::2]), gp.InvalidProblem,
                    [y], "'y'", "contiguous")
    assert_rejected(run(y=x), gp.InvalidProblem, [x], "'y'", "distinct")
    assert_rejected(run(seed=-1), gp.InvalidProblem, [y], "'seed'", "2**64", "-1")
    assert_rejected(run(offset=2**64), gp.InvalidProblem, [y], "'offset'")
    assert_rejected(run(seed=1.5), gp.InvalidProblem, [y], "'seed'")
    mask = on(device, np.zeros((n,), np.bool_))
    mplan = gp.DropoutMaskPlan.select(s, gp.DropoutMaskDescriptor(n, 0.5))
    assert_rejected(lambda: mplan.run(s, None, gp.DropoutMaskArgs(mask.view(np.uint8), 1)),
                    gp.Unsupported, [mask], "'mask'", "bool", "uint8")
    if device == "cuda":
        assert_rejected(run(x=gp.to_host(x)), gp.InvalidProblem, [y], "'x'")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_declared_operands(device, dtype, backward):
    """check_plan: results against the reference, then every malformed operand the
    declaration implies rejected with nothing written."""
    n, p, seed, offset = 37, 0.3, 2**64 - 1, 2**64 - 5
    mask = dmod.keep_mask_host(n, p, seed, offset)
    src, dst = ("dy", "dx") if backward else ("x", "y")
    plan_cls = gp.DropoutBackwardPlan if backward else gp.DropoutPlan
    check_plan(plan_cls, gp.DropoutDescriptor(n, p, dtype),
               {src: random((n,), dtype, seed=5), "seed": seed, "offset": offset},
               lambda seed, offset, **a: {dst: ref_dropout(a[src], mask, p)}, device=device)
    check_plan(gp.DropoutMaskPlan, gp.DropoutMaskDescriptor(n, p), {"seed": seed},
               lambda seed, offset, mask: dmod.keep_mask_host(n, p, seed, offset),
               device=device, tolerance_dtype=np.float64)


def test_seed_and_offset_are_run_arguments(device, monkeypatch):
    """A new (seed, offset) every step is an args scalar: it never selects a new plan."""
    assert gp.DropoutBackwardDescriptor is gp.DropoutDescriptor
    for cls in (gp.DropoutDescriptor, gp.DropoutMaskDescriptor):
        assert not {"seed", "offset"} & {f.name for f in dataclasses.fields(cls)}
    made = []
    prepare = gp.DropoutPlan._prepare
    monkeypatch.setattr(gp.DropoutPlan, "_prepare", lambda plan: made.append(prepare(plan)))
    x = on(device, random((5, 7), np.float32))
    gp.functional.dropout(x, 0.25, seed=1)
    gp.functional.dropout_backward(x, 0.25, seed=1)
    made.clear()
    masks = [gp.to_host(gp.functional.dropout(x, 0.25, seed=s, offset=3 * s)) != 0
             for s in range(2, 6)]
    gp.functional.dropout_backward(x, 0.25, seed=9, offset=4)
    assert made == []  # every call reused the plans selected above
    assert all((a != b).any() for a, b in zip(masks, masks[1:], strict=False))  # new masks


def test_sku():
    plan = gp.DropoutPlan.select(gp.Stream.host(), gp.DropoutDescriptor(8, 0.5, gp.bfloat16))
    sku = plan.sku()
    assert (sku.op, sku.dtype, sku.backend) == ("dropout", "bf16", gp.BackendKind.NUMPY)
    assert plan.precision_guarantee().accumulator == "f32"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_device_misaligned_views_and_counter_wrap(dtype, accelerator):
    n, seed, offset = 4099, 3, 2**64 - 100  # counters wrap past 2**64 inside the launch
    x = random((n + 1,), dtype, seed=9)
    xd = gp.asarray(x, device=accelerator)[1:]  # one element off the vector alignment: scalar path
    y = gp.functional.dropout(xd, 0.25, seed, offset)
    host = gp.functional.dropout(x[1:], 0.25, seed, offset)
    # Bits equal on a GPU: one multiply per kept element (nothing for FMA contraction to
    # fuse), and normal inputs times 4/3 are never subnormal, so -ftz=true flushes nothing.
    np.testing.assert_array_equal(gp.to_host(y).view(np.uint8), host.view(np.uint8))
    m = gp.zeros(n + 1, np.bool_, device=accelerator)[1:]
    run_plan(gp.DropoutMaskPlan, gp.DropoutMaskDescriptor(n, 0.25),
             gp.DropoutMaskArgs(m, seed, offset), accelerator)
    np.testing.assert_array_equal(gp.to_host(m), dmod.keep_mask_host(n, 0.25, seed, offset))
    assert gp.DropoutPlan.select(gp.Stream.current(),
                                 gp.DropoutDescriptor(n, 0.25, dtype)).sku().variant == "philox"


@pytest.mark.gpu
def test_device_large_mask_bit_identical():
    n = (1 << 24) + (1 << 20) + 3  # more counters than one grid covers: grid-stride passes
    d = gp.functional.dropout_mask((n,), 0.37, seed=2**40 + 5, offset=7, device="cuda")
    np.testing.assert_array_equal(gp.to_host(d), dmod.keep_mask_host(n, 0.37, 2**40 + 5, 7))
