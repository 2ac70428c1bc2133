"""Benchmarks and checks: what scripts/bench_*.py, check_kernels.py, check_graphs.py and
gpu_check.py run.

The top layer (benchsuite > dist > autograd > gpuplan): it times and checks the three packages
below and is imported by none of them. Each module keeps a `main(argv)` that its thin entry
script in scripts/ calls; the kernel benchmarks are one module per op family in
`benchsuite.kernels`.
"""
