"""setuptools' package list: gpuplan, autograd, dist (the trainer included: dist.trainer),
benchsuite (benchmarks and checks)."""

from setuptools import find_packages, setup

# Metadata, dependencies and entry points are in pyproject.toml. scripts/ is not a package:
# its entry scripts run dist.trainer and benchsuite.
# gpuplan/ops/include holds the CUDA headers the op families share: a data folder, listed so
# that its package data (*.cuh) is installed.
setup(packages=[*find_packages(include=["gpuplan*", "autograd*", "dist*", "benchsuite*"]),
               "gpuplan.ops.include"])
