"""The tape: an ordered record of Function applications, and the backward walk over it.

A `Node` is one recorded application: the Function class, its ctx (saved arrays), where
each positional input's gradient goes (a leaf Tensor, a producer (Node, output index), or
None), and the shape/dtype of each output. Nodes carry a global sequence number, so
"reverse recording order" is well defined across tapes (a graph may use a tensor that an
older tape produced, e.g. a weight cast once per step and used by every micro-batch).
Backward frees only the nodes of the tape it runs on; nodes of other tapes pass
gradients through and stay until their own tape's backward.

Before a node's backward runs, the arrays its forward saved are checked against in-place
writes made since (autograd.inplace: one integer comparison when there were none); under
detect_anomaly the gradients it returns are checked for inf/nan (autograd.anomaly).

A leaf may carry post-accumulate hooks (`Tensor.register_post_accumulate_grad_hook`): each
runs once per backward, with the leaf, when its ``.grad`` is final for that backward: after
the last node of the walk that reads the leaf has run (a leaf given as a root with no reader:
right after its root gradient is added), and only when the leaf received a gradient in it.
Data parallelism starts a gradient bucket's reduction from them (dist.overlap). With no hook
registered anywhere the walk does no extra work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gpuplan as gp
from autograd import anomaly, inplace, tensor_base
from autograd.tensor_base import TensorBase
from gpuplan.dtypes import FLOAT_DTYPES, HALF_DTYPES

if TYPE_CHECKING:
    from autograd.tensor import Tensor

_sequence = inplace.clock  # node numbers and in-place writes share one clock

#: Attribute (in a leaf's __dict__) holding its post-accumulate hooks: {key: hook}.
HOOKS_ATTR = "_post_accumulate_grad_hooks"
_hooked_leaves = 0  # leaves with at least one hook: 0 keeps run_backward's walk as it was


class RemovableHandle:
    """What `register_post_accumulate_grad_hook` returns: ``remove()`` unregisters the hook
    (a second call does nothing)."""

    __slots__ = ("_tensor", "_key")

    def __init__(self, tensor: Any, key: int) -> None:
        self._tensor, self._key = tensor, key

    def remove(self) -> None:
        global _hooked_leaves
        t, self._tensor = self._tensor, None
        if t is None:
            return
        hooks = t.__dict__.get(HOOKS_ATTR)
        if hooks is not None and hooks.pop(self._key, None) is not None and not hooks:
            del t.__dict__[HOOKS_ATTR]
            _hooked_leaves -= 1


_hook_keys = iter(range(1 << 62))


def register_post_accumulate_grad_hook(t: Any, hook: Any) -> RemovableHandle:
    """Run ``hook(t)`` after each backward that accumulated a gradient into leaf `t`, once
    its ``.grad`` holds every contribution of that backward (see the module docstring)."""
    global _hooked_leaves
    if not callable(hook):
        raise TypeError(f"register_post_accumulate_grad_hook: hook: expected a callable, "
                        f"given {type(hook).__name__}")
    if t._node is not None or not t.requires_grad:
        raise RuntimeError("register_post_accumulate_grad_hook: expected a leaf tensor that "
                           "requires grad, given "
                           + ("a non-leaf" if t._node is not None
                              else "a tensor with requires_grad=False"))
    hooks = t.__dict__.get(HOOKS_ATTR)
    if hooks is None:
        hooks = t.__dict__[HOOKS_ATTR] = {}
        _hooked_leaves += 1
    key = next(_hook_keys)
    hooks[key] = hook
    return RemovableHandle(t, key)


class Node:
    """One op on a tape. ``parents[i]``: None | leaf Tensor | (Node, output index)."""

    __slots__ = ("fn", "ctx", "parents", "out_meta", "grads", "seq", "tape", "freed")

    def __init__(self, fn: type, ctx: Any, parents: tuple, out_meta: tuple, tape: Tape) -> None:
        self.fn = fn
        self.ctx = ctx
        self.parents = parents
        self.out_meta = out_meta  # ((shape, dtype), ...) per output
        self.grads: list[Any] = [None] * len(out_meta)
        self.seq = next(_sequence)
        self.tape = tape
        self.freed = False

    def free(self) -> None:
        ctx = self.ctx
        if ctx is not None:
            ctx.saved = ()
        self.ctx = None
        self.parents = ()
        self.grads = [None] * len(self.out_meta)
        self.freed = True

    def __repr__(self) -> str:
        state = "freed" if self.freed else "live"
        return f"<Node {self.fn.__name__} #{self.seq} {state}>"


class Tape:
    """Context manager recording ops; ``tape.backward(loss, grad=None, retain=False)``.

    The innermost open tape records; with none open, the default tape records (it keeps
    no list of its nodes, so an unused graph dies with its tensors). Several tapes may be
    alive at once. After a backward (without ``retain``) the tape is freed: its saved
    arrays are released and a second backward raises RuntimeError. Entering a freed tape
    again starts a new recording.
    """

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.freed = False

    # -- recording ---------------------------------------------------------------------------

    def __enter__(self) -> Tape:
        if self.freed:
            self.nodes = []
            self.freed = False
        _open_tapes.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if _open_tapes and _open_tapes[-1] is self:
            _open_tapes.pop()
        else:
            _open_tapes.remove(self)

    def _record(self, node: Node) -> None:
        self.nodes.append(node)

    def __len__(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        return f"<Tape nodes={len(self.nodes)} freed={self.freed}>"

    # -- backward ----------------------------------------------------------------------------

    def backward(self, loss: Tensor, grad: Any = None, retain: bool = False) -> None:
        """Accumulate d(loss)/d(leaf) into every reachable leaf's ``.grad``.

        grad: the gradient of `loss` (array or Tensor of loss's shape); None means 1 and
        needs a one-element loss. retain=True keeps saved arrays for another backward.
        """
        if self.freed:
            raise RuntimeError("Tape.backward: this tape was already freed by a backward; "
                               "pass retain=True to the first backward to run it twice")
        node = loss._node
        if node is not None and node.tape is not self:
            raise RuntimeError(f"Tape.backward: the loss was recorded on {node.tape!r}, "
                               f"not on this tape {self!r}")
        run_backward([(loss, grad)], retain=retain, owner=self)
        if not retain:
            for n in self.nodes:
                n.free()
            self.nodes = []
            self.freed = self is not _default_tape


class _DefaultTape(Tape):
    """Records when no tape is open; holds no node list (graphs live through tensors)."""

    def _record(self, node: Node) -> None:
        pass

    def __repr__(self) -> str:
        return "<default Tape>"


_default_tape = _DefaultTape()
_open_tapes: list[Tape] = []


def current_tape() -> Tape:
    """The innermost open tape, or the default tape."""
    return _open_tapes[-1] if _open_tapes else _default_tape


def default_tape() -> Tape:
    return _default_tape


# -- the engine ------------------------------------------------------------------------------


def _root_grad(t: Tensor, grad: Any) -> Any:
    if grad is None:
        if t.data.size != 1:
            raise RuntimeError(f"backward: grad can be implicitly created only for a "
                               f"one-element output, given shape {tuple(t.shape)}; pass grad=")
        return gp.full(t.data.shape, 1.0, t.dtype, t.device)
    g = grad.data if isinstance(grad, TensorBase) else grad
    if tuple(g.shape) != tuple(t.data.shape):
        raise RuntimeError(f"backward: grad must have the output's shape "
                           f"{tuple(t.data.shape)}, given {tuple(g.shape)}")
    if g.dtype != t.dtype or gp.device_of(g) != t.device:
        g = gp.asarray(g, dtype=t.dtype, device=t.device)
    return g


def _check_grad(fn: type, i: int, g: Any, shape: tuple, dtype: Any) -> None:
    if tuple(g.shape) != shape:
        raise RuntimeError(f"{fn.__name__}.backward returned a gradient of shape "
                           f"{tuple(g.shape)} for input {i}; expected {shape}")
    if g.dtype != dtype and (dtype in FLOAT_DTYPES or g.dtype not in FLOAT_DTYPES):
        raise RuntimeError(f"{fn.__name__}.backward returned a gradient of dtype {g.dtype} "
                           f"for input {i}; expected {dtype}")


def _accumulate_leaf(t: Tensor, g: Any, delivered: set) -> None:
    if t.grad is None:
        # The optimizer and clip_grad_norm_ update .grad in place: never let it alias
        # another gradient or a view of one.
        if g.base is not None or id(g) in delivered:
            g = g.copy()
        t.grad = tensor_base.TENSOR_CLASS(g)
        if "_grad_acc" in t.__dict__:
            del t._grad_acc
    elif t.dtype in HALF_DTYPES:
        _accumulate_half(t, g)
    else:
        t.grad = tensor_base.TENSOR_CLASS(gp.functional.binary("add", t.grad.data, g))


def _accumulate_half(t: Tensor, g: Any) -> None:
    """A second (third, ...) gradient of an f16/bf16 leaf, e.g. of the next micro-batch,
    is added in float32 (Megatron's and nanotron's fp32 gradient accumulation): the leaf
    keeps the float32 running sum (``t._grad_acc``) beside ``t.grad``, its rounding, so the
    sum of k gradients is rounded once, not k - 1 times. The running sum is used while
    ``t.grad`` is the tensor it made, unwritten since (its ``_version``); after any other
    change to ``t.grad`` (an in-place write, a new tensor) the sum restarts from it."""
    f32 = gp.dtypes.float32
    grad = t.grad
    acc = t.__dict__.get("_grad_acc")
    total = acc[0] if acc is not None and acc[1] is grad and acc[2] == grad._version else \
        gp.functional.cast(grad.data, f32)
    total = gp.functional.binary("add", total, gp.functional.cast(g, f32))
    new = tensor_base.TENSOR_CLASS(gp.functional.cast(total, t.dtype))
    t.grad = new
    t._grad_acc = (total, new, new._version)


def run_backward(roots: list[tuple[Tensor, Any]], retain: bool = False,
                 owner: Tape | None = None) -> None:
    """Back-propagate from each (tensor, grad) root; frees the owner tape's nodes it runs."""
    delivered: set[int] = set()
    start: list[Node] = []
    hooked: dict[int, tuple] = {}  # id(leaf) -> (leaf, its .grad before this backward)
    if _hooked_leaves:
        for t, _ in roots:
            if t._node is None and HOOKS_ATTR in t.__dict__:
                hooked[id(t)] = (t, t.grad)
    for t, grad in roots:
        g = _root_grad(t, grad)
        delivered.add(id(g))
        node = t._node
        if node is None:
            if not t.requires_grad:
                raise RuntimeError("backward: the tensor does not require grad and has no "
                                   "recorded history")
            _accumulate_leaf(t, g, delivered)
            continue
        if node.freed:
            raise RuntimeError(_FREED)
        k = t._out_index
        node.grads[k] = g if node.grads[k] is None else gp.functional.binary(
            "add", node.grads[k], g)
        start.append(node)
    nodes = _reachable(start)
    if not _hooked_leaves:
        for node in nodes:
            _run_node(node, delivered)
            if not retain and node.tape is owner:
                node.free()
        return
    fire_at = _last_readers(nodes, hooked)
    _fire(fire_at.pop(-1, ()), hooked)  # root leaves that no node reads
    for i, node in enumerate(nodes):
        _run_node(node, delivered)
        if not retain and node.tape is owner:
            node.free()
        if i in fire_at:
            _fire(fire_at.pop(i), hooked)


def _last_readers(nodes: list[Node], hooked: dict[int, tuple]) -> dict[int, list]:
    """{position in `nodes` of the last node reading a hooked leaf: [those leaves]}, -1 for
    hooked root leaves that no node reads; records each newly met hooked leaf's current
    .grad in `hooked` (to tell whether this backward gave it a gradient)."""
    last: dict[int, int] = {key: -1 for key in hooked}
    for i, node in enumerate(nodes):
        for p in node.parents:
            if p is not None and type(p) is not tuple and HOOKS_ATTR in p.__dict__:
                key = id(p)
                if key not in hooked:
                    hooked[key] = (p, p.grad)
                last[key] = i
    fire_at: dict[int, list] = {}
    for key, i in last.items():
        fire_at.setdefault(i, []).append(key)
    return fire_at


def _fire(keys: Any, hooked: dict[int, tuple]) -> None:
    """Run the hooks of the leaves `keys` that received a gradient in this backward (every
    accumulation makes a new .grad tensor, so an unchanged .grad means none came)."""
    for key in keys:
        leaf, before = hooked[key]
        if leaf.grad is before:
            continue
        for hook in list(leaf.__dict__.get(HOOKS_ATTR, {}).values()):
            hook(leaf)


_FREED = ("backward: the graph reaches an op whose saved arrays were freed by an earlier "
          "backward (use retain=True on the first backward to go through it twice)")


def _reachable(start: list[Node]) -> list[Node]:
    """Nodes reachable from `start`, latest first (an iterative walk, no recursion)."""
    seen = {id(n): n for n in start}
    stack = list(start)
    while stack:
        node = stack.pop()
        if node.freed:
            raise RuntimeError(_FREED)
        for p in node.parents:
            if type(p) is tuple and id(p[0]) not in seen:
                seen[id(p[0])] = p[0]
                stack.append(p[0])
    return sorted(seen.values(), key=_seq_of, reverse=True)


def _seq_of(node: Node) -> int:
    return node.seq


def _run_node(node: Node, delivered: set) -> None:
    grads = node.grads
    node.grads = [None] * len(grads)
    present = [g for g in grads if g is not None]
    if not present:
        return
    if len(present) != len(grads):
        device = gp.device_of(present[0])
        grads = [g if g is not None else
                 gp.zeros(shape, dtype if dtype in FLOAT_DTYPES else present[0].dtype, device)
                 for g, (shape, dtype) in zip(grads, node.out_meta, strict=True)]
    if node.seq < inplace.last_write:
        inplace.check_saved(node)
    fn = node.fn
    result = fn.backward(node.ctx, *grads)
    if type(result) is not tuple:
        result = (result,)
    if anomaly._enabled:
        anomaly.on_backward(node, grads, result)
    parents = node.parents
    if len(result) != len(parents):
        raise RuntimeError(f"{fn.__name__}.backward returned {len(result)} gradients; "
                           f"expected {len(parents)} (one per positional input of forward)")
    for i, (p, g) in enumerate(zip(parents, result, strict=True)):
        if p is None or g is None:
            continue
        if isinstance(g, TensorBase):
            g = g.data
        if type(p) is tuple:
            producer, k = p
            _check_grad(fn, i, g, *producer.out_meta[k])
            delivered.add(id(g))
            old = producer.grads[k]
            producer.grads[k] = g if old is None else gp.functional.binary("add", old, g)
        else:
            _check_grad(fn, i, g, tuple(p.data.shape), p.dtype)
            _accumulate_leaf(p, g, delivered)
            delivered.add(id(g))
