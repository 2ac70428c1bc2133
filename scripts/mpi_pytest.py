"""Run pytest on every MPI rank; only rank 0 prints. Exit status is the worst over ranks.

Used as `mpiexec -n N python -m mpi4py scripts/mpi_pytest.py -m mpi` (the `-m mpi4py`
runner aborts the whole job if a rank dies with an uncaught exception).
"""

from __future__ import annotations

import os
import sys

import pytest
from mpi4py import MPI


def main() -> int:
    comm = MPI.COMM_WORLD
    args = sys.argv[1:]
    if comm.rank != 0:
        # (-p no:terminal would also remove -q/-v and make pytest reject them on this rank)
        args = [a for a in args if a not in ("-q", "-v")] + ["-qq"]
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - kept open for the run
    code = int(pytest.main(args))
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        code = 0
    worst = comm.allreduce(code, op=MPI.MAX)
    if comm.rank == 0 and worst != code:
        print(f"mpi_pytest: another rank failed (exit {worst})", flush=True)
    return worst


if __name__ == "__main__":
    sys.exit(main())
