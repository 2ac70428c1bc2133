"""ZeRO-1's gradient reduce-scatter started during backward (`ZeroGradOverlap`).

`ZeroRedundancyOptimizer.reduce_gradients` sends each param group's flattened gradients in
rounds: round j of a group carries, for every rank r, elements [r * chunk + j, r * chunk + j
+ m) of the flat vector, so it needs the gradients of the parameters those ranges touch. Here
every parameter gets a post-accumulate gradient hook; after `arm()`, the backward that
follows starts a round (`Communicator.ireduce_scatter`) as soon as the gradients it needs
are final and every earlier round has started (last group first, its last round first, as
backward finishes the last parameters first; all ranks post the same collectives in the
same order; the order of the rounds changes no element's sum). Parameters whose gradients
change after the backward (`late`: a model's replicated copies, summed over their groups
first) never count as final: their rounds go last, started at `finish()`, which
`reduce_gradients` calls. The send buffers are laid out as the blocking path lays them and
the collective sums as the blocking one does, so the slices are the same bits.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from typing import Any

import numpy as np

import gpuplan as gp
from dist.grad_schedule import FinalGradientSchedule


class ZeroGradOverlap(FinalGradientSchedule):
    """The rounds of `ZeroRedundancyOptimizer.reduce_gradients` (of about `bucket_bytes`),
    started from the hooks of the backward after `arm()`; see the module doc. Arm it only
    before the backward of the last micro-batch of a step."""

    def __init__(self, zero: Any, late: Iterable[Any] = (), bucket_bytes: int = 0) -> None:
        self.zero, self.comm, self.bucket_bytes = zero, zero.comm, bucket_bytes
        late_ids = {id(p) for p in late}
        #: (group index, start j in the slice, length m, parameter ids it needs)
        self.rounds: list[tuple[int, int, int, list[int]]] = []
        # Last group's last round first: backward finishes the last parameters first.
        for gi, lay in reversed(list(enumerate(zero._layouts))):
            if not lay.total:
                continue
            per = max(1, bucket_bytes // (zero.size * lay.dtype.itemsize))
            for j in reversed(range(0, lay.chunk, per)):
                m = min(per, lay.chunk - j)
                needs: set[int] = set()
                for r in range(zero.size):
                    lo, hi = r * lay.chunk + j, r * lay.chunk + j + m
                    for i in range(max(0, bisect_right(lay.offsets, lo) - 1), len(lay.params)):
                        if lay.offsets[i] >= hi:
                            break
                        if lay.numels[i] and lay.offsets[i] + lay.numels[i] > lo:
                            needs.add(id(lay.params[i]))
                self.rounds.append((gi, j, m, sorted(needs)))
        # The rounds that need a late gradient go last (the dp ranks hold the same copies:
        # one order on all of them); the hooks never start them.
        ordered = sorted(range(len(self.rounds)), key=lambda k: any(
            key in late_ids for key in self.rounds[k][3]))
        self.rounds = [self.rounds[k] for k in ordered]
        late = [k for k, (_, _, _, needs) in enumerate(self.rounds)
                if any(key in late_ids for key in needs)]
        self._schedule([p for lay in zero._layouts for p in lay.params],
                       [[key for key in needs if key not in late_ids]
                        for _, _, _, needs in self.rounds], late)
        self._outs: list[Any] = []

    def started_rounds(self) -> int:
        """How many rounds have been started since `arm()` (or the last `finish`)."""
        return len(self._requests)

    def arm(self) -> None:
        """Start rounds from the hooks of the next backward (a second call before `finish`
        does nothing)."""
        if self._arm("reduce_gradients()"):
            self._outs = self._new_outs()

    def _start(self, k: int) -> Any:
        gi, j, m, _ = self.rounds[k]
        lay = self.zero._layouts[gi]
        arrays = [None if p.grad is None else p.grad.data for p in lay.params]
        send = gp.empty((self.zero.size * m,), lay.dtype, device=lay.device)
        for r in range(self.zero.size):
            at = r * lay.chunk + j
            lay.copy_range(arrays, at, at + m, send[r * m:(r + 1) * m])
        return self.comm.ireduce_scatter(send, "mean", out=self._outs[gi][j:j + m])

    def finish(self) -> tuple[list[Any], list[list[bool]]]:
        """Start the rounds not started yet, then (all rounds posted on every rank, in one
        order) find which parameters have a gradient on any rank (`has_gradient_flags`),
        and wait for all. Returns per group this rank's slice of the averaged gradients
        (None for a group where no parameter has one anywhere) and those flags."""
        if not self._outs:
            self._outs = self._new_outs()
        requests = self._start_rest()
        present = has_gradient_flags(self.zero)
        for request in requests:
            request.wait()
        outs, self._outs = self._outs, []
        return [out if out is not None and any(has) else None
                for out, has in zip(outs, present, strict=True)], present

    def _new_outs(self) -> list[Any]:
        return [None if not lay.total else gp.empty((lay.chunk,), lay.dtype, device=lay.device)
                for lay in self.zero._layouts]

    def remove(self) -> None:
        """Take the hooks off the parameters (after waiting for what is pending)."""
        for request in self._requests:
            request.wait()
        self._requests, self._tested, self.armed = [], 0, False
        self._remove_hooks()


def has_gradient_flags(zero: Any) -> list[list[bool]]:
    """Per group, per parameter: whether it has a ``.grad`` on any data-parallel rank (one
    all-reduce of flags over the optimizer's communicator)."""
    every = [p for lay in zero._layouts for p in lay.params]
    has = np.array([p.grad is not None for p in every], np.int32)
    if zero.size > 1:
        has = zero.comm.all_reduce(has, "max")
    flags = iter(bool(f) for f in has)
    return [[next(flags) for _ in lay.params] for lay in zero._layouts]
