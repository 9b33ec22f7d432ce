#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the tree vendored in the llama-cpp-python sdist
# (../shared/PEERS.md) into .peers/llama.cpp/bin/ (about 7 minutes on 2 cores). Idempotent.
# Usage: bench/peers/build_llama_server.sh [PIP]   (PIP: a pip to download the sdist with)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=.peers/llama.cpp
[ -x "$OUT/bin/llama-server" ] && { echo "$OUT/bin/llama-server exists"; exit 0; }
PIP=${1:-.venv/bin/pip}
SRC=.peers/src
mkdir -p "$SRC" "$OUT/bin"
ls "$SRC"/llama_cpp_python-*.tar.gz >/dev/null 2>&1 || \
  "$PIP" download -q --no-deps --no-binary :all: -d "$SRC" llama-cpp-python
tar -xzf "$(ls "$SRC"/llama_cpp_python-*.tar.gz | tail -1)" -C "$SRC"
TREE=$(ls -d "$SRC"/llama_cpp_python-*/vendor/llama.cpp | tail -1)
cmake -S "$TREE" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
cmake --build "$SRC/build" --target llama-server -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
cp "$SRC/build/bin/llama-server" "$OUT/bin/"
echo "built $OUT/bin/llama-server"
