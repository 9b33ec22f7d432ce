#!/usr/bin/env bash
# arctic-inference (the SuffixDecoding paper's implementation, which vLLM's `{"method": "suffix"}` runs) into
# vLLM's venv, for the `vllm-suffix` peer of `kvstrata bench compare` (docs/peers.md). PyPI has only its
# sdist: it is built into a wheel in a venv of its own (.peers/arctic-build: its build wants torch, our
# CPU pin, and protobuf 5, which vLLM's venv holds newer), then the wheel goes into vLLM's venv without
# dependencies (its suffix tree, `arctic_inference.suffix_decoding._C`, links no torch). Its vLLM plugin
# stays off unless ARCTIC_INFERENCE_ENABLED is set. Idempotent; a few minutes on 2 cores. Leaves
# .peers/vllm/.arctic-inference once vLLM's venv imports it (what `bench compare` looks for).
set -euo pipefail
cd "$(dirname "$0")/../.."
VLLM=.peers/vllm/bin/python
VERSION=0.3.0
MARK=.peers/vllm/.arctic-inference
"$VLLM" -c "import arctic_inference.suffix_decoding" 2>/dev/null && { touch "$MARK"; exit 0; }
B=.peers/arctic-build
# the build venv from the base interpreter of vLLM's (the wheel's ABI must be vLLM's Python)
base="$("$VLLM" -c 'import sys; print(sys._base_executable)')"
test -x "$B/bin/pip" || "$base" -m venv "$B"
"$B/bin/pip" install -q torch==2.13.0 cmake ninja nanobind==2.9.2 protobuf==5.29.6 grpcio-tools setuptools wheel
mkdir -p "$B/src" "$B/wheels"
test -f "$B/src/arctic_inference-$VERSION.tar.gz" || \
  PATH="$PWD/$B/bin:$PATH" "$B/bin/pip" download -q --no-deps --no-build-isolation --no-binary :all: "arctic-inference==$VERSION" -d "$B/src"
# CMake's find_package(Python) takes the first python on PATH: the build venv's, where nanobind is
PATH="$PWD/$B/bin:$PATH" "$B/bin/pip" wheel -q --no-build-isolation --no-deps -w "$B/wheels" \
  "$B/src/arctic_inference-$VERSION.tar.gz"
.peers/vllm/bin/pip install -q --no-deps "$B"/wheels/arctic_inference-"$VERSION"-*.whl
"$VLLM" -c "import arctic_inference.suffix_decoding" && touch "$MARK"
