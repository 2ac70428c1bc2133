"""Data-parallel step time with the gradient reduction overlapped with backward and not.

Entry point only: the code is benchsuite/overlap.py.
"""

import sys

from benchsuite.overlap import main

if __name__ == "__main__":
    sys.exit(main())
