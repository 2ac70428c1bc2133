"""Collectives started during backward, in one order on every rank, as gradients become final.

`FinalGradientSchedule` is what `OverlappedGradReducer` (dist.data_parallel) and ZeRO's
`ZeroGradOverlap` (dist.zero_overlap) share: a list of units (a bucket, a round), each
needing the final gradients of some parameters. Every such parameter gets a post-accumulate
gradient hook (`Tensor.register_post_accumulate_grad_hook`); after `_arm()`, the backward
that follows starts unit k (the subclass's `_start(k)`, which returns the non-blocking
request) as soon as every parameter it needs has its final gradient and units 0..k-1 have
started, so all ranks post the same collectives in the same order. Units marked `never`
wait for `_start_rest()` (their gradients change after backward). Arm only before the
backward of the last micro-batch of a step: a later change to a gradient already sent is
lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


class FinalGradientSchedule:
    """Units started in order from the hooks of the backward after `_arm()`; see the module
    doc. A subclass calls `_schedule` once and implements `_start(k) -> request`."""

    def _schedule(self, params: Iterable[Any], needs: Sequence[Iterable[int]],
                  never: Iterable[int] = ()) -> None:
        """Unit k needs the parameters whose ids are in needs[k]; the units in `never`
        are not started by the hooks. Hooks go on the parameters some unit needs."""
        self._units_of: dict[int, list[int]] = {}
        counts = []
        for k, ids in enumerate(needs):
            ids = set(ids)
            counts.append(len(ids))
            for key in ids:
                self._units_of.setdefault(key, []).append(k)
        for k in never:
            counts[k] += 1  # never reaches zero in backward
        self._counts = counts
        self._handles = [p.register_post_accumulate_grad_hook(self._on_final)
                         for p in params if id(p) in self._units_of]
        self.armed = False
        self._missing: list[int] = []
        self._seen: set[int] = set()
        self._requests: list[Any] = []
        self._tested = 0  # started requests known to be complete

    def _start(self, k: int) -> Any:
        raise NotImplementedError

    @property
    def pending(self) -> bool:
        """Armed, or with units started and not yet finished."""
        return self.armed or bool(self._requests)

    def _arm(self, finish_call: str) -> bool:
        """Arm for the next backward; False (nothing done) when armed already or without
        units. Refused while the previous step's units are unfinished."""
        if self.armed or not self._counts:
            return False
        if self._requests:
            raise RuntimeError(f"{type(self).__name__}.arm: the previous step's reduction is "
                               f"not finished; call {finish_call} first")
        self._missing = list(self._counts)
        self._seen = set()
        self.armed = True
        return True

    def _on_final(self, p: Any) -> None:
        key = id(p)
        if not self.armed or key in self._seen:
            return
        self._seen.add(key)
        missing = self._missing
        for k in self._units_of[key]:
            missing[k] -= 1
        nxt = len(self._requests)
        while nxt < len(missing) and missing[nxt] == 0:
            self._requests.append(self._start(nxt))
            nxt += 1
        # Without an asynchronous progress thread MPI moves a non-blocking collective only
        # inside MPI calls: backward tests the oldest unfinished one at each final gradient.
        for request in self._requests[self._tested:]:
            if not request.test():
                return
            self._tested += 1

    def _start_rest(self) -> list[Any]:
        """Disarm, start the units not started yet, and hand over every request (in unit
        order) for the caller to wait for."""
        self.armed = False
        for k in range(len(self._requests), len(self._counts)):
            self._requests.append(self._start(k))
        requests, self._requests, self._tested = self._requests, [], 0
        return requests

    def _remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
