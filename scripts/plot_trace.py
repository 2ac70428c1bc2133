"""Draw a train.py --trace file as a per-rank timeline (PNG).

Entry point only: the code is benchsuite/timeline.py.
"""

import sys

from benchsuite.timeline import main

if __name__ == "__main__":
    sys.exit(main())
