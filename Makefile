# Developer entry points. `make test` is the README's whole-suite command; `make gpu-check`
# runs on a GPU machine with no registry, using that machine's python3 (no venv).

PYTHON ?= $(shell if [ -x .venv/bin/python ]; then echo .venv/bin/python; else command -v python3 || command -v python; fi)
GPU_PYTHON ?= $(shell command -v python3 || command -v python)

.PHONY: test check-kernels bench bench-train lint gpu-check gpu-check-rehearsal

test:
	bash scripts/test.sh

check-kernels:
	$(PYTHON) scripts/check_kernels.py

bench:
	$(PYTHON) scripts/bench_kernels.py --json reports/bench.json

# Training-step throughput, ours vs PyTorch eager (GPT-2 small on a GPU, the small model on
# the host); override e.g. `make bench-train BENCH_TRAIN_ARGS="--dtype f32"`.
BENCH_TRAIN_ARGS ?= $(shell if $(PYTHON) -c 'import gpuplan, sys; sys.exit(not gpuplan.device_available())' 2>/dev/null; then echo --model gpt2 --dtype bf16 --cuda-graph; else echo --model small; fi)
bench-train:
	$(PYTHON) scripts/bench_train.py $(BENCH_TRAIN_ARGS) --json reports/bench_train.json

lint:
	$(PYTHON) -m ruff check .

# The one-command GPU check (docs/gpu_check.md): `make gpu-check GPU_CHECK_ARGS="--out $$OUT"`;
# `make gpu-check-rehearsal` runs it on the emulated device. PHASE="execute train" for some.
PHASE ?=
GPU_CHECK_ARGS ?=
gpu-check:
	$(GPU_PYTHON) scripts/gpu_check.py --budget 480 $(foreach p,$(PHASE),--phase $(p)) $(GPU_CHECK_ARGS)

gpu-check-rehearsal:
	$(PYTHON) scripts/gpu_check.py --device emulated $(foreach p,$(PHASE),--phase $(p)) $(GPU_CHECK_ARGS)
