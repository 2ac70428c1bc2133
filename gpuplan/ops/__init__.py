"""Plan families, one op family per module (descriptors, args, plans, NumPy reference).

Each module lists its public plan classes in ``__all__`` and its functional wrappers
(array in, fresh arrays out; what autograd calls) in ``__functional__``.
"""

FAMILIES: tuple[str, ...] = (
    "embedding",
    "quantize",
    "gemm",
    "activation",
    "binary",
    "select",
    "cast",
    "reduction",
    "reduce_dim",
    "gather",
    "clip_grad",
    "normalization",
    "residual_norm",
    "softmax",
    "attention",
    "attention_backward",
    "cross_entropy",
    "cross_entropy_partial",
    "dropout",
    "adamw",
    "sgd",
)
