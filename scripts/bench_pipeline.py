"""Pipeline bubble: PipelineParallel's step time against (p-1)/(m+p-1) (under mpiexec).

Entry point only: the code is benchsuite/pipeline_bubble.py.
"""

import sys

from benchsuite.pipeline_bubble import main

if __name__ == "__main__":
    sys.exit(main())
