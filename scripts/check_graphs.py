"""CUDA graph capture: a captured training step equals eager bit for bit; eager vs replay time.

Entry point only: the code is benchsuite/graph_check.py.
"""

import sys

from benchsuite.graph_check import main

if __name__ == "__main__":
    sys.exit(main())
