"""autograd Functions, one module per op group; each calls gpuplan.functional or gp helpers."""
