"""How a rank waits in a blocking MPI call: MPI's spinning, or tests with sleeps between.

MPICH's blocking calls (ch3 and ch4 alike) poll the network in a loop that never gives up
its core. With more ranks on a node than cores, a waiting rank's spin takes the core from
the rank it waits for: the 4-rank default job on 2 cores ran at about half the speed of one
process. Sleep-waiting (the non-blocking form of the call, tested with short sleeps) hands
the core over instead; docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from gpuplan.errors import Unsupported, describe

ENV_WAIT = "GPUPLAN_MPI_WAIT"
WAIT_MODES = ("auto", "spin", "sleep")
# The first pause is short, so a message already in flight costs little; pauses double up
# to the cap, which bounds the latency a long wait adds.
_FIRST_PAUSE, _MAX_PAUSE = 2e-5, 1e-3


def resolve_wait(requested: str | None = None) -> str:
    """How blocking MPI calls wait: the request, else $GPUPLAN_MPI_WAIT, else auto.

    "spin": MPI's own blocking calls (MPICH polls the network on the core, never sleeping).
    "sleep": the non-blocking form, tested with sleeps between tests (20 us doubling to
    1 ms), so that a waiting rank gives its core to a rank that computes. auto: "sleep" when
    the ranks on this node outnumber its cores (dist.launcher.oversubscribed), else "spin".
    """
    choice = requested if requested is not None else os.environ.get(ENV_WAIT) or "auto"
    if choice not in WAIT_MODES:
        raise Unsupported(describe("Communicator", ENV_WAIT, f"one of {WAIT_MODES}",
                                   repr(choice)))
    if choice == "auto":
        from dist.launcher import oversubscribed

        return "sleep" if oversubscribed() else "spin"
    return choice


def sleep_until(test: Callable[[], Any]) -> Any:
    """Call `test()` until it returns something true (returned), sleeping in between."""
    pause = _FIRST_PAUSE
    while not (done := test()):
        time.sleep(pause)
        pause = min(2 * pause, _MAX_PAUSE)
    return done
