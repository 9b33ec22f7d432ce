#!/usr/bin/env bash
# Start vLLM CPU (from `make bench-peers`) on the HF copy of SmolLM2, as docs/peers.md says:
# both cores, prefix caching and cached-token details on. Usage: bench/peers/vllm_serve.sh [PORT [VLLM ARGS...]]
# Without a --dtype among the arguments it gets kvstrata's choice for this CPU
# (`kvstrata dtype-plan --peer-dtype`: float32 where bf16 GEMM is slow, e.g. AVX2).
set -euo pipefail
cd "$(dirname "$0")/../.."
port="${1:-8200}"
[ $# -gt 0 ] && shift
args=("$@")
if [[ " ${args[*]-} " != *" --dtype "* && " ${args[*]-} " != *" --dtype="* ]]; then
  py="${KVSTRATA_PYTHON:-.venv/bin/python}"
  dtype="$("$py" -m kvstrata.cli dtype-plan --peer-dtype 2>/dev/null || echo auto)"
  args+=(--dtype "$dtype")
fi
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}" VLLM_CPU_OMP_THREADS_BIND=0-1  # GB; a caller may give more
# an AVX2 cap (KVSTRATA_CPU_ISA, docs/cpu-kernels.md) holds for the peer too: its kernel library by that cap, not the hardware
if [ "$(echo "${KVSTRATA_CPU_ISA:-}" | tr -d ' ' | tr A-Z a-z)" = avx2 ]; then
  export PYTHONPATH="$PWD/bench/peers/avx2cap${PYTHONPATH:+:$PYTHONPATH}"
fi
model=.peers/smollm2-hf  # or the HF copy of another GGUF: --model DIR among the arguments (a later one wins)
exec .peers/vllm/bin/python -m vllm.entrypoints.openai.api_server --model "$model" \
  --served-model-name smollm2 --enable-prefix-caching --enable-prompt-tokens-details \
  --max-model-len 4096 --host 127.0.0.1 --port "$port" "${args[@]}"
