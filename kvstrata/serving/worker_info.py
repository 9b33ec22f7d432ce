"""The worker-info routes a gateway in front of kvstrata asks for (SGLang Model Gateway, `smg`).

`GET /server_info` (and the older spelling `/get_server_info`): the served model name
(`served_model_name`, `model_id`), `dp_size` (1 here; the kvstrata DP gateway answers N, so
`smg --dp-aware` pins each request to one of N ranks through `data_parallel_rank`), the pool and
batch limits, and what decides whether two servers can share L3 pages: `dtype`, `page_size` and
`kv_namespace` (the page-hash namespace root, kv/hashing.py).
`GET /model_info` (and `/get_model_info`): `is_generation`, `model_type`, `architectures`, the
context length and vocabulary size.

`model_path` and `tokenizer_path` say where a tokenizer can be loaded from, because that is what
smg reads `model_path` for: the model's Hugging Face folder, or for a GGUF the tokenizer.json
kvstrata converted its tokenizer to (smg cannot read GGUF). `weights_path` is the model file or
folder itself. Both routes need the API key when keys are on, and answer 503 while loading.
"""
from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from kvstrata.model.fetch import resolve_model
from kvstrata.model.tokenizer import tokenizer_json

if TYPE_CHECKING:  # the gateway imports the paths below and must not load a rank's state (metrics, KV)
    from kvstrata.serving.state import ServerState

SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
MODEL_INFO_PATHS = ("/model_info", "/get_model_info")


@cache  # the installed metadata is read once, not on every /server_info call
def _version() -> str:
    try:
        return version("kvstrata")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _tokenizer_source(weights: str) -> str | None:
    """The HF folder, or a GGUF's converted tokenizer.json (None before it exists)."""
    found = tokenizer_json(weights)
    if found is None:
        return None
    return weights if Path(weights).is_dir() else str(found)


def server_info(state: ServerState) -> dict[str, Any]:
    engine = state.ready_engine()
    info = engine.engine.info
    cache = engine.engine.prefix_cache
    weights = str(resolve_model(state.model_cfg.model).resolve())
    source = _tokenizer_source(weights)
    sched = state.sched_cfg
    return {
        "engine": "kvstrata",
        "version": _version(),
        "served_model_name": info.served_model_name,
        "model_id": info.served_model_name,
        "model_path": source or weights,
        "tokenizer_path": source,
        "weights_path": weights,
        "dp_size": 1,
        "dtype": info.dtype,
        "page_size": info.page_size,
        "kv_namespace": cache.root.hex() if cache is not None else None,
        "max_total_tokens": info.num_pages * info.page_size,
        "max_running_requests": sched.max_num_seqs,
        "max_prefill_tokens": sched.max_num_batched_tokens,
        "context_length": info.max_model_len,
    }


def model_info(state: ServerState) -> dict[str, Any]:
    engine = state.ready_engine()
    info = engine.engine.info
    weights = str(resolve_model(state.model_cfg.model).resolve())
    source = _tokenizer_source(weights)
    return {
        "model_path": source or weights,
        "tokenizer_path": source,
        "weights_path": weights,
        "served_model_name": info.served_model_name,
        "is_generation": True,
        "model_type": info.arch.architecture,
        "architectures": [_ARCHITECTURES.get(info.arch.architecture, info.arch.architecture)],
        "max_context_length": info.max_model_len,
        "vocab_size": info.arch.vocab_size,
    }


_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                  "qwen3moe": "Qwen3MoeForCausalLM"}


def install_worker_info_routes(app: FastAPI, state: ServerState) -> None:
    for path in SERVER_INFO_PATHS:
        app.add_api_route(path, lambda: server_info(state), methods=["GET"], name=f"server_info{path}")
    for path in MODEL_INFO_PATHS:
        app.add_api_route(path, lambda: model_info(state), methods=["GET"], name=f"model_info{path}")
