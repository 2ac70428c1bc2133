"""How a rank waits in a blocking MPI call: MPI's own spin, or tests that yield or sleep.

MPICH's blocking calls (ch3 and ch4 alike) poll the network in a loop that never gives up
its core. With more ranks on a node than cores, a waiting rank's spin takes the core from
the rank it waits for. The other modes run the non-blocking form of the call and test it:
"yield" calls sched_yield() between tests (the core goes to a runnable rank at once, and the
waiting rank is back as soon as that one blocks), "sleep" sleeps between tests. On the
2-core machine, 4 ranks: yield was the fastest both idle and under load; a 1 ms sleep cap
was 2x slower than spinning when idle (docs/benchmarks.md has the figures).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from gpuplan.errors import Unsupported, describe

ENV_WAIT = "GPUPLAN_MPI_WAIT"
WAIT_MODES = ("auto", "spin", "yield", "sleep")
#: Modes that run the non-blocking form of a call and test it (see Communicator._wait).
POLLING_MODES = ("yield", "sleep")
# "sleep": the first pause is short, so a message already in flight costs little; pauses
# double up to the cap, which bounds the latency a long wait adds.
_FIRST_PAUSE, _MAX_PAUSE = 2e-5, 1e-4


def resolve_wait(requested: str | None = None) -> str:
    """How blocking MPI calls wait: the request, else $GPUPLAN_MPI_WAIT, else auto.

    "spin": MPI's own blocking calls. "yield": the non-blocking form, tested with
    sched_yield() between tests. "sleep": tested with sleeps between tests (20 us doubling
    to 0.1 ms). auto: "yield" when the ranks on this node outnumber its cores
    (gpuplan.launcher.oversubscribed), else "spin".
    """
    choice = requested if requested is not None else os.environ.get(ENV_WAIT) or "auto"
    if choice not in WAIT_MODES:
        raise Unsupported(describe("Communicator", ENV_WAIT, f"one of {WAIT_MODES}",
                                   repr(choice)))
    if choice == "auto":
        from gpuplan.launcher import oversubscribed

        return "yield" if oversubscribed() else "spin"
    return choice


def poll_until(test: Callable[[], Any], mode: str = "yield") -> Any:
    """Call `test()` until it returns something true (returned), yielding the core
    (mode "yield") or sleeping (mode "sleep") in between."""
    pause = _FIRST_PAUSE
    while not (done := test()):
        if mode == "yield":
            os.sched_yield()
        else:
            time.sleep(pause)
            pause = min(2 * pause, _MAX_PAUSE)
    return done
