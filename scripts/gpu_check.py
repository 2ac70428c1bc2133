"""The GPU check: one command on a lent GPU machine (no package registry, no install step).

    python3 scripts/gpu_check.py --budget 480 --out "$OUT"
    python3 scripts/gpu_check.py --device emulated --budget 240 --out /tmp/rehearsal

Entry point only: the code is the benchsuite.gpu_check package (docs/gpu_check.md).
"""

import sys
from pathlib import Path

# The one entry script that edits sys.path: on the lent machine nothing is installed, and
# the command must work from the checkout as it is.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchsuite.gpu_check import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
