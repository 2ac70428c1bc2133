"""Autograd overhead: per-op latency, Python calls per op and per step, a GPT step.

Entry point only: the code is benchsuite/op_overhead.py.
"""

import sys

from benchsuite.op_overhead import main

if __name__ == "__main__":
    sys.exit(main())
