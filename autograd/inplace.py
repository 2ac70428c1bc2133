"""In-place writes, and the check that backward runs on arrays as they were at forward.

A Function's backward reads what its forward saved (``ctx.save_for_backward``). If one of
those arrays is overwritten in between (``x.zero_()`` on an input, an optimizer step on a
weight), backward would compute a silently wrong gradient. So every in-place operation
the Tensor API offers calls `record_write`, which stamps the written *storage* with the
clock that also numbers tape nodes (``Node.seq``); before a node's backward runs,
`check_saved` looks up the storage of each saved array and raises when it was written
after the node was recorded.

- Storage, as PyTorch's version counter shared by views: an array's storage is the end
  of its ``.base`` chain, so a write through any view (``x.reshape(4, 2).zero_()``)
  reaches every array saved from the same memory.
- Cost: nothing in forward; in backward one integer comparison per node (nodes recorded
  after the latest write, e.g. after the optimizer step, skip the look-up).
- Not seen: raw writes into an array (``t.data[...] = v``, NumPy/CuPy calls on
  ``t.data``): ``Tensor.data`` is an escape hatch, as in PyTorch. Assigning a new array
  (``t.data = a``) is no write at all: saved arrays keep what forward saw, so backward
  stays correct and does not raise.
- Entries are keyed by ``id(storage)``. A stale entry (its storage freed, the id reused)
  never raises: it is older than the new storage, hence than every node that saved it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from autograd import anomaly

#: One clock for tape nodes (``Node.seq``) and in-place writes.
clock = itertools.count()
#: Clock value of the latest recorded write (-1: none yet).
last_write = -1
#: id(storage) -> (clock value, what wrote, shape written, Tensor version, write site) of
#: its latest write; beyond _MAX_STORAGES entries the oldest are forgotten.
_writes: dict[int, tuple] = {}
_MAX_STORAGES = 4096


def storage_of(a: Any) -> Any:
    """The object owning `a`'s memory: the end of its ``.base`` chain (`a` itself if none)."""
    while True:
        b = getattr(a, "base", None)
        if b is None:
            return a
        a = b


def record_write(t: Any, what: str) -> None:
    """Note that `what` (e.g. ``"Tensor.zero_()"``) wrote Tensor `t`'s array in place: bump
    ``t._version`` and stamp its storage. Call it for every in-place write the API makes."""
    record_writes((t,), what)


def record_writes(tensors: Iterable[Any], what: str) -> None:
    """`record_write` for each of `tensors` (one call for an optimizer step)."""
    global last_write
    site = anomaly.user_site(anomaly.capture_stack(2)) if anomaly._enabled else None
    for t in tensors:
        t._version += 1
        last_write = seq = next(clock)
        a = t.data
        _writes[id(storage_of(a))] = (seq, what, a.shape, t._version, site)
    if len(_writes) > _MAX_STORAGES:
        _evict_oldest()


def _evict_oldest() -> None:
    """Forget the quarter of the storages written longest ago (their stamps can only
    matter to nodes older than all those writes)."""
    by_age = sorted(_writes, key=lambda k: _writes[k][0])
    for key in by_age[:_MAX_STORAGES // 4]:
        del _writes[key]


def check_saved(node: Any) -> None:
    """Raise RuntimeError if an array `node`'s forward saved was written after the node
    was recorded (call only when ``node.seq < last_write``)."""
    seq = node.seq
    for j, s in enumerate(node.ctx.saved):
        if not hasattr(s, "shape"):
            continue
        entry = _writes.get(id(storage_of(s)))
        if entry is not None and entry[0] > seq:
            raise RuntimeError(_message(node, j, s, entry))


def _message(node: Any, j: int, saved: Any, entry: tuple) -> str:
    _, what, shape, version, write_site = entry
    which = f"saved array {j}"
    storage = storage_of(saved)
    for i, p in enumerate(node.parents):
        if hasattr(p, "data") and storage_of(p.data) is storage:
            which = f"input {i}"
            break
    by = f"{what} on a tensor of shape {shape}, now at version {version}"
    if write_site:
        by += f", at {write_site}"
    stack = getattr(node.ctx, "_anomaly_stack", None)
    where = (f"The op was created at {anomaly.user_site(stack)}." if stack else
             "Run the forward under autograd.detect_anomaly() to see where the op was "
             "created and where the tensor was modified.")
    return (f"autograd: {anomaly.op_name(node.fn, node.ctx)} needs {which} (shape "
            f"{tuple(saved.shape)}, {saved.dtype}) as it was at forward, but it was "
            f"modified in place after the op was recorded ({by}): backward would compute a "
            f"silently wrong gradient. {where} Modify it after backward, or give the op a "
            f"copy.")
