"""Export the consolidated model of a checkpoint of any layout, in one process.

    python scripts/export.py --checkpoint runs/default/checkpoint --out model.safetensors
    python scripts/export.py --checkpoint runs/x/checkpoint/step_000200 --gpt2 gpt2-out/

`--help` lists the options. What runs is dist.trainer.export, imported from the installed
project (bash scripts/setup.sh, or pip install -e .); the installed command is gpuplan-export.
"""

import sys

from dist.trainer.export import main

if __name__ == "__main__":
    sys.exit(main())
