"""PipelineStage: an ordered group of layers that one pipeline rank runs."""

from __future__ import annotations

from typing import Any

from autograd.nn import Module


class PipelineStage(Module):
    """Stage `index` of a pipeline: forward(x) = layer_n(...layer_1(x)).

    Layers are registered as children "0", "1", ... so parameter names do not depend on
    which rank builds the stage.
    """

    def __init__(self, index: int) -> None:
        super().__init__()
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"PipelineStage: index: expected an int >= 0, given {index!r}")
        self.index = index

    def add_layer(self, layer: Module) -> PipelineStage:
        """Append a layer (any callable Module); returns self for chaining."""
        self.add_module(str(len(self._modules)), layer)
        return self

    @property
    def layers(self) -> list[Module]:
        return list(self._modules.values())

    def forward(self, x: Any) -> Any:
        for layer in self._modules.values():
            x = layer(x)
        return x

    def extra_repr(self) -> str:
        return f"index={self.index}"
