"""The emulated device's warp-level PTX (ldmatrix, mma.sync m16n8k16) checked against the PTX
ISA fragment tables, written out here independently of gpuplan/ops/gemm/gemm.cu, and the clear
errors it gives for undefined behaviour (divergent or partial-mask warp collectives,
out-of-bounds stores, __trap, unknown PTX, a missing __syncthreads).

Every kernel is a small .cu source in this file, built by gpuplan.emulator.EmulatedModule.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.emulator import (
    DEVICE_ID,
    EmulatedModule,
    KernelFault,
    LaunchError,
    UnknownInstruction,
)

# -- helpers ------------------------------------------------------------------------------


def build(tmp_dir, filename: str, source: str, names: list[str]) -> EmulatedModule:
    path = tmp_dir / filename
    path.write_text(source)
    return EmulatedModule(path, names)


def dev(a: np.ndarray):
    out = gp.to_device(np.ascontiguousarray(a), "emulated")
    assert out.device.id == DEVICE_ID
    return out


def host(a) -> np.ndarray:
    return np.asarray(gp.to_host(a))


# -- a. ldmatrix --------------------------------------------------------------------------

#: Lane l supplies the address of row l % 8 of matrix l / 8; that row lives at row
#: PHYS(l) of the shared tile (a permutation, so the emulator must use every lane's address).
def phys_row(lane: int) -> int:
    return (7 * lane + 5) % 32


LDMATRIX_SRC = r"""
#include <stdint.h>

__device__ __forceinline__ int phys_row(int lane) { return (7 * lane + 5) & 31; }

// One warp. src: 32 rows of 8 b16 values (row p at src[8p .. 8p + 7]), copied to a shared
// tile; lane l gives the 16-byte row address of row l % 8 of matrix l / 8, which is tile row
// phys_row(l). out[4 * lane + j] = register j of the lane (0xdeadbeef where not loaded).
template <int NUM, bool TRANS>
__global__ void ldm(const unsigned short* __restrict__ src, unsigned* __restrict__ out) {
    __shared__ __align__(16) unsigned short tile[32 * 8];
    const int lane = threadIdx.x;
    for (int i = lane; i < 32 * 8; i += 32) tile[i] = src[i];
    __syncthreads();
    const unsigned addr =
        static_cast<unsigned>(__cvta_generic_to_shared(&tile[8 * phys_row(lane)]));
    unsigned r[4] = {0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu};
    if constexpr (NUM == 1 && !TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];"
                     : "=r"(r[0]) : "r"(addr));
    } else if constexpr (NUM == 1 && TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];"
                     : "=r"(r[0]) : "r"(addr));
    } else if constexpr (NUM == 2 && !TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
                     : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
    } else if constexpr (NUM == 2 && TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
                     : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
    } else if constexpr (NUM == 4 && !TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
    }
    for (int j = 0; j < 4; ++j) out[4 * lane + j] = r[j];
}
"""
LDMATRIX_CASES = [(num, trans) for num in (1, 2, 4) for trans in (False, True)]


def ldm_name(num: int, trans: bool) -> str:
    return f"ldm<{num}, {'true' if trans else 'false'}>"


@pytest.fixture(scope="module")
def ldmatrix_module(tmp_path_factory):
    return build(tmp_path_factory.mktemp("ldmatrix"), "ldmatrix_test.cu", LDMATRIX_SRC,
                 [ldm_name(n, t) for n, t in LDMATRIX_CASES])


def ldmatrix_expected(tile: np.ndarray, num: int, trans: bool) -> np.ndarray:
    """[32 lanes, num registers, 2 halves (low first)] by the PTX ISA table: matrix j is made
    of the rows addressed by lanes 8j..8j+7; lane t receives row t/4, elements 2(t%4) and
    2(t%4)+1 of matrix j, or of its transpose with .trans."""
    out = np.zeros((32, num, 2), dtype=np.uint16)
    for j in range(num):
        mat = tile[[phys_row(8 * j + r) for r in range(8)]]  # [8 rows, 8 elements]
        if trans:
            mat = mat.T
        for t in range(32):
            out[t, j, 0] = mat[t // 4, 2 * (t % 4)]
            out[t, j, 1] = mat[t // 4, 2 * (t % 4) + 1]
    return out


@pytest.mark.parametrize("num,trans", LDMATRIX_CASES,
                         ids=[f"x{n}{'-trans' if t else ''}" for n, t in LDMATRIX_CASES])
def test_ldmatrix_fragments(ldmatrix_module, num, trans):
    rng = np.random.default_rng(num * 2 + trans)
    tile = rng.choice(65536, size=(32, 8), replace=False).astype(np.uint16)  # distinct
    out = dev(np.zeros(32 * 4, dtype=np.uint32))
    ldmatrix_module.get_function(ldm_name(num, trans))((1,), (32,), (dev(tile), out))
    regs = host(out).reshape(32, 4)
    got = np.stack([regs[:, :num] & 0xFFFF, regs[:, :num] >> 16], axis=-1).astype(np.uint16)
    np.testing.assert_array_equal(got, ldmatrix_expected(tile, num, trans))
    assert np.all(regs[:, num:] == 0xDEADBEEF), "ldmatrix wrote registers it does not own"


# -- b. mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 ---------------------

MMA_SRC = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <type_traits>

// One warp: D = A B + C for A [16][16] (row major), B [16][8] (stored k-major: B[k * 8 + n]),
// C, D [16][8] f32. Every lane builds its fragments from global memory by the PTX ISA table
// (groupID = lane >> 2, tig = lane % 4), written out again here, not taken from gemm.cu.
template <typename T>
__global__ void mma16816(const T* __restrict__ A, const T* __restrict__ B,
                         const float* __restrict__ C, float* __restrict__ D) {
    const unsigned short* a16 = reinterpret_cast<const unsigned short*>(A);
    const unsigned short* b16 = reinterpret_cast<const unsigned short*>(B);
    const int lane = threadIdx.x, group = lane >> 2, tig = lane & 3;
    unsigned a[4] = {0u, 0u, 0u, 0u}, b[2] = {0u, 0u};
    float c[4], d[4];
    for (int i = 0; i < 8; ++i) {  // a_i: register i / 2, low half for even i
        const int row = group + 8 * ((i >> 1) & 1);
        const int col = tig * 2 + (i & 1) + 8 * (i >= 4);
        a[i / 2] |= static_cast<unsigned>(a16[row * 16 + col]) << (16 * (i & 1));
    }
    for (int i = 0; i < 4; ++i) {  // b_i: register i / 2
        const int k = tig * 2 + (i & 1) + 8 * (i >= 2), n = group;
        b[i / 2] |= static_cast<unsigned>(b16[k * 8 + n]) << (16 * (i & 1));
    }
    for (int i = 0; i < 4; ++i) c[i] = C[(group + 8 * (i >= 2)) * 8 + tig * 2 + (i & 1)];
    if constexpr (std::is_same<T, __half>::value) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                       "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                       "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
    }
    for (int i = 0; i < 4; ++i) D[(group + 8 * (i >= 2)) * 8 + tig * 2 + (i & 1)] = d[i];
}
"""
MMA_TYPES = {"f16": ("__half", np.float16), "bf16": ("__nv_bfloat16", gp.bfloat16)}


@pytest.fixture(scope="module")
def mma_module(tmp_path_factory):
    return build(tmp_path_factory.mktemp("mma"), "mma_test.cu", MMA_SRC,
                 [f"mma16816<{c}>" for c, _ in MMA_TYPES.values()])


def mma_operands(dtype, scaled: bool, seed: int):
    """A, B, C whose products and sums are exact in f32: multiples of 1/8 (and with `scaled`,
    powers of two that reach f16 subnormals / bf16's wide exponent range)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-8, 9, size=(16, 16)) / 8.0
    b = rng.integers(-8, 9, size=(16, 8)) / 8.0
    c = rng.integers(-32, 33, size=(16, 8)) / 8.0
    if scaled:
        sa, sb = (2.0**-20, 2.0**10) if dtype == np.float16 else (2.0**100, 2.0**-90)
        a, b = a * sa, b * sb
        c = c * sa * sb
    a16, b16 = a.astype(dtype), b.astype(dtype)
    assert np.array_equal(a16.astype(np.float64), a) and np.array_equal(b16.astype(np.float64), b)
    return a16, b16, c.astype(np.float32)


@pytest.mark.parametrize("scaled", [False, True], ids=["eighths", "scaled"])
@pytest.mark.parametrize("type_id", list(MMA_TYPES))
def test_mma_m16n8k16_fragments(mma_module, type_id, scaled):
    ctype, dtype = MMA_TYPES[type_id]
    a, b, c = mma_operands(dtype, scaled, seed=3 + scaled)
    d = dev(np.full((16, 8), np.nan, dtype=np.float32))
    mma_module.get_function(f"mma16816<{ctype}>")((1,), (32,), (dev(a), dev(b), dev(c), d))
    expected = a.astype(np.float64) @ b.astype(np.float64) + c.astype(np.float64)
    got = host(d).astype(np.float64)
    # Exact operands: the only rounding is the final one to f32, which these sums do not need.
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(got, expected)


# -- c. clear errors ----------------------------------------------------------------------

ERRORS_SRC = r"""
#include <stdint.h>

// Lane `skip` does not execute the shuffle the other 31 lanes execute.
__global__ void shfl_skip(const float* __restrict__ x, float* __restrict__ y, int skip) {
    const int t = threadIdx.x;
    float v = x[t];
    if (t != skip) v += __shfl_xor_sync(0xffffffffu, v, 1);
    y[t] = v;
}

// Lane `skip` does not execute the ldmatrix the other 31 lanes execute.
__global__ void ldmatrix_skip(unsigned* __restrict__ y, int skip) {
    __shared__ __align__(16) unsigned short tile[32 * 8];
    const int t = threadIdx.x;
    for (int i = t; i < 32 * 8; i += 32) tile[i] = static_cast<unsigned short>(i);
    __syncthreads();
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(&tile[8 * t]));
    unsigned r = 0;
    if (t != skip) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];"
                     : "=r"(r) : "r"(addr));
    }
    y[t] = r;
}

// A partial mask: the lower half-warp shuffles among itself.
__global__ void shfl_partial(const float* __restrict__ x, float* __restrict__ y) {
    const int t = threadIdx.x;
    float v = x[t];
    if (t < 16) v += __shfl_xor_sync(0x0000ffffu, v, 1);
    y[t] = v;
}

// The planted bug: i == n is one element past the end of y.
__global__ void store_le_n(float* __restrict__ y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) y[i] = 1.0f;
}

__global__ void trap_kernel(float* __restrict__ y) {
    if (threadIdx.x == 7) __trap();
    y[threadIdx.x] = 1.0f;
}

// Legal CUDA: every lane names its own source lane (a rotation of the warp).
__global__ void shfl_rotate(const float* __restrict__ x, float* __restrict__ y) {
    const int t = threadIdx.x;
    y[t] = __shfl_sync(0xffffffffu, x[t], (t + 1) & 31);
}

// Undefined behaviour: the two half-warps execute two different ldmatrix instructions
// (.aligned: every lane must execute the same one), even though their shapes agree.
__global__ void ldmatrix_two_sites(unsigned* __restrict__ y) {
    __shared__ __align__(16) unsigned short tile[32 * 8];
    const int t = threadIdx.x;
    for (int i = t; i < 32 * 8; i += 32) tile[i] = static_cast<unsigned short>(i);
    __syncthreads();
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(&tile[8 * t]));
    unsigned r = 0;
    if (t < 16) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];"
                     : "=r"(r) : "r"(addr));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];"
                     : "=r"(r) : "r"(addr));
    }
    y[t] = r;
}

// y[t] = x[(t + 1) % n] through shared memory; without SYNC thread t reads an element that
// thread t + 1 may not have written yet.
template <bool SYNC>
__global__ void rotate(const int* __restrict__ x, int* __restrict__ y, int n) {
    __shared__ int s[256];
    const int t = threadIdx.x;
    s[t] = x[t];
    if constexpr (SYNC) __syncthreads();
    y[t] = s[(t + 1) % n];
}
"""
ERROR_KERNELS = ["shfl_skip", "ldmatrix_skip", "shfl_partial", "store_le_n", "trap_kernel",
                 "shfl_rotate", "ldmatrix_two_sites", "rotate<true>", "rotate<false>"]


@pytest.fixture(scope="module")
def errors_module(tmp_path_factory):
    return build(tmp_path_factory.mktemp("errors"), "errors_test.cu", ERRORS_SRC,
                 ERROR_KERNELS)


def test_shfl_skipped_by_one_lane_faults(errors_module):
    x = dev(np.arange(32, dtype=np.float32))
    y = dev(np.zeros(32, dtype=np.float32))
    with pytest.raises(KernelFault) as info:
        errors_module.get_function("shfl_skip")((1,), (32,), (x, y, np.int32(5)))
    msg = str(info.value)
    assert "__shfl_xor_sync" in msg and "warp 0" in msg, msg
    assert re.search(r"lanes exited: 5\b", msg), msg  # names the lane that skipped it
    assert "every lane of the warp must execute it" in msg, msg


def test_ldmatrix_skipped_by_one_lane_faults(errors_module):
    y = dev(np.zeros(32, dtype=np.uint32))
    with pytest.raises(KernelFault) as info:
        errors_module.get_function("ldmatrix_skip")((1,), (32,), (y, np.int32(11)))
    msg = str(info.value)
    assert "ldmatrix" in msg and "warp 0" in msg, msg
    assert re.search(r"lanes exited: 11\b", msg), msg


def test_shfl_partial_mask_faults(errors_module):
    x = dev(np.arange(32, dtype=np.float32))
    y = dev(np.zeros(32, dtype=np.float32))
    with pytest.raises(KernelFault) as info:
        errors_module.get_function("shfl_partial")((1,), (32,), (x, y))
    msg = str(info.value)
    assert "mask" in msg and "0xffff" in msg and "__shfl_xor_sync" in msg, msg


def test_out_of_bounds_store_faults(errors_module):
    n = 100
    y = dev(np.zeros(n, dtype=np.float32))
    with pytest.raises(KernelFault) as info:
        errors_module.get_function("store_le_n")((1,), (128,), (y, np.int32(n)))
    msg = str(info.value)
    assert "out-of-bounds store" in msg, msg
    assert "past the end of argument 0" in msg, msg
    assert "thread (100,0,0)" in msg, msg  # the thread with i == n


def test_scalar_arguments_are_read_as_cupy_passes_them(errors_module):
    """CuPy stores a NumPy scalar at its own width in zeroed storage and a Python int as 8
    bytes: a narrower negative NumPy integer would reach a GPU kernel zero-extended, so the
    emulated device refuses it; non-negative narrower ones and wider in-range ones read as
    they would on a GPU."""
    store = errors_module.get_function("store_le_n")  # (float* y, int n): y[i] = 1, i <= n
    for n in (np.int16(3), np.int64(3), 3):
        y = dev(np.zeros(128, dtype=np.float32))
        store((1,), (128,), (y, n))
        np.testing.assert_array_equal(gp.to_host(y)[:6], [1, 1, 1, 1, 0, 0])
    with pytest.raises(LaunchError, match=r"argument 1: .*negative int16 scalar .*zero-extends"):
        store((1,), (128,), (dev(np.zeros(128, dtype=np.float32)), np.int16(-1)))
    with pytest.raises(LaunchError, match="does not fit"):
        store((1,), (128,), (dev(np.zeros(128, dtype=np.float32)), np.int64(2**40)))


def test_trap_faults(errors_module):
    y = dev(np.zeros(32, dtype=np.float32))
    with pytest.raises(KernelFault, match=r"__trap\(\)") as info:
        errors_module.get_function("trap_kernel")((1,), (32,), (y,))
    assert "thread (7,0,0)" in str(info.value)


def test_unknown_ptx_instruction_fails_the_build(tmp_path):
    src = (
        "__global__ void permute(const unsigned* __restrict__ x, unsigned* __restrict__ y) {\n"
        "    unsigned r;\n"
        '    asm volatile("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(x[0]), "r"(x[1]),\n'
        '                 "r"(0x3210u));\n'
        "    y[0] = r;\n"
        "}\n")
    with pytest.raises(UnknownInstruction) as info:
        build(tmp_path, "unknown_ptx.cu", src, ["permute"])
    msg = str(info.value)
    assert "prmt.b32" in msg and "unknown_ptx.cu:3" in msg, msg


def _rotate(module, sync: bool, x: np.ndarray) -> np.ndarray:
    y = dev(np.zeros(x.size, dtype=np.int32))
    module.get_function(f"rotate<{'true' if sync else 'false'}>")(
        (1,), (x.size,), (dev(x), y, np.int32(x.size)))
    return host(y)


def test_missing_syncthreads_is_a_race_fault(errors_module, monkeypatch):
    monkeypatch.delenv("GPUPLAN_EMULATOR_SEED", raising=False)
    x = np.random.default_rng(7).integers(1, 2**30, size=256).astype(np.int32)
    np.testing.assert_array_equal(_rotate(errors_module, True, x), np.roll(x, -1))
    with pytest.raises(KernelFault, match=r"shared-memory race: a load reads a byte .* wrote "
                                          r"it since the last __syncthreads"):
        _rotate(errors_module, False, x)


def test_missing_syncthreads_gives_a_wrong_result(errors_module, monkeypatch):
    """With the race check off, the schedule and the garbage still expose the bug."""
    monkeypatch.delenv("GPUPLAN_EMULATOR_SEED", raising=False)  # the default seed
    monkeypatch.setenv("GPUPLAN_EMULATOR_RACECHECK", "0")
    n = 256
    x = np.random.default_rng(7).integers(1, 2**30, size=n).astype(np.int32)
    expected = np.roll(x, -1)  # y[t] = x[(t + 1) % n]
    np.testing.assert_array_equal(_rotate(errors_module, True, x), expected)
    wrong = np.count_nonzero(_rotate(errors_module, False, x) != expected)
    assert wrong > 0, "the race without __syncthreads went unnoticed"


def test_shfl_sync_per_lane_source_lane(errors_module):
    x = np.arange(32, dtype=np.float32) * 3 + 1
    y = dev(np.zeros(32, dtype=np.float32))
    errors_module.get_function("shfl_rotate")((1,), (32,), (dev(x), y))
    np.testing.assert_array_equal(host(y), np.roll(x, -1))


def test_ldmatrix_at_two_sites_faults(errors_module):
    y = dev(np.zeros(32, dtype=np.uint32))
    with pytest.raises(KernelFault, match="ldmatrix"):
        errors_module.get_function("ldmatrix_two_sites")((1,), (32,), (y,))
