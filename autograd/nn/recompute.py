"""Activation recomputation for a decoder's chain of blocks (`set_recompute`, train.py
--recompute): the modes, and the mixin that `GPTLayers` and `LlamaLayers` share.

A model that mixes in `RecomputeLayers` names its list of blocks (``blocks_name``), runs each
block through `run_block`, and each block runs its attention sub-layer through
``recomputed(self.recompute_attention, ...)``: the modes mean the same for every model.
"""

from __future__ import annotations

from typing import Any

from autograd.checkpoint import checkpoint

#: `set_recompute` modes (train.py --recompute).
RECOMPUTE_MODES = ("none", "attention", "block")


def recomputed(enabled: bool, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, through `ag.checkpoint` (recomputed in backward) when ``enabled``."""
    return checkpoint(fn, *args) if enabled else fn(*args)


class RecomputeLayers:
    """What a model's forward over its blocks needs for activation recomputation: the mode
    (`set_recompute`), `run_block` for each block of the chain, and each block's
    ``recompute_attention`` flag (set here, read by the block)."""

    #: Attribute name of the model's list of blocks.
    blocks_name = "blocks"
    #: Activation recomputation (`set_recompute`): "none", "attention" or "block".
    recompute: str = "none"

    def set_recompute(self, mode: str) -> None:
        """Recompute activations in backward instead of keeping them (`ag.checkpoint`):
        "block" keeps only each block's input (every block re-run in backward), "attention"
        each attention sub-layer's input (its projections and attention re-run), "none"
        keeps all. Gradients are the same bits in every mode; only memory and time change."""
        if mode not in RECOMPUTE_MODES:
            raise ValueError(f"set_recompute: argument 'mode': expected one of "
                             f"{', '.join(RECOMPUTE_MODES)}, given {mode!r}")
        self.recompute = mode
        for block in getattr(self, self.blocks_name):
            if hasattr(block, "recompute_attention"):
                block.recompute_attention = mode == "attention"

    def run_block(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` for a block of the chain (the block, or a method of it), recomputed
        in backward in "block" mode."""
        return recomputed(self.recompute == "block", fn, *args)
