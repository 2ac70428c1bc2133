"""The main job: train a GPT over MPI ranks (tensor x pipeline x data parallel).

    mpiexec -n 4 python -m mpi4py scripts/train.py          # defaults: tp=2, pp=2, stdlib corpus
    mpiexec -n 8 python -m mpi4py scripts/train.py --tp 2 --pp 2 --dp 2 --steps 500
    python scripts/train.py --data notes.txt --n-layer 4     # one process

`--help` lists the options. What runs is dist.trainer.main (its docstring: the layout rule,
the data, checkpoints and outputs), imported from the installed project (bash
scripts/setup.sh, or pip install -e .); the installed command is gpuplan-train.
"""

import sys

from dist.trainer.main import main

if __name__ == "__main__":
    sys.exit(main())
