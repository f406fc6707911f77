#!/usr/bin/env bash
# Creates .venv with the whole stack, reproducibly, from this repo alone.
# Re-running is cheap: the install is skipped while pyproject.toml and
# constraints.txt are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
VENV=.venv
STAMP=$VENV/.ragpipe-setup-stamp
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
    exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
pip install -q --upgrade pip
# torch first: the machine provides a CPU build of exactly this version;
# any other resolution pulls multi-GB CUDA wheels.
pip install -q torch==2.13.0
pip install -q -c constraints.txt -e '.[dev]'
# torchvision's only build for torch 2.13 is CUDA-linked and breaks
# transformers/Docling when present (operator torchvision::nms).
pip uninstall -q -y torchvision 2>/dev/null || true
echo "$want" > "$STAMP"
