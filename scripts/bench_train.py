"""A training step: ours eager and captured against PyTorch (eager, torch.compile).

Entry point only: the code is benchsuite/train_step.py.
"""

import sys

from benchsuite.train_step import main

if __name__ == "__main__":
    sys.exit(main())
