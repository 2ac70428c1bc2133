"""Text -> a token folder for scripts/train.py --data (nanoGPT's layout: train.bin, val.bin).

    python scripts/prepare_data.py notes.txt data/notes                 # byte-level ids
    python scripts/prepare_data.py corpus/ data/corpus --tokenizer tokenizer.json

`--help` lists the options. What runs is dist.trainer.prepare_data, imported from the
installed project (bash scripts/setup.sh, or pip install -e .).
"""

import sys

from dist.trainer.prepare_data import main

if __name__ == "__main__":
    sys.exit(main())
