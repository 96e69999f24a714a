#!/usr/bin/env bash
# Install the peer load harnesses, each in a venv of its own, to compare their numbers with
# itlbench's against the same server. Usage: benchmarks/peers/install_harnesses.sh [ROOT]
#
#   ROOT/aiperf-venv     AIPerf 0.13.0 (NVIDIA; `aiperf profile`)
#   ROOT/guidellm-venv   guidellm 0.8.1 (`guidellm run`)
# `vllm bench serve` comes with the vLLM venv (benchmarks/peers/install_vllm.sh).
#
# Why each step:
# - own venvs: the harnesses pin their own pydantic, transformers and HTTP stacks;
# - guidellm depends on torch: `torch==2.13.0` in the same pip command lets pip take the CPU wheel
#   that lies on this project's machines (pip's find-links) instead of a multi-GB CUDA build;
# - AIPerf does not need torch.
set -euo pipefail

ROOT=${1:-$HOME/peers}
PYTHON=${PYTHON:-python3}
AIPERF_VERSION=${AIPERF_VERSION:-0.13.0}
GUIDELLM_VERSION=${GUIDELLM_VERSION:-0.8.1}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
mkdir -p "$ROOT"

if [[ ! -x "$ROOT/aiperf-venv/bin/aiperf" ]]; then
  "$PYTHON" -m venv "$ROOT/aiperf-venv"
  "$ROOT/aiperf-venv/bin/python" -m pip install "aiperf==$AIPERF_VERSION"
fi
"$ROOT/aiperf-venv/bin/aiperf" --version 2>/dev/null || "$ROOT/aiperf-venv/bin/aiperf" --help >/dev/null

if [[ ! -x "$ROOT/guidellm-venv/bin/guidellm" ]]; then
  "$PYTHON" -m venv "$ROOT/guidellm-venv"
  "$ROOT/guidellm-venv/bin/python" -m pip install "guidellm==$GUIDELLM_VERSION" "torch==$TORCH_VERSION"
fi
"$ROOT/guidellm-venv/bin/guidellm" --version 2>/dev/null || "$ROOT/guidellm-venv/bin/guidellm" --help >/dev/null

echo "installed: $ROOT/aiperf-venv/bin/aiperf, $ROOT/guidellm-venv/bin/guidellm"
