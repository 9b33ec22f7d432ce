#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (with `llama-quantize`, for `kvstrata bench synth-model`, and
# `llama-perplexity`, for `kvstrata bench perplexity`) from the tree vendored in the llama-cpp-python sdist
# (docs/peers.md) into .peers/llama.cpp/bin/ (about 8 minutes on 2 cores). Idempotent: a build missing one
# of the three gets it built.
# Usage: bench/peers/build_llama_server.sh [PIP]   (PIP: a pip to download the sdist with)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=.peers/llama.cpp
# GGML_NATIVE (-march=native) builds llama.cpp's AMX kernels wherever cpuid lists amx_tile; on the
# Xeon VM of 2026-12-01 llama-server then died of SIGILL on its first matmul (`tilezero` in
# tinygemm_kernel_amx, from an OpenMP worker), although a plain C program could use the tiles there.
# So on such CPUs name every other feature the CPU has, one by one, and leave AMX out.
FLAGS="-DGGML_NATIVE=ON"
BUILD=build
if [ "$(echo "${KVSTRATA_CPU_ISA:-}" | tr -d ' ' | tr A-Z a-z)" = avx2 ]; then
  # the AVX2 cap (docs/cpu-kernels.md): an AVX2-only binary beside the native one, for the peer under that cap
  OUT=.peers/llama.cpp-avx2 BUILD=build-avx2
  FLAGS="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  FLAGS="$FLAGS -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF"
elif grep -qw amx_tile /proc/cpuinfo; then
  FLAGS="-DGGML_NATIVE=OFF"
  has() { grep -qw "$1" /proc/cpuinfo; }
  for pair in sse4_2:SSE42 f16c:F16C fma:FMA bmi2:BMI2 avx:AVX avx2:AVX2 avx_vnni:AVX_VNNI avx512bw:AVX512 \
              avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    has "${pair%%:*}" && FLAGS="$FLAGS -DGGML_${pair##*:}=ON" || FLAGS="$FLAGS -DGGML_${pair##*:}=OFF"
  done
  echo "cpuid lists AMX: building without llama.cpp's AMX kernels: $FLAGS"
fi
# a binary built with other flags (another CPU) is rebuilt
TARGETS="llama-server llama-quantize llama-perplexity"
built() { for t in $TARGETS; do [ -x "$OUT/bin/$t" ] || return 1; done; }
built && [ "$(cat "$OUT/cmake-flags" 2>/dev/null)" = "$FLAGS" ] && { echo "$OUT/bin/ holds $TARGETS"; exit 0; }
PIP=${1:-.venv/bin/pip}
SRC=.peers/src
mkdir -p "$SRC" "$OUT/bin"
ls "$SRC"/llama_cpp_python-*.tar.gz >/dev/null 2>&1 || \
  "$PIP" download -q --no-deps --no-binary :all: -d "$SRC" llama-cpp-python
tar -xzf "$(ls "$SRC"/llama_cpp_python-*.tar.gz | tail -1)" -C "$SRC"
TREE=$(ls -d "$SRC"/llama_cpp_python-*/vendor/llama.cpp | tail -1)
# shellcheck disable=SC2086  # FLAGS is a list of words
cmake -S "$TREE" -B "$SRC/$BUILD" -DCMAKE_BUILD_TYPE=Release $FLAGS -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
# shellcheck disable=SC2086  # TARGETS is a list of words
cmake --build "$SRC/$BUILD" --target $TARGETS -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
for t in $TARGETS; do cp "$SRC/$BUILD/bin/$t" "$OUT/bin/"; done
echo "$FLAGS" > "$OUT/cmake-flags"
echo "built $TARGETS into $OUT/bin/"
