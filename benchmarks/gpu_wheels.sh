#!/usr/bin/env bash
# Wheels for a GPU box that has torch, Triton and nvidia-ml-py but no package index: the Python packages
# of itlbench such an image tends to lack (polars; nvtx for the engine's ranges), downloaded here for the
# box's Python into .whl/ (git-ignored). Copy the repo with .whl/ to the box; gpu_check.sh installs them
# into a scratch directory (no pip index needed) before it checks anything.
#
#   bash benchmarks/gpu_wheels.sh          # for CPython 3.12 on x86-64 Linux
#   bash benchmarks/gpu_wheels.sh 3.11
set -euo pipefail
cd "$(dirname "$0")/.."
PYV="${1:-3.12}"
mkdir -p .whl
# polars 1.31: one 35 MB wheel (releases 2.x add a 54 MB runtime wheel); itlbench needs polars >= 1.0
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl polars==1.31.0 nvtx==0.2.17
ls -l .whl
