#!/usr/bin/env bash
# Create .venv (once) and install the project with its test dependencies into it.
#
# The base install has no CuPy; the CuPy extra must match the machine's CUDA and is chosen
# here: GPUPLAN_CUDA=12 (cupy-cuda12x[ctk]), 13 (cupy-cuda13x[ctk]) or none (no CuPy extra).
# Unset, a CuPy flavour already in .venv is kept (with its [ctk] extra), and a .venv with no
# CuPy gets cuda12: its [ctk] wheels (NVRTC, CUDA headers) are what the kernel compile check
# (scripts/check_kernels.py) uses on a machine with no GPU, and cupy-cuda12x also runs on a
# CUDA 13 driver. One flavour is never installed beside the other.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip

# CuPy distributions installed in .venv (cupy-cuda12x, cupy-cuda13x, cupy, ...).
installed=$(python - <<'EOF'
import importlib.metadata as md
names = {(d.metadata["Name"] or "").lower().replace("_", "-") for d in md.distributions()}
print(" ".join(sorted(n for n in names if n == "cupy" or n.startswith("cupy-"))))
EOF
)
cuda=${GPUPLAN_CUDA:-}
if [ -z "$cuda" ]; then
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
        extras="test,data,cuda$cuda" ;;
    none) extras="test,data" ;;
    *) echo "setup.sh: GPUPLAN_CUDA must be 12, 13 or none, given '$cuda'" >&2; exit 2 ;;
esac
echo "setup.sh: pip install -e \".[$extras]\""
python -m pip install -q -e ".[$extras]"
