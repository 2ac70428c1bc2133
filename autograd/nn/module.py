"""Module tree: Parameter, Module (registration, state_dict, to, train/eval), containers."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

import gpuplan as gp
from autograd.inplace import record_write
from autograd.tensor import Tensor


class Parameter(Tensor):
    """A leaf Tensor that a Module registers as trainable (``requires_grad=True``)."""

    def __init__(self, data: Any, requires_grad: bool = True) -> None:
        if isinstance(data, Tensor):
            data = data.data
        super().__init__(data, requires_grad=requires_grad)

    def __repr__(self) -> str:
        return f"Parameter(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"


class IncompatibleKeys(NamedTuple):
    missing_keys: list[str]
    unexpected_keys: list[str]


class Module:
    """Base class: attributes that are Parameters, Modules or buffers are registered in
    assignment order, which fixes the order of ``named_parameters`` and ``state_dict``;
    assigning a new Parameter (Module) to a registered name keeps that name's place."""

    #: Parameters this class stores transposed relative to PyTorch (``Linear.weight`` is
    #: [in, out]); ``()``: same layout as torch; None: unknown, so load_state_dict(...,
    #: layout="torch") refuses a module of this class holding parameters of 2 or more dims.
    _torch_transposed: tuple[str, ...] | None = None

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # -- registration -------------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}: call Module.__init__() before "
                                 f"assigning attribute {name!r}")
        if name in self._buffers and not isinstance(value, (Parameter, Module)):
            self._buffers[name] = value
            object.__setattr__(self, name, value)
            return
        target = (self._parameters if isinstance(value, Parameter) else
                  self._modules if isinstance(value, Module) else None)
        for table in (self._parameters, self._buffers, self._modules):
            if table is not target:
                table.pop(name, None)
        if target is not None:
            target[name] = value  # replacing a registered entry keeps its place (PyTorch)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        for table in (self._parameters, self._buffers, self._modules):
            table.pop(name, None)
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Register (or, with None, declare absent: e.g. ``bias=False``) a parameter."""
        if param is None:
            self._parameters.pop(name, None)
            object.__setattr__(self, name, None)
        else:
            setattr(self, name, param)

    def register_buffer(self, name: str, tensor: Any, persistent: bool = True) -> None:
        """A non-trainable Tensor or array (or None) moved and cast by ``to``; in
        ``state_dict`` unless ``persistent=False``. Reassigning the attribute later keeps
        it a buffer."""
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"register_buffer: name must be a non-empty string without '.', "
                           f"given {name!r}")
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"register_buffer: attribute {name!r} already exists")
        if tensor is not None and not hasattr(tensor, "shape"):
            raise TypeError(f"register_buffer: {name!r} must be a Tensor, an array or None, "
                            f"given {type(tensor).__name__}")
        setattr(self, name, tensor)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)

    def add_module(self, name: str, module: Module) -> None:
        setattr(self, name, module)

    # -- traversal ----------------------------------------------------------------------------

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield from self._modules.items()

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """Every module of the tree once (pre-order), with its dotted name."""
        seen: set[int] = set()
        stack = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            children = [(f"{name}.{n}" if name else n, m) for n, m in module._modules.items()]
            stack.extend(reversed(children))

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_parameters(self, prefix: str = "",
                         recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        """(dotted name, Parameter); a parameter shared by two modules is listed once."""
        seen: set[int] = set()
        mods = self.named_modules(prefix) if recurse else iter([(prefix, self)])
        for mod_name, module in mods:
            for name, p in module._parameters.items():
                if id(p) in seen:
                    continue
                seen.add(id(p))
                yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", persistent_only: bool = False
                      ) -> Iterator[tuple[str, Any]]:
        """(dotted name, buffer) for every buffer that is not None."""
        for mod_name, module in self.named_modules(prefix):
            for name, b in module._buffers.items():
                if b is None or persistent_only and name in module._non_persistent:
                    continue
                yield (f"{mod_name}.{name}" if mod_name else name), b

    def buffers(self) -> Iterator[Any]:
        for _, b in self.named_buffers():
            yield b

    def num_parameters(self) -> int:
        return int(sum(p.data.size for p in self.parameters()))

    # -- calling ------------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # -- modes, gradients, functions over the tree ----------------------------------------------

    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
                p.__dict__.pop("_grad_acc", None)  # the f32 sum (autograd.tape)
            else:
                p.grad.data[...] = 0
                record_write(p.grad, "Module.zero_grad(set_to_none=False)")

    def apply(self, fn: Callable[[Module], Any]) -> Module:
        """Call ``fn`` on every submodule (children first, as in PyTorch), then on self."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def to(self, device: str | None = None, dtype: Any = None) -> Module:
        """Move parameters (in place: the same Parameter objects) and buffers to ``device``
        and/or cast floating ones to ``dtype``; gradients follow the parameters."""
        dt = None if dtype is None else gp.dtypes.as_dtype(dtype)
        if dt is not None and not gp.dtypes.is_float(dt):
            raise ValueError(f"Module.to: dtype must be a float dtype, given {dt}")

        def convert(a: Any) -> Any:
            if device is not None:
                a = gp.to_device(a, device)
            if dt is not None and gp.dtypes.is_float(a.dtype) and a.dtype != dt:
                a = gp.functional.cast(a, dt)
            return a

        for p in self.parameters():
            p.data = convert(p.data)
            if p.grad is not None:
                p.grad.data = convert(p.grad.data)
        for module in self.modules():
            for name, b in list(module._buffers.items()):
                if isinstance(b, Tensor):
                    b.data = convert(b.data)  # the same Tensor object, as parameters
                elif b is not None:
                    module._buffers[name] = convert(b)
                    object.__setattr__(module, name, module._buffers[name])
        return self

    # -- checkpoints --------------------------------------------------------------------------

    def state_dict(self, layout: str = "native") -> OrderedDict[str, np.ndarray]:
        """Host (NumPy) copies of every parameter and persistent buffer, keyed by dotted name,
        in registration order; dtypes (bf16 included) are kept exactly. ``layout="torch"``
        gives the parameters PyTorch stores transposed (``Linear.weight``) as [out, in]."""
        transposed = self._torch_transposed_names(layout, "state_dict")
        out: OrderedDict[str, np.ndarray] = OrderedDict()
        for name, p in self.named_parameters():
            host = gp.to_host(p.data)
            out[name] = (host.T if name in transposed else host).copy()
        for name, b in self.named_buffers(persistent_only=True):
            out[name] = gp.to_host(b.data if isinstance(b, Tensor) else b).copy()
        return out

    def _torch_transposed_names(self, layout: str, op: str) -> set[str]:
        """Dotted names of the parameters stored transposed relative to torch ("torch"
        layout), or none ("native"); refuses modules whose layout is unknown."""
        if layout not in ("native", "torch"):
            raise ValueError(f"{type(self).__name__}.{op}: layout must be 'native' or "
                             f"'torch', given {layout!r}")
        names: set[str] = set()
        if layout == "native":
            return names
        for mod_name, module in self.named_modules():
            declared = type(module)._torch_transposed
            own = {n: p for n, p in module._parameters.items() if p is not None}
            if declared is None and any(p.ndim >= 2 for p in own.values()):
                raise ValueError(
                    f"{type(self).__name__}.{op}(layout='torch'): cannot tell how "
                    f"{type(module).__name__} ({mod_name or 'the root'}) stores its "
                    f"{sorted(n for n, p in own.items() if p.ndim >= 2)} relative to PyTorch "
                    f"(its class declares no _torch_transposed); use layout='native'")
            for n in declared or ():
                if n in own:
                    names.add(f"{mod_name}.{n}" if mod_name else n)
        return names

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True,
                        layout: str = "native") -> IncompatibleKeys:
        """Copy ``state_dict`` values (arrays or Tensors) into the parameters/buffers in place
        (bit-exact when the dtypes agree; cast otherwise), keeping each one's device.
        ``strict``: missing or unexpected keys raise KeyError; shape mismatches always raise
        ValueError. ``layout="torch"``: weights PyTorch stores [out, in] (every Linear's
        ``weight``, MultiheadAttention's ``in_proj_weight``) are given that way and
        transposed into our [in, out]; a non-square one given [in, out] is refused (a square
        one cannot be told apart: the layout argument is what decides)."""
        transposed = self._torch_transposed_names(layout, "load_state_dict")
        params = dict(self.named_parameters())
        buffers = dict(self.named_buffers(persistent_only=True))
        missing = [k for k in list(params) + list(buffers) if k not in state_dict]
        unexpected = [k for k in state_dict if k not in params and k not in buffers]
        if strict and (missing or unexpected):
            raise KeyError(f"{type(self).__name__}.load_state_dict: missing keys {missing}, "
                           f"unexpected keys {unexpected}")
        for name, value in state_dict.items():
            target = params[name].data if name in params else buffers.get(name)
            if target is None:
                continue
            if isinstance(target, Tensor):
                target = target.data
            if isinstance(value, Tensor):
                value = value.data
            if name in transposed:
                if value.ndim != 2 or tuple(value.shape) != tuple(target.shape)[::-1]:
                    raise ValueError(
                        f"{type(self).__name__}.load_state_dict(layout='torch'): {name!r}: "
                        f"expected PyTorch's [out, in] shape {tuple(target.shape)[::-1]}, "
                        f"given {tuple(value.shape)}")
                value = gp.to_host(value).T
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"{type(self).__name__}.load_state_dict: {name!r}: expected "
                                 f"shape {tuple(target.shape)}, given {tuple(value.shape)}")
            host = gp.to_host(value)
            if host.dtype != target.dtype:
                host = host.astype(target.dtype)
            target[...] = gp.to_device(host, gp.device_of(target))
            written = params.get(name, buffers.get(name))
            if isinstance(written, Tensor):
                record_write(written, "Module.load_state_dict")
        return IncompatibleKeys(missing, unexpected)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {sub}")
        return "\n".join(lines) + (")" if len(lines) == 1 else "\n)")


class Sequential(Module):
    """Runs its modules in order: ``forward(x) = m_n(...m_1(x))``; children named 0, 1, ..."""

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        for i, m in enumerate(modules):
            self.add_module(str(i), m)

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self

    def forward(self, x: Any) -> Any:
        for m in self:
            x = m(x)
        return x


class ModuleList(Module):
    """A list of modules registered as children named 0, 1, ... (no forward of its own)."""

    def __init__(self, modules: list[Module] | None = None) -> None:
        super().__init__()
        for m in modules or []:
            self.append(m)

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self._modules)), module)
        return self

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())
