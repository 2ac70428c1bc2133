"""Kernel compile check (NVRTC, sm_80/sm_90, registers, spills); with --execute, every kernel
instance against its float64 reference on the emulated device (or --device cuda).

Entry point only: the code is benchsuite/kernel_check.py.
"""

import sys

from benchsuite.kernel_check import main

if __name__ == "__main__":
    sys.exit(main())
