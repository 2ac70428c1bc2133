"""The emulated device faults on a misaligned access as a GPU does: a 16-byte vector load or
store (float4, a 16-byte pack), an 8-byte double and a 4-byte float, in global and in shared
memory, each only when its address is not a multiple of its size; x86 would read it silently.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.emulator import EmulatedModule, KernelFault

SRC = r"""
// y[0] = the sum of the 4 floats read as one float4 at x + offset (floats).
__global__ void load4(const float* __restrict__ x, float* __restrict__ y, int offset) {
    const float4 v = *reinterpret_cast<const float4*>(x + offset);
    y[0] = v.x + v.y + v.z + v.w;
}

// One float4 stored at y + offset (floats).
__global__ void store4(float* __restrict__ y, int offset) {
    *reinterpret_cast<float4*>(y + offset) = make_float4(1.f, 2.f, 3.f, 4.f);
}

// y[0] = the double read at x + offset bytes.
__global__ void load_double(const char* __restrict__ x, double* __restrict__ y, int offset) {
    y[0] = *reinterpret_cast<const double*>(x + offset);
}

// y[0] = the float read at x + offset bytes.
__global__ void load_float(const char* __restrict__ x, float* __restrict__ y, int offset) {
    y[0] = *reinterpret_cast<const float*>(x + offset);
}

// A float4 read from shared memory at tile + offset (floats).
__global__ void shared4(float* __restrict__ y, int offset) {
    __shared__ __align__(16) float tile[16];
    for (int i = 0; i < 16; ++i) tile[i] = float(i);
    const float4 v = *reinterpret_cast<const float4*>(tile + offset);
    y[0] = v.x + v.y + v.z + v.w;
}
"""
KERNELS = ["load4", "store4", "load_double", "load_float", "shared4"]


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    path = tmp_path_factory.mktemp("alignment") / "alignment_test.cu"
    path.write_text(SRC)
    return EmulatedModule(path, KERNELS)


def dev(a: np.ndarray):
    return gp.to_device(np.ascontiguousarray(a), "emulated")


def run(module, name: str, *args) -> None:
    module.get_function(name)((1,), (1,), args)


def test_aligned_vector_accesses_run(module):
    x, y = dev(np.arange(16, dtype=np.float32)), dev(np.zeros(16, dtype=np.float32))
    run(module, "load4", x, y, np.int32(4))
    assert gp.to_host(y)[0] == 4 + 5 + 6 + 7
    run(module, "store4", y, np.int32(8))
    assert list(gp.to_host(y)[8:12]) == [1, 2, 3, 4]
    run(module, "shared4", y, np.int32(12))
    assert gp.to_host(y)[0] == 12 + 13 + 14 + 15


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_misaligned_float4_load_faults(module, offset):
    x, y = dev(np.arange(16, dtype=np.float32)), dev(np.zeros(1, dtype=np.float32))
    with pytest.raises(KernelFault) as info:
        run(module, "load4", x, y, np.int32(offset))
    msg = str(info.value)
    assert "misaligned address: " in msg and "float4" in msg, msg
    assert "16-byte alignment" in msg and "alignment_test.cu:" in msg, msg  # type and line


def test_misaligned_float4_store_faults(module):
    y = dev(np.zeros(16, dtype=np.float32))
    with pytest.raises(KernelFault, match="misaligned address: .* 16-byte"):
        run(module, "store4", y, np.int32(2))
    assert not gp.to_host(y).any()  # nothing was written


def test_misaligned_shared_float4_faults(module):
    y = dev(np.zeros(1, dtype=np.float32))
    with pytest.raises(KernelFault, match=r"misaligned address: .*float4.* 16-byte"):
        run(module, "shared4", y, np.int32(1))


@pytest.mark.parametrize("offset, faults", [(0, False), (8, False), (4, True), (1, True)])
def test_double_needs_8_byte_alignment(module, offset, faults):
    x, y = dev(np.zeros(32, dtype=np.uint8)), dev(np.zeros(1, dtype=np.float64))
    if faults:
        with pytest.raises(KernelFault, match="misaligned address: load of .*double.* 8-byte"):
            run(module, "load_double", x, y, np.int32(offset))
    else:
        run(module, "load_double", x, y, np.int32(offset))


@pytest.mark.parametrize("offset, faults", [(4, False), (2, True)])
def test_float_needs_4_byte_alignment(module, offset, faults):
    x, y = dev(np.zeros(32, dtype=np.uint8)), dev(np.zeros(1, dtype=np.float32))
    if faults:
        with pytest.raises(KernelFault, match="misaligned address: load of .*float.* 4-byte"):
            run(module, "load_float", x, y, np.int32(offset))
    else:
        run(module, "load_float", x, y, np.int32(offset))
