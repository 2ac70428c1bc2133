"""Function: an op with a forward on arrays and a backward by its local chain rule."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autograd import anomaly, grad_mode, tensor_base
from autograd.tape import Node, _default_tape, _open_tapes
from autograd.tensor_base import TensorBase

if TYPE_CHECKING:
    from autograd.tensor import Tensor


class Context:
    """Per-call scratch space shared by forward and backward.

    ``save_for_backward(*arrays)`` stores arrays in ``saved`` (released after backward;
    backward raises if one was written in place since, see autograd.inplace);
    ``needs_input_grad[i]`` says whether positional input i needs a gradient (all False
    when nothing is recorded); ``mark_non_differentiable(*arrays)`` marks outputs that get
    ``requires_grad=False`` (their gradient reaches backward as zeros). Any other
    attribute may be set freely.
    """

    saved: tuple = ()
    needs_input_grad: tuple = ()
    _non_differentiable: tuple = ()

    def save_for_backward(self, *arrays: Any) -> None:
        self.saved = arrays

    def mark_non_differentiable(self, *arrays: Any) -> None:
        self._non_differentiable = tuple(id(a) for a in arrays)


class Function:
    """Subclass with ``forward(ctx, *args, **kwargs)`` and ``backward(ctx, *grad_outputs)``.

    forward receives arrays where the caller passed Tensors (keyword arguments are
    options, passed through unchanged) and returns an array or a tuple of arrays.
    backward receives one gradient array per output (zeros for an output that got none)
    and returns one array or None per positional input of forward; each array must have
    its input's shape and dtype (integer inputs take a float gradient: straight-through).
    """

    @staticmethod
    def forward(ctx: Context, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    @staticmethod
    def backward(ctx: Context, *grad_outputs: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        """Run forward on the arrays; record a tape node when grad mode is on and some
        Tensor input requires grad. Returns a Tensor or a tuple of Tensors."""
        ctx = Context()
        if len(args) == 2 and isinstance(a := args[0], TensorBase) and isinstance(
                b := args[1], TensorBase):  # two tensors (binary ops, matmul): no lists
            arrays = [a.data, b.data]
            ra, rb = a.requires_grad, b.requires_grad
            record = (ra or rb) and grad_mode._enabled
            if record:
                ctx.needs_input_grad = (True if ra else False, True if rb else False)
                na, nb = a._node, b._node
                parents = ((a if na is None else (na, a._out_index)) if ra else None,
                           (b if nb is None else (nb, b._out_index)) if rb else None)
            else:
                ctx.needs_input_grad = (False, False)
        else:
            arrays = []
            parent_list = []
            needs = []
            record = False
            for a in args:
                if isinstance(a, TensorBase):
                    arrays.append(a.data)
                    if a.requires_grad:
                        record = True
                        needs.append(True)
                        node = a._node
                        parent_list.append(a if node is None else (node, a._out_index))
                        continue
                else:
                    arrays.append(a)
                needs.append(False)
                parent_list.append(None)
            record = record and grad_mode._enabled
            ctx.needs_input_grad = tuple(needs) if record else (False,) * len(args)
            parents = tuple(parent_list)
        out = cls.forward(ctx, *arrays, **kwargs)
        if record and ctx.saved and grad_mode._inference_used:
            for a in args:  # torch's rule: no inference tensor saved for backward
                if isinstance(a, TensorBase) and a._inference:
                    _check_inference_saved(cls, ctx.saved, a)
        if anomaly._enabled:
            anomaly.on_forward(cls, ctx, out, arrays)
        if type(out) is not tuple:  # one output (most ops), in line
            if not record:
                return tensor_base.TENSOR_CLASS(out)
            tape = _open_tapes[-1] if _open_tapes else _default_tape
            node = Node(cls, ctx, parents, ((out.shape, out.dtype),), tape)
            tape._record(node)
            t = tensor_base.TENSOR_CLASS(out, True)
            t._node = node
            return t
        if not record:
            return tuple(tensor_base.TENSOR_CLASS(o) for o in out)
        tape = _open_tapes[-1] if _open_tapes else _default_tape
        node = Node(cls, ctx, parents, tuple((o.shape, o.dtype) for o in out), tape)
        tape._record(node)
        skip = ctx._non_differentiable
        results = []
        for k, o in enumerate(out):
            t = tensor_base.TENSOR_CLASS(o)
            if id(o) not in skip:
                t.requires_grad = True
                t._node = node
                t._out_index = k
            results.append(t)
        return tuple(results)


_INFERENCE_SAVED = ("Inference tensors cannot be saved for backward. To work around you can "
                    "make a clone to get a normal tensor and use it in autograd.")


def _check_inference_saved(cls: type, saved: tuple, t: Tensor) -> None:
    """An op recorded for backward may not save the inference tensor `t` (made under
    inference_mode) or a view of its array; reading it in an op that saves nothing of it is
    fine (torch's rule). apply() calls this only when recording, for inference inputs."""
    d = t.data
    if any(s is d or getattr(s, "base", None) is d for s in saved):
        raise RuntimeError(f"{cls.__name__}: {_INFERENCE_SAVED}")
