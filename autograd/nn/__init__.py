"""Neural-network modules and the functional API (autograd.nn.functional)."""

from autograd.nn import functional, init
from autograd.nn.attention import MultiheadAttention
from autograd.nn.containers import ModuleDict, ParameterList
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
    Sigmoid,
    SiLU,
    Tanh,
    host_parameter,
)
from autograd.nn.llama import Llama, LlamaAttention, LlamaBlock, LlamaLayers, LlamaMLP
from autograd.nn.llama_config import LlamaConfig
from autograd.nn.loss import CrossEntropyLoss, MSELoss, NLLLoss
from autograd.nn.module import IncompatibleKeys, Module, ModuleList, Parameter, Sequential

__all__ = [
    "GELU", "GPT", "MLP", "Block", "CausalSelfAttention", "Dropout", "Embedding", "GPTConfig",
    "Identity", "IncompatibleKeys", "LayerNorm", "Linear", "Module", "ModuleList", "Parameter",
    "ReLU", "RMSNorm", "Sequential", "functional", "host_parameter",
    "CrossEntropyLoss", "MSELoss", "ModuleDict", "MultiheadAttention", "NLLLoss", "ParameterList",
    "SiLU", "Sigmoid", "Tanh", "init", "Llama", "LlamaAttention", "LlamaBlock", "LlamaConfig",
    "LlamaLayers", "LlamaMLP",
]
