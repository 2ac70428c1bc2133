"""Containers keyed like PyTorch's: ModuleDict (named child modules), ParameterList."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from autograd.nn.module import Module, Parameter
from autograd.tensor import Tensor


class ModuleDict(Module):
    """An ordered dict of child modules (insertion order); each key is the child's name in
    ``named_parameters``/``state_dict`` (``"blocks.a.weight"``). No forward of its own."""

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None
                 = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __setitem__(self, key: str, module: Module) -> None:
        if not isinstance(key, str) or not key or "." in key:
            raise KeyError(f"ModuleDict: keys must be non-empty strings without '.', "
                           f"given {key!r}")
        if not isinstance(module, Module):
            raise TypeError(f"ModuleDict: {key!r} must be a Module, given "
                            f"{type(module).__name__}")
        self.add_module(key, module)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __delitem__(self, key: str) -> None:
        delattr(self, key)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: object) -> bool:
        return key in self._modules

    def keys(self) -> Iterable[str]:
        return self._modules.keys()

    def values(self) -> Iterable[Module]:
        return self._modules.values()

    def items(self) -> Iterable[tuple[str, Module]]:
        return self._modules.items()

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        pairs = modules.items() if isinstance(modules, Mapping) else modules
        for key, module in pairs:
            self[key] = module

    def pop(self, key: str) -> Module:
        module = self._modules[key]
        del self[key]
        return module

    def clear(self) -> None:
        for key in list(self._modules):
            del self[key]


def _as_parameter(value: Any) -> Parameter:
    if isinstance(value, Parameter):
        return value
    if isinstance(value, Tensor) or hasattr(value, "shape"):
        return Parameter(value)  # torch wraps plain tensors the same way
    raise TypeError(f"ParameterList: items must be Parameters, Tensors or arrays, given "
                    f"{type(value).__name__}")


class ParameterList(Module):
    """A list of Parameters registered as ``"0"``, ``"1"``, ...; Tensors and arrays given
    to it become Parameters."""

    _torch_transposed = ()  # kept as given

    def __init__(self, values: Iterable[Any] | None = None) -> None:
        super().__init__()
        for v in values or []:
            self.append(v)

    def _key(self, i: int) -> str:
        n = len(self._parameters)
        if not -n <= i < n:
            raise IndexError(f"ParameterList: index {i} out of range for {n} parameters")
        return str(i % n)

    def __getitem__(self, i: int) -> Parameter:
        return self._parameters[self._key(i)]

    def __setitem__(self, i: int, value: Any) -> None:
        setattr(self, self._key(i), _as_parameter(value))

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[Parameter]:
        return iter(list(self._parameters.values()))

    def append(self, value: Any) -> ParameterList:
        setattr(self, str(len(self._parameters)), _as_parameter(value))
        return self

    def extend(self, values: Iterable[Any]) -> ParameterList:
        for v in values:
            self.append(v)
        return self

    def extra_repr(self) -> str:
        return ", ".join(f"({k}): {tuple(p.shape)}" for k, p in self._parameters.items())
