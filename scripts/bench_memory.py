"""Memory per rank: optimizer state with and without ZeRO-1, activations by --recompute mode.

Entry point only: the code is benchsuite/memory.py.
"""

import sys

from benchsuite.memory import main

if __name__ == "__main__":
    sys.exit(main())
