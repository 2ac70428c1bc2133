"""Sample text from a checkpoint written by scripts/train.py, in one process.

    python scripts/generate.py                                  # runs/default/checkpoint
    python scripts/generate.py --checkpoint runs/x/checkpoint --prompt "import " --tokens 400

`--help` lists the options. What runs is dist.trainer.generate, imported from the installed
project (bash scripts/setup.sh, or pip install -e .); the installed command is gpuplan-generate.
"""

import sys

from dist.trainer.generate import main

if __name__ == "__main__":
    sys.exit(main())
