"""Kernel benchmarks: every case of every benchsuite/kernels/<family>.py on the GPU.

Entry point only: the code is benchsuite/kernel_bench.py.
"""

import sys

from benchsuite.kernel_bench import main

if __name__ == "__main__":
    sys.exit(main())
