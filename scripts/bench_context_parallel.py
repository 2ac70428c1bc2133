"""Context parallelism: activation memory per rank and step time at cp = 1 and cp = the world.

Entry point only: the code is benchsuite/context_parallel.py.
"""

import sys

from benchsuite.context_parallel import main

if __name__ == "__main__":
    sys.exit(main())
