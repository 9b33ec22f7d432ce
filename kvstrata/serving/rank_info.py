"""`GET /v1/kvstrata/info`: what a gateway needs to route by this rank's cache.

The model (for the same tokenizer and chat template) and its tool-call parser, the page size and
the page-hash namespace root (to render and hash prompts exactly as this rank does), the pool
size, and where this rank publishes its KV events (`kv/events.py`; null when off). A bound
wildcard endpoint is reported as bound ("tcp://0.0.0.0:5557"); the gateway substitutes the
rank's host.
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from kvstrata.serving.state import ServerState


def install_rank_info_route(app: FastAPI, state: ServerState) -> None:
    @app.get("/v1/kvstrata/info")
    async def rank_info() -> dict[str, Any]:
        engine = state.ready_engine().engine
        cache = engine.prefix_cache
        pub = getattr(engine, "kv_events", None)
        events = None
        if pub is not None:
            events = {"endpoint": pub.endpoint, "replay_endpoint": pub.replay_endpoint, "topic": pub.topic}
        return {
            "served_model_name": engine.info.served_model_name,
            "model": state.model_cfg.model,
            "tool_call_parser": state.server_cfg.tool_call_parser,
            "page_size": engine.info.page_size,
            "hash_root": cache.root.hex() if cache is not None else None,
            "num_pages": engine.info.num_pages,
            "max_model_len": engine.info.max_model_len,
            "data_parallel_rank": state.cache_cfg.data_parallel_rank,
            "kv_events": events,
        }
