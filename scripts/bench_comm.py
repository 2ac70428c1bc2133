"""Collectives and send/recv through dist.Communicator against raw mpi4py (under mpiexec).

Entry point only: the code is benchsuite/comm.py.
"""

import sys

from benchsuite.comm import main

if __name__ == "__main__":
    sys.exit(main())
