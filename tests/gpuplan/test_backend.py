"""Device selection: CuPy is imported only when a CUDA device is asked for and a driver
exists; GPUPLAN_DEVICE=emulated makes the emulated device the device."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import gpuplan as gp

PROBE = """
import sys, numpy as np, gpuplan as gp, autograd, dist
world = dist.init()
x = gp.asarray(np.ones((2, 3), np.float32), device=gp.backend.default_device())
gp.functional.softmax(x)
gp.functional.matmul(x, x, trans_b=True)  # gemm asks about cuBLAS only with a GPU
print("cupy" in sys.modules, gp.backend.default_device(), world.backend, gp.Stream.current())
"""


def _probe(env_extra: dict[str, str]) -> list[str]:
    import os

    env = {**os.environ, **env_extra}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.skipif(gp.backend._cuda_driver_present(), reason="a CUDA driver is present")
def test_no_cupy_import_without_a_driver():
    imported, device, backend, stream = _probe({"GPUPLAN_DEVICE": ""})
    assert (imported, device, backend, stream) == ("False", "cpu", "mpi-host", "Stream.host()")


@pytest.mark.skipif(gp.backend._cuda_driver_present(), reason="a CUDA driver is present")
def test_emulated_default_device():
    imported, device, backend, stream = _probe({"GPUPLAN_DEVICE": "emulated"})
    assert (imported, device, backend, stream) == \
        ("False", "emulated", "mpi-host-staged", "Stream.emulated()")


def test_emulated_arrays_stay_on_the_emulated_device():
    x = gp.to_device(np.arange(6.0).reshape(2, 3), "emulated")
    assert gp.device_of(x) == "emulated" and gp.device_of(x * 2 + 1) == "emulated"
    assert gp.device_of(gp.backend.array_namespace(x).zeros(3)) == "emulated"
    assert gp.backend.data_ptr(gp.backend.array_namespace(x).empty(5)) % 256 == 0
    host = gp.to_host(x)
    assert type(host) is np.ndarray and not np.shares_memory(host, x)
    with pytest.raises(ValueError, match="device"):
        gp.backend.resolve_device("tpu")
