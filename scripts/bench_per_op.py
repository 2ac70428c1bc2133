"""Time per recorded op against PyTorch eager, in one process (run with torch installed).

Entry point only: the code is benchsuite/per_op.py.
"""

import sys

from benchsuite.per_op import main

if __name__ == "__main__":
    sys.exit(main())
