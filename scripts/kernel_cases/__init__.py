"""Kernel cases for `check_kernels.py --execute`: one module per op family.

Each module defines ``CASES``: a list of `common.Case` (a name and a function of no
arguments). A case runs plans on the emulated device and compares every output with the
family's float64 NumPy reference at the dtype's tolerance (AssertionError on mismatch).
Together the cases must launch every kernel instance the families declare; the harness
counts the instances that ran (gpuplan.emulator.device.EXECUTED), it does not trust a list.
"""

FAMILIES = ("embedding", "quantize", "gemm", "activation", "binary", "select", "cast",
            "reduction", "reduce_dim", "gather", "clip_grad", "normalization", "residual_norm",
            "softmax", "attention",
            "attention_backward", "attention_backward_tc", "cross_entropy", "dropout",
            "optimizer")
