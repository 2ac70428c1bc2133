"""Where each local parameter of a parallel model sits in the dense model, and assembly."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from autograd.nn import GPT, GPTConfig, Llama, LlamaConfig, Module


@dataclass(frozen=True)
class ShardSpec:
    """A local parameter is ``np.take(dense[name], index, axis)``; ``index`` None = whole.

    ``tensor_parallel``: the parameter is split over the TP group (its gradient norm is a
    sum over TP ranks); replicated ones count once. ``duplicate``: a second copy of a dense
    parameter held elsewhere too (the last stage's tied head), skipped when counting."""

    name: str
    axis: int = 0
    index: tuple[int, ...] | None = None
    tensor_parallel: bool = False
    duplicate: bool = False

    def take(self, dense: np.ndarray) -> np.ndarray:
        return dense if self.index is None else np.take(dense, list(self.index), self.axis)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "axis": self.axis,
                "index": None if self.index is None else list(self.index),
                "tensor_parallel": self.tensor_parallel, "duplicate": self.duplicate}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ShardSpec:
        index = d.get("index")
        return cls(d["name"], int(d.get("axis", 0)), None if index is None else tuple(index),
                   bool(d.get("tensor_parallel")), bool(d.get("duplicate")))


def dense_model_class(config: Any) -> type[Module]:
    """The single-process model of a config: nn.GPT for a GPTConfig, nn.Llama for a
    LlamaConfig; TypeError naming the type otherwise."""
    if isinstance(config, GPTConfig):
        return GPT
    if isinstance(config, LlamaConfig):
        return Llama
    raise TypeError(f"dense_model_class: config must be a GPTConfig or a LlamaConfig, given "
                    f"{type(config).__name__}")


def consolidate(config: GPTConfig | LlamaConfig,
                shards: Iterable[tuple[np.ndarray, dict[str, Any]]]) -> dict[str, np.ndarray]:
    """Assemble the dense model's state dict (`nn.GPT`'s or `nn.Llama`'s) from (array,
    ShardSpec JSON) pairs covering every parameter; raises ValueError naming what is
    missing."""
    shapes = dense_shapes(config)
    out: dict[str, np.ndarray] = {}
    filled: dict[str, np.ndarray] = {}
    for array, spec_json in shards:
        spec = ShardSpec.from_json(spec_json)
        if spec.name not in shapes:
            raise ValueError(f"consolidate: unknown parameter {spec.name!r}")
        if spec.name not in out:
            out[spec.name] = np.zeros(shapes[spec.name], array.dtype)
            filled[spec.name] = np.zeros(shapes[spec.name], bool)
        index = [slice(None)] * array.ndim
        if spec.index is not None:
            index[spec.axis] = list(spec.index)
        out[spec.name][tuple(index)] = array
        filled[spec.name][tuple(index)] = True
    missing = [n for n in shapes if n not in filled or not filled[n].all()]
    if missing:
        raise ValueError(f"consolidate: incomplete shards for {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}")
    return {n: out[n] for n in shapes}


def dense_shapes(config: GPTConfig | LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of the dense model of `config` (`dense_model_class`), in its
    ``named_parameters`` order, without drawing every block's weights: a one-block model's,
    its block (``blocks.0.*``, ``layers.0.*``) repeated for each block."""
    tiny = dense_model_class(config)(dataclasses.replace(config, n_layer=1))
    named = [(n, tuple(p.shape)) for n, p in tiny.named_parameters()]
    block = [(n.split(".", 2)[2], shape) for n, shape in named if _of_block_0(n)]
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in named:
        if not _of_block_0(name):
            shapes[name] = shape
        elif name.split(".", 2)[2] == block[0][0]:
            blocks = name.split(".", 1)[0]
            for i in range(config.n_layer):
                shapes.update((f"{blocks}.{i}.{leaf}", s) for leaf, s in block)
    return shapes


def _of_block_0(name: str) -> bool:
    """Whether `name` is a parameter of block 0 of the model's block list (``x.0.y``)."""
    parts = name.split(".")
    return len(parts) > 2 and parts[1] == "0"
