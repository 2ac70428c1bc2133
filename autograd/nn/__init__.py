"""Neural-network modules and the functional API (autograd.nn.functional)."""

from autograd.nn import functional
from autograd.nn.gpt import GPT, MLP, Block, CausalSelfAttention, GPTConfig
from autograd.nn.layers import (
    GELU,
    Dropout,
    Embedding,
    Identity,
    LayerNorm,
    Linear,
    ReLU,
    RMSNorm,
    host_parameter,
)
from autograd.nn.module import IncompatibleKeys, Module, ModuleList, Parameter, Sequential

__all__ = [
    "GELU", "GPT", "MLP", "Block", "CausalSelfAttention", "Dropout", "Embedding", "GPTConfig",
    "Identity", "IncompatibleKeys", "LayerNorm", "Linear", "Module", "ModuleList", "Parameter",
    "ReLU", "RMSNorm", "Sequential", "functional", "host_parameter",
]
