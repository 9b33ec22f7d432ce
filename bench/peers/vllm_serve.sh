#!/usr/bin/env bash
# Start vLLM CPU (from `make bench-peers`) on the HF copy of SmolLM2, as ../shared/PEERS.md says:
# both cores, prefix caching and cached-token details on. Usage: bench/peers/vllm_serve.sh [PORT [VLLM FLAGS...]]
set -euo pipefail
cd "$(dirname "$0")/../.."
export VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND=0-1
exec .peers/vllm/bin/python -m vllm.entrypoints.openai.api_server --model .peers/smollm2-hf \
  --served-model-name smollm2 --enable-prefix-caching --enable-prompt-tokens-details \
  --max-model-len 4096 --host 127.0.0.1 --port "${1:-8200}" "${@:2}"
