#!/usr/bin/env bash
# The whole test suite on a fresh machine: set up .venv, ruff, import-linter, unit tests, the
# gpu-marked tests on the emulated device, the mpi tests under mpiexec -n 2 and -n 4, the kernel
# compile check (sm_80, sm_90), then every kernel instance executed on the emulated device.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export PYTHONHASHSEED=0 OMP_NUM_THREADS=1
# Bytecode caches on, whatever the environment says: with PYTHONDONTWRITEBYTECODE set, every
# pytest process (each xdist worker, each MPI rank) rewrites and compiles every test module
# again (~9 s of CPU a collection, ~4 s cached) and every launched train.py rank compiles the
# project's sources again. The caches go to the (git-ignored) __pycache__ folders; Python and
# pytest check them against each source's size and mtime, so an edited file is compiled anew.
unset PYTHONDONTWRITEBYTECODE
# The unit and emulated-device tests and the kernel compile check run in TEST_JOBS processes
# (default: the usable CPUs, at most 8: past that, worker start-up and memory outweigh the
# gain); TEST_JOBS=1 runs them in one. The mpi tests are ranks already.
jobs=${TEST_JOBS:-$(python -c 'import os; print(min(8, len(os.sched_getaffinity(0))))')}
case "$jobs" in ''|*[!0-9]*|0) echo "TEST_JOBS: a number of processes >= 1, given '$jobs'" >&2; exit 2 ;; esac
if [ "$jobs" -gt 1 ]; then xdist=(-n "$jobs" --dist worksteal); else xdist=(-p no:xdist); fi

echo "== lint: ruff check . (dist/ included: pyproject lists ruff's excludes itself) =="
python -m ruff check .
checked=$(python -m ruff check --show-files .)
grep -q "/dist/communicator.py" <<< "$checked" || {
    echo "ruff does not check dist/ (a default exclude came back?)" >&2; exit 1; }

echo "== lint: lint-imports (layers dist > autograd > gpuplan, no import cycles; pyproject.toml) =="
lint-imports

echo "== unit tests =="
python -m pytest -q -m "not mpi and not rehearsal" "${xdist[@]}" "$@"

echo "== gpu tests on the emulated device (GPUPLAN_DEVICE=emulated) =="
GPUPLAN_DEVICE=emulated python -m pytest -q -m "gpu and not mpi" "${xdist[@]}" "$@"

for n in 2 4; do
    echo "== mpi tests: mpiexec -n $n =="
    # Every rank runs the same mpi-marked tests; only rank 0 reports.
    mpiexec -n "$n" python -m mpi4py scripts/mpi_pytest.py -q -m mpi "$@"
done

echo "== kernel compile check =="
python scripts/check_kernels.py --quiet --jobs "$jobs"

echo "== every kernel instance on the emulated device =="
python scripts/check_kernels.py --execute --quiet --jobs "$jobs"

echo "== the GPU check, rehearsed on the emulated device (scripts/gpu_check.py --device emulated) =="
python -m pytest -q -m rehearsal -p no:xdist tests/benchsuite/test_gpu_check.py "$@"
