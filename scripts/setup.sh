#!/usr/bin/env bash
# Create .venv (once) and install the project with its test dependencies into it.
#
# The base install has no CuPy; the CuPy extra must match the machine's CUDA and is chosen
# here: GPUPLAN_CUDA=12 (cupy-cuda12x[ctk]), 13 (cupy-cuda13x[ctk]) or none (no CuPy extra).
# Unset, a CuPy flavour already in .venv is kept (with its [ctk] extra), and a .venv with no
# CuPy gets cuda12 (cupy-cuda12x also runs on a CUDA 13 driver). On a machine with no
# NVIDIA GPU, cuda12 unset means the `nvrtc12` extra instead: CuPy and NVRTC only (with the
# CUDA headers of `test`), what the kernel compile check (scripts/check_kernels.py) and the
# emulated device use, not the whole toolkit (cuBLAS, cuFFT, cuSOLVER, ...: 2.5 GB that only
# a GPU uses). One flavour is never installed beside the other.
#
# `--dry-run` prints the install command it would run and installs nothing (.venv must exist).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
dry=0
[ "${1:-}" = "--dry-run" ] && dry=1
if [ ! -x .venv/bin/python ]; then
    if [ "$dry" = 1 ]; then echo "setup.sh: --dry-run needs a .venv" >&2; exit 2; fi
    "$PY" -m venv .venv
fi
. .venv/bin/activate
[ "$dry" = 1 ] || python -m pip install -q --upgrade pip

# An NVIDIA GPU on this machine: its driver's device files or nvidia-smi finding one.
has_gpu() {
    [ -e /dev/nvidia0 ] || [ -d /proc/driver/nvidia/gpus ] ||
        { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
}

# CuPy distributions installed in .venv (cupy-cuda12x, cupy-cuda13x, cupy, ...).
installed=$(python - <<'EOF'
import importlib.metadata as md
names = {(d.metadata["Name"] or "").lower().replace("_", "-") for d in md.distributions()}
print(" ".join(sorted(n for n in names if n == "cupy" or n.startswith("cupy-"))))
EOF
)
cuda=${GPUPLAN_CUDA:-}
derived=0
if [ -z "$cuda" ]; then
    derived=1
    case "$installed" in
        "") cuda=12 ;;
        cupy-cuda12x) cuda=12 ;;
        cupy-cuda13x) cuda=13 ;;
        *) cuda=none
           echo "setup.sh: keeping the installed CuPy ($installed); no CuPy extra" ;;
    esac
fi
case "$cuda" in
    12|13)
        other=$([ "$cuda" = 12 ] && echo cupy-cuda13x || echo cupy-cuda12x)
        if [[ " $installed " == *" $other "* ]]; then
            echo "setup.sh: GPUPLAN_CUDA=$cuda but .venv has $other; uninstall it first" \
                 "(.venv/bin/python -m pip uninstall $other) or set GPUPLAN_CUDA to match" >&2
            exit 2
        fi
        extras="test,data,cuda$cuda"
        if [ "$derived$cuda" = 112 ] && ! has_gpu; then
            extras="test,data,nvrtc12"
            echo "setup.sh: no NVIDIA GPU here: CuPy and NVRTC only (GPUPLAN_CUDA=12 installs" \
                 "the whole CUDA 12 toolkit)"
        fi ;;
    none) extras="test,data" ;;
    *) echo "setup.sh: GPUPLAN_CUDA must be 12, 13 or none, given '$cuda'" >&2; exit 2 ;;
esac
echo "setup.sh: pip install -e \".[$extras]\""
[ "$dry" = 1 ] && exit 0
python -m pip install -q -e ".[$extras]"
