# Developer entry points. `make test` is the README's whole-suite command; `make gpu-check`
# runs on a GPU machine with no registry, using that machine's python3 (no venv).

PYTHON ?= $(shell if [ -x .venv/bin/python ]; then echo .venv/bin/python; else command -v python3 || command -v python; fi)
GPU_PYTHON ?= $(shell command -v python3 || command -v python)

.PHONY: test check-kernels bench lint gpu-check

test:
	bash scripts/test.sh

check-kernels:
	$(PYTHON) scripts/check_kernels.py

bench:
	$(PYTHON) scripts/bench_kernels.py --json reports/bench.json

lint:
	$(PYTHON) -m ruff check .

gpu-check:
	$(GPU_PYTHON) scripts/gpu_check.py
